"""Run configuration: files under configs/, merging, overrides and errors that name the
file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from neorl_industrial.cli.run_glue import MAIN_JOB, main_job_config
from neorl_industrial.core.agents.registry import ALGORITHMS
from neorl_industrial.wrappers.training import ConfigError, RunConfig

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_has_a_config_file_with_its_defaults(name):
    config = RunConfig.from_yaml(CONFIGS / "algorithms" / f"{name}.yaml")
    assert config.algorithm.name == name
    defaults = ALGORITHMS[name].defaults()
    for field, value in config.algorithm.hyperparameters.items():
        assert defaults[field] == value, field


def test_files_merge_in_order_and_overrides_win():
    config = RunConfig.from_files(
        [
            CONFIGS / "envs" / "ib.yaml",
            CONFIGS / "algorithms" / "iql-lag.yaml",
            CONFIGS / "runs" / "ib-iql-lag.yaml",
        ],
        ["training.seeds=[7, 8]", "evaluation.episodes=3"],
    )
    assert config.env.id == "IB-v0" and config.algorithm.name == "iql-lag"
    assert config.algorithm.hyperparameters["hidden"] == [128, 128]  # the run file's
    assert config.algorithm.hyperparameters["expectile"] == 0.7  # the algorithm file's
    assert config.safety.constraints == "configs/constraints/ib-example.yaml"
    assert config.training.seeds == [7, 8] and config.evaluation.episodes == 3
    assert config.evaluation.patience == 4


def test_the_main_job_file_is_the_main_job():
    assert RunConfig.from_yaml(CONFIGS / "runs" / "main.yaml") == RunConfig.from_dict(MAIN_JOB)
    assert main_job_config(["training.updates=1000"]).training.updates == 1000


def test_errors_name_the_file_and_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("training:\n  batchsize: 64\n")
    with pytest.raises(
        ConfigError,
        match=r"run.yaml: training.batchsize: unknown field "
        r"\(did you mean 'batch_size'\?\)",
    ):
        RunConfig.from_yaml(path)
    path.write_text("algorithm:\n  name: td3bc\n  hyperparameters: {actor_lr: fast}\n")
    with pytest.raises(ConfigError, match=r"run.yaml: algorithm.hyperparameters.actor_lr"):
        RunConfig.from_yaml(path)
    path.write_text("training: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        RunConfig.from_yaml(path)
    with pytest.raises(ConfigError, match="no such config file"):
        RunConfig.from_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match=r"multiple of training.chunk"):
        RunConfig().with_overrides(["evaluation.every=300"])
    with pytest.raises(ConfigError, match=r"expected dotted\.field=value"):
        RunConfig().with_overrides(["training.updates"])
    with pytest.raises(ConfigError, match="is a value, not a section"):
        RunConfig().with_overrides(["name.first=x"])
    with pytest.raises(ConfigError, match="distinct seeds"):
        RunConfig().with_overrides(["training.seeds=[1, 1]"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "algorithm.hyperparameters.alpha=.nan",
            r"hyperparameters.alpha: must be positive, got nan",
        ),
        (
            "algorithm.hyperparameters.actor_lr=.inf",
            r"actor_lr: expected a learning rate in \(0, 1\], got inf",
        ),
        ("algorithm.hyperparameters.pid={kp: .nan}", r"pid.kp: must be a finite number"),
        (
            "algorithm.hyperparameters.critic_lr=-.inf",
            r"critic_lr: expected a learning rate .*got -inf",
        ),
        ("safety.cost_limits=[10, .inf]", r"safety.cost_limits.1: Input should be a finite"),
        ("evaluation.ope.discount=.nan", r"evaluation.ope.discount"),
        ("name=..", r"name: expected letters.*not starting with '\.', got '\.\.'"),
        ("name=.", r"name: expected letters"),
        ("name=../up", r"name: expected letters"),
    ],
)
def test_nan_infinity_and_escaping_names_are_refused_by_field(override, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig().with_overrides([override])


def test_tracking_section_defaults_and_errors():
    config = RunConfig()
    assert config.tracking.enabled and config.tracking.uri is None
    assert config.tracking.log_model and not config.tracking.promote
    assert RunConfig.from_dict(MAIN_JOB).tracking.promote  # the main job promotes safe policies
    changed = config.with_overrides(["tracking.uri=http://mlflow:5000", "tracking.enabled=false"])
    assert changed.tracking.uri == "http://mlflow:5000" and not changed.tracking.enabled
    with pytest.raises(ConfigError, match=r"tracking.flush_timeout"):
        config.with_overrides(["tracking.flush_timeout=-1"])
    with pytest.raises(ConfigError, match=r"tracking.registry: unknown field"):
        config.with_overrides(["tracking.registry=x"])
