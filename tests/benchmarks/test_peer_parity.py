"""Tests of the peer-parity benchmark: the shared evaluation, the mapping of our
hyperparameters to d3rlpy's, the data layout handed to d3rlpy, the verdicts and the page,
and the command line's refusals. The real d3rlpy worker runs under the ``slow`` marker
(in d3rlpy's own environment, ``make peer-env``)."""

from __future__ import annotations

import stat
from pathlib import Path

import numpy as np
import pytest

from benchmarks import peer_parity
from benchmarks.peers.d3rlpy_worker import d3rlpy_arrays
from benchmarks.peers.evaluation import evaluate_policy
from neorl_industrial.core.agents.registry import validate_hyperparameters
from neorl_industrial.functional.state_management import Dataset, RewardScaling
from neorl_industrial.integration.datasets.arrays import dataset_arrays

REPO_ROOT = Path(__file__).resolve().parents[2]
HORIZON = 6


class Recording:
    """A policy that remembers the observations of its first call."""

    def __init__(self, act):
        self.act = act
        self.first = None

    def __call__(self, observations: np.ndarray):
        if self.first is None:
            self.first = np.array(observations, copy=True)
        return self.act(observations)


def _still(observations: np.ndarray) -> np.ndarray:
    return np.zeros((observations.shape[0], 3), np.float32)


def _pushing(observations: np.ndarray) -> np.ndarray:
    return np.tile(np.array([[1.0, -1.0, 0.5]], np.float32), (observations.shape[0], 1))


# --------------------------------------------------------------------------- evaluation


def test_evaluator_repeats_returns_and_gives_every_policy_the_same_episodes():
    first = evaluate_policy(Recording(_still), "IB-v0", 2, 3, horizon=HORIZON)
    again = evaluate_policy(Recording(_still), "IB-v0", 2, 3, horizon=HORIZON)
    np.testing.assert_array_equal(first.returns, again.returns)
    assert first.steps == HORIZON and first.returns.shape == (2,)

    still, pushing = Recording(_still), Recording(_pushing)
    a = evaluate_policy(still, "IB-v0", 2, 3, horizon=HORIZON)
    b = evaluate_policy(pushing, "IB-v0", 2, 3, horizon=HORIZON)
    np.testing.assert_array_equal(still.first, pushing.first)
    assert a.digest == b.digest
    assert not np.array_equal(a.returns, b.returns)  # the actions do matter
    # Two episodes of one evaluation start from different states; another seed differs.
    assert not np.array_equal(still.first[0], still.first[1])
    assert evaluate_policy(_still, "IB-v0", 2, 4, horizon=HORIZON).digest != a.digest


def test_evaluator_takes_action_indices_on_the_discrete_benchmark_and_checks_shapes():
    episodes = evaluate_policy(
        lambda obs: np.full((obs.shape[0],), 13, np.int64), "IB-discrete-v0", 2, 0, horizon=3
    )
    assert episodes.returns.shape == (2,) and np.all(np.isfinite(episodes.returns))
    with pytest.raises(ValueError, match=r"expected actions of shape \(2, 3\)"):
        evaluate_policy(lambda obs: np.zeros((2, 2)), "IB-v0", 2, 0, horizon=HORIZON)
    with pytest.raises(ValueError, match="n_episodes"):
        evaluate_policy(_still, "IB-v0", 0, 0)


# --------------------------------------------------------------------------- the mapping


def _spec(name: str, **hyperparameters):
    config = validate_hyperparameters(name, {"hidden": [8], **hyperparameters})
    return config, peer_parity.d3rlpy_spec(name, config, batch_size=32)


def _check(spec, config_type: str, expected: dict, encoders: tuple[str, ...]) -> None:
    assert spec.config == config_type
    assert spec.encoder_fields == encoders
    assert spec.hidden_units == (8,)
    assert spec.kwargs == {"batch_size": 32, "gamma": 0.99, **expected}


def test_bc_maps_to_d3rlpy_field_by_field():
    _, spec = _spec("bc", learning_rate=1e-3)
    _check(
        spec,
        "BCConfig",
        {"learning_rate": 1e-3, "policy_type": "deterministic"},
        ("encoder_factory",),
    )
    assert spec.differences == tuple(peer_parity.initialization_differences("lecun"))


def test_td3bc_maps_to_d3rlpy_field_by_field():
    _, spec = _spec(
        "td3bc",
        actor_lr=1e-4,
        critic_lr=2e-4,
        tau=0.01,
        policy_noise=0.3,
        noise_clip=0.4,
        policy_freq=3,
        alpha=2.0,
    )
    expected = {
        "actor_learning_rate": 1e-4,
        "critic_learning_rate": 2e-4,
        "tau": 0.01,
        "n_critics": 2,
        "target_smoothing_sigma": 0.3,
        "target_smoothing_clip": 0.4,
        "alpha": 2.0,
        "update_actor_interval": 3,
    }
    _check(spec, "TD3PlusBCConfig", expected, ("actor_encoder_factory", "critic_encoder_factory"))
    assert spec.differences == ()  # TD3+BC starts from PyTorch's initialization, d3rlpy's
    _, lecun = _spec("td3bc", weight_init="lecun")
    assert lecun.differences == tuple(peer_parity.initialization_differences("lecun"))


def test_iql_maps_to_d3rlpy_field_by_field_and_names_a_separate_value_rate():
    _, spec = _spec(
        "iql",
        actor_lr=1e-4,
        critic_lr=2e-4,
        value_lr=2e-4,
        expectile=0.8,
        beta=10.0,
        max_exp_advantage=50.0,
        tau=0.01,
    )
    expected = {
        "actor_learning_rate": 1e-4,
        "critic_learning_rate": 2e-4,
        "tau": 0.01,
        "n_critics": 2,
        "expectile": 0.8,
        "weight_temp": 10.0,
        "max_weight": 50.0,
    }
    encoders = ("actor_encoder_factory", "critic_encoder_factory", "value_encoder_factory")
    _check(spec, "IQLConfig", expected, encoders)
    assert not any("value_lr" in text for text in spec.differences)
    assert any("log-std" in text for text in spec.differences)
    _, other = _spec("iql", value_lr=1e-3)
    assert any(text.startswith("value_lr 0.001") for text in other.differences)


def test_cql_maps_fixed_and_lagrangian_penalty_weights():
    common = {
        "actor_learning_rate": 1e-4,
        "critic_learning_rate": 2e-4,
        "temp_learning_rate": 5e-5,
        "tau": 0.01,
        "n_critics": 2,
        "initial_temperature": 1.0,
        "initial_alpha": 1.0,
        "conservative_weight": 5.0,
        "n_action_samples": 4,
        "soft_q_backup": False,
        "max_q_backup": False,
    }
    ours = {
        "actor_lr": 1e-4,
        "critic_lr": 2e-4,
        "alpha_lr": 5e-5,
        "tau": 0.01,
        "cql_alpha": 5.0,
        "n_actions": 4,
    }
    encoders = ("actor_encoder_factory", "critic_encoder_factory")
    _, fixed = _spec("cql", **ours)
    _check(
        fixed, "CQLConfig", {**common, "alpha_learning_rate": 0.0, "alpha_threshold": 0.0}, encoders
    )
    _, tuned = _spec("cql", lagrange=True, target_action_gap=7.0, alpha_prime_lr=2e-3, **ours)
    _check(
        tuned,
        "CQLConfig",
        {**common, "alpha_learning_rate": 2e-3, "alpha_threshold": 7.0},
        encoders,
    )
    assert any(text.startswith("Bellman target") for text in fixed.differences)
    assert not any("temperature 0.5" in text for text in fixed.differences)
    _, other = _spec("cql", temperature=0.5, bc_steps=100)
    assert any(text.startswith("temperature 0.5") for text in other.differences)
    assert any(text.startswith("bc_steps 100") for text in other.differences)


def test_discrete_algorithms_map_to_d3rlpy_field_by_field():
    _, bc = _spec("discrete-bc", learning_rate=3e-4)
    _check(bc, "DiscreteBCConfig", {"learning_rate": 3e-4, "beta": 0.0}, ("encoder_factory",))
    assert bc.differences == ()
    _, cql = _spec("discrete-cql", learning_rate=1e-4, cql_alpha=2.0, tau=0.01)
    expected = {
        "learning_rate": 1e-4,
        "n_critics": 1,
        "alpha": 2.0,
        "target_update_interval": 100,
    }
    _check(cql, "DiscreteCQLConfig", expected, ("encoder_factory",))
    assert any("Polyak" in text and "(100," in text for text in cql.differences)
    assert not any("td_loss" in text for text in cql.differences)  # Huber, as d3rlpy's
    _, single = _spec("discrete-cql", double_q=False, td_loss="squared")
    assert any(text.startswith("double_q off") for text in single.differences)
    assert any(text.startswith("td_loss 'squared'") for text in single.differences)


def test_initialization_is_a_difference_only_where_ours_is_not_pytorchs():
    [text] = peer_parity.initialization_differences("lecun")
    assert text.startswith("Initialization") and "'lecun'" in text
    assert peer_parity.initialization_differences("uniform") == []
    # BC starts from flax's LeCun normal.
    assert _spec("bc")[1].differences[0] == text
    # TD3+BC, IQL, CQL and the discrete agents start from PyTorch's scale unless told otherwise.
    for name in ("td3bc", "iql", "cql", "discrete-bc", "discrete-cql"):
        assert not any(t.startswith("Initialization") for t in _spec(name)[1].differences)
        changed = _spec(name, weight_init="lecun")[1]
        assert changed.differences[0] == text
        assert changed.kwargs == _spec(name)[1].kwargs  # d3rlpy's job is the same


def test_mapping_refuses_unknown_algorithms_and_unmapped_fields():
    import dataclasses

    with pytest.raises(ValueError, match="no counterpart of 'sac'"):
        peer_parity.d3rlpy_spec("sac", object(), 32)

    @dataclasses.dataclass(frozen=True)
    class Extended:
        learning_rate: float = 1e-3
        hidden: tuple[int, ...] = (8,)
        dropout: float = 0.1

    with pytest.raises(ValueError, match=r"bc: no d3rlpy mapping for config field\(s\) dropout"):
        peer_parity.d3rlpy_spec("bc", Extended(), 32)


def test_every_registered_default_config_is_mapped():
    for name in peer_parity.ALGORITHMS:
        spec = _spec(name)[1]
        assert spec.config == peer_parity.D3RLPY_CONFIGS[name][0]


def _dataset(discrete: bool = False, terminate_second: bool = True) -> Dataset:
    rng = np.random.default_rng(0)
    n, steps = 2, 5
    actions = (
        rng.integers(0, 27, (n, steps)).astype(np.int32)
        if discrete
        else rng.uniform(-1, 1, (n, steps, 3)).astype(np.float32)
    )
    terminated = np.zeros((n, steps), bool)
    terminated[1, 2] = terminate_second
    return Dataset.from_trajectories(
        rng.normal(size=(n, steps + 1, 4)).astype(np.float32),
        actions,
        rng.normal(-3.0, 2.0, (n, steps)).astype(np.float32),
        np.zeros((n, steps, 1), np.float32),
        terminated,
    )


def test_reward_and_observation_scalers_give_d3rlpy_our_numbers():
    dataset = _dataset()
    rewards = np.asarray(dataset.rewards, np.float64)
    for kind in ("std", "return_range"):
        scaling = RewardScaling.fit(dataset, kind)
        spec = peer_parity.d3rlpy_reward_scaler(scaling)
        assert spec == {"type": "multiply", "multiplier": scaling.scale}
        np.testing.assert_allclose(
            spec["multiplier"] * rewards, np.asarray(scaling.apply(dataset).rewards), rtol=1e-6
        )
    scaling = RewardScaling.fit(dataset, "standardize")
    spec = peer_parity.d3rlpy_reward_scaler(scaling)
    assert spec["type"] == "standard" and spec["eps"] == 0.0
    # d3rlpy's StandardRewardScaler: multiplier * (r - mean) / (std + eps).
    theirs = spec["multiplier"] * (rewards - spec["mean"]) / (spec["std"] + spec["eps"])
    np.testing.assert_allclose(theirs, np.asarray(scaling.apply(dataset).rewards), rtol=1e-5)
    assert peer_parity.d3rlpy_reward_scaler(RewardScaling.fit(dataset, "none")) is None

    from neorl_industrial.core.agents import ObservationNormalizer

    normalizer = ObservationNormalizer.create([1.0, 2.0], [0.5, 0.0])
    assert peer_parity.d3rlpy_observation_scaler(normalizer) == {
        "mean": [1.0, 2.0],
        "std": [0.5, 1.0],  # a constant feature keeps our floor, and eps adds nothing
        "eps": 0.0,
    }


@pytest.mark.parametrize("discrete", [False, True])
def test_d3rlpy_layout_holds_exactly_our_transitions(discrete):
    dataset = _dataset(discrete)
    flat = d3rlpy_arrays(dataset_arrays(dataset, frames=False))
    # Episode 0 timed out after 5 steps (one extra row), episode 1 terminated after 3.
    np.testing.assert_array_equal(flat["timeouts"], [0, 0, 0, 0, 0, 1, 0, 0, 0])
    np.testing.assert_array_equal(flat["terminals"], [0, 0, 0, 0, 0, 0, 0, 0, 1])
    # d3rlpy's transitions: every row but a timed-out episode's last; the next
    # observation is the next row's (zeros after a terminal, never bootstrapped).
    rows = [0, 1, 2, 3, 4, 6, 7, 8]
    observations = np.asarray(dataset.transition_observations())
    np.testing.assert_array_equal(flat["observations"][rows], observations)
    np.testing.assert_array_equal(
        flat["observations"][[1, 2, 3, 4, 5, 7, 8]],
        np.asarray(dataset.next_observations())[:7],
    )
    np.testing.assert_array_equal(flat["actions"][rows], np.asarray(dataset.actions))
    np.testing.assert_array_equal(flat["rewards"][rows], np.asarray(dataset.rewards))
    assert flat["rewards"][5] == 0.0


# --------------------------------------------------------------------------- verdicts, page


def test_verdict_compares_our_mean_with_d3rlpys_lower_bound():
    theirs = {"mean": 12.0, "ci": 1.5, "n": 5}
    assert peer_parity.verdict({"mean": 10.6, "ci": 3.0}, theirs)["met"] is True
    failing = peer_parity.verdict({"mean": 10.4, "ci": 3.0}, theirs)
    assert failing["met"] is False and failing["d3rlpy_lower_bound"] == pytest.approx(10.5)
    assert (
        peer_parity.verdict({"mean": 11.9, "ci": None}, {"mean": 12.0, "ci": None})["met"] is False
    )
    assert peer_parity.train_ratio(10.0, 40.0) == pytest.approx(4.0)
    assert peer_parity.train_ratio(None, 40.0) is None


def _row(ours: tuple[float, float], theirs: tuple[float, float]) -> dict:
    ours_score = {"mean": ours[0], "ci": ours[1], "n": 5}
    theirs_score = {"mean": theirs[0], "ci": theirs[1], "n": 5}
    return {
        "reward_scaling": {"kind": "std", "shift": 0.0, "scale": 0.1},
        "ours": {
            "score": ours_score,
            "train_s": 20.0,
            "eval_s": 1.0,
            "updates_per_s": 2500.0,
            "steady_updates_per_s": None,
        },
        "d3rlpy": {
            "score": theirs_score,
            "train_s": 100.0,
            "eval_s": 2.0,
            "updates_per_s": 500.0,
            "versions": {"d3rlpy": "2.8.1", "torch": "2.13.0", "torch_threads": 2},
        },
        "verdict": peer_parity.verdict(ours_score, theirs_score),
        "train_ratio": 5.0,
    }


def test_page_has_one_row_per_dataset_and_algorithm_and_flags_failures():
    config = {
        "algorithms": ["bc", "td3bc"],
        "trajectories": 100,
        "data_seed": 0,
        "hidden": [64, 64],
        "batch_size": 256,
        "n_updates": 10_000,
        "n_seeds": 5,
        "n_episodes": 100,
        "evaluation_seed": 7,
        "device": "cpu",
    }
    datasets = {
        "IB-v0-medium": {
            "behaviour_score": 48.3,
            "algorithms": {
                "bc": _row((45.0, 2.0), (46.0, 2.0)),
                "td3bc": _row((30.0, 4.0), (50.0, 3.0)),
            },
        }
    }
    results = {
        "datasets": datasets,
        "differences": {"bc": [], "td3bc": ["a difference"]},
        "common_differences": ["everywhere"],
        "summary": peer_parity.summary(datasets),
    }
    assert results["summary"] == {"rows": 2, "met": 1, "not_met": ["IB-v0-medium td3bc"]}
    page = peer_parity.markdown(config, results)
    assert "| IB-v0-medium | BC | 48.3 | 46.0 ± 2.0 | 45.0 ± 2.0 | met | 100 | 20 | 5.0 |" in page
    assert "| IB-v0-medium | TD3+BC | 48.3 | 50.0 ± 3.0 | 30.0 ± 4.0 | **not met** |" in page
    assert "1 of 2 rows meet it; not met: IB-v0-medium td3bc." in page
    assert "| IB-v0-medium | TD3+BC | 500 | 2,500 | — |" in page
    assert "- a difference" in page and "- everywhere" in page
    assert "BC:\n\n- none beyond the above." in page
    # BC 20 + 1 and TD3+BC 20 + 1 seconds of ours, 100 + 2 each of d3rlpy's.
    whole = "The whole study, training and evaluating every row's seeds: d3rlpy 204 s, ours 42 s"
    assert whole in page


# --------------------------------------------------------------------------- command line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algorithms", "sac"], "invalid choice: 'sac'"),
        (["--qualities", "expert"], "invalid choice: 'expert'"),
        (["--updates", "150", "--chunk", "100"], "expected a multiple of --chunk 100"),
        (["--seeds", "0"], "--seeds: expected a positive integer"),
        (["--peer-python", "no/such/python"], "run `make peer-env`"),
        (["--rows", "td3bc:expert"], "--rows 'td3bc:expert': expected ALGORITHM:QUALITY"),
        (["--rows", "sac:low"], "--rows 'sac:low': expected ALGORITHM:QUALITY"),
        (["--rows", "td3bc"], "--rows 'td3bc': expected ALGORITHM:QUALITY"),
        (["--task", "Nope-v0"], "--task: unknown environment 'Nope-v0'"),
        (["--task", "IB-discrete-v0"], "--task: IB-discrete-v0 has discrete actions"),
        (["--discrete-task", "CSTR-v0"], "--discrete-task: CSTR-v0 has continuous actions"),
    ],
)
def test_command_line_refuses_bad_input_before_any_work(argv, message, tmp_path, capsys):
    doc = tmp_path / "page.md"
    with pytest.raises(SystemExit) as exit_info:
        peer_parity.main([*argv, "--results-dir", str(tmp_path / "results"), "--doc", str(doc)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not doc.exists() and not (tmp_path / "results").exists()


def test_rows_pick_one_dataset_per_algorithm_or_default_to_the_grid():
    import argparse

    grid = argparse.Namespace(rows=None, algorithms=["bc", "iql"], qualities=["low", "high"])
    assert peer_parity.study_rows(grid) == [
        ("bc", "low"),
        ("bc", "high"),
        ("iql", "low"),
        ("iql", "high"),
    ]
    chosen = argparse.Namespace(rows=[("iql", "high"), ("cql", "low")], algorithms=[], qualities=[])
    assert peer_parity.study_rows(chosen) == [("iql", "high"), ("cql", "low")]
    for row in peer_parity.HEADLINE_ROWS:
        name, quality = row.split(":")
        assert name in peer_parity.ALGORITHMS and quality in peer_parity.QUALITIES
    assert {row.split(":")[0] for row in peer_parity.HEADLINE_ROWS} == set(peer_parity.ALGORITHMS)


def _fake_python(tmp_path: Path, script: str) -> Path:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_failing_worker_names_its_job_and_shows_its_output(tmp_path):
    python = _fake_python(tmp_path, 'echo "peer: starting"; echo "ValueError: boom" >&2; exit 3')
    with pytest.raises(peer_parity.PeerWorkerError) as error:
        peer_parity.run_peer_job({"label": "IB-v0-low-td3bc"}, tmp_path, python)
    text = str(error.value)
    assert "exited with status 3 on job IB-v0-low-td3bc" in text
    assert "IB-v0-low-td3bc.job.json" in text and "ValueError: boom" in text
    silent = _fake_python(tmp_path, "exit 0")
    with pytest.raises(peer_parity.PeerWorkerError, match="wrote no result on job x"):
        peer_parity.run_peer_job({"label": "x"}, tmp_path, silent)


# --------------------------------------------------------------------------- any task


def test_the_evaluator_maps_actions_in_unit_range_to_a_tasks_bounds():
    from neorl_industrial.core.environments import make

    env, _ = make("CSTR-v0")
    low, high = np.asarray(env.action_low), np.asarray(env.action_high)

    def constant(value):
        return lambda obs: np.tile(np.asarray(value, np.float32), (obs.shape[0], 1))

    # 0.5 in [-1, 1] is three quarters of the way from the lower bound to the upper one.
    plant = evaluate_policy(constant(low + 0.75 * (high - low)), "CSTR-v0", 2, 0, horizon=5)
    bounds = (low.tolist(), high.tolist())
    scaled = evaluate_policy(constant([0.5]), "CSTR-v0", 2, 0, horizon=5, action_bounds=bounds)
    np.testing.assert_allclose(scaled.returns, plant.returns, rtol=1e-6)
    unscaled = evaluate_policy(constant([0.5]), "CSTR-v0", 2, 0, horizon=5)
    assert not np.allclose(unscaled.returns, plant.returns)  # the bounds do matter


def test_a_task_in_plant_units_trains_both_sides_in_unit_range_and_evaluates_in_its_units(
    tmp_path, monkeypatch
):
    from neorl_industrial.integration.datasets import load_native

    args = peer_parity.parse_args(
        [
            *("--peer-python", "/bin/sh", "--task", "CSTR-v0", "--rows", "td3bc:medium"),
            *("--trajectories", "2", "--seeds", "2", "--updates", "20", "--chunk", "10"),
            *("--episodes", "2", "--hidden", "8"),
        ]
    )
    jobs = []

    def fake_peer(job, work_dir, python):
        # d3rlpy's side, without d3rlpy: the job's data and evaluation, a still policy.
        jobs.append(job)
        dataset, _ = load_native(job["dataset"])
        assert np.abs(np.asarray(dataset.actions)).max() <= 1.0
        episodes = evaluate_policy(
            lambda obs: np.zeros((obs.shape[0], 1), np.float32),
            job["evaluation"]["env_id"],
            job["evaluation"]["episodes"],
            job["evaluation"]["seed"],
            action_bounds=job["evaluation"].get("action_bounds"),
        )
        seed = {"train_s": 1.0, "eval_s": 1.0, "returns": episodes.returns.tolist()}
        return {
            "seeds": [seed, seed],
            "episodes_digest": episodes.digest,
            "versions": {"d3rlpy": "none"},
            "d3rlpy_config": {},
        }

    monkeypatch.setattr(peer_parity, "run_peer_job", fake_peer)
    entry = peer_parity.study_dataset("CSTR-v0", "medium", ["td3bc"], args, tmp_path)
    assert entry["env_id"] == "CSTR-v0" and entry["action_scaling"]
    bounds = jobs[0]["evaluation"]["action_bounds"]
    assert bounds[0] != [-1.0] or bounds[1] != [1.0]
    row = entry["algorithms"]["td3bc"]
    assert np.all(np.isfinite(row["ours"]["per_seed_scores"]))
    assert len(row["d3rlpy"]["per_seed_scores"]) == 2


# --------------------------------------------------------------------------- the real worker

PEER_PYTHON = REPO_ROOT / peer_parity.PEER_PYTHON


@pytest.mark.slow
@pytest.mark.skipif(not PEER_PYTHON.exists(), reason="no .venv-d3rlpy: run `make peer-env`")
def test_real_worker_trains_and_evaluates_on_our_episodes(tmp_path):
    from benchmarks.learning import observation_normalizer
    from neorl_industrial.integration.datasets import save_native

    for name, env_id, discrete in (
        ("td3bc", "IB-v0", False),
        ("discrete-cql", "IB-discrete-v0", True),
    ):
        rng = np.random.default_rng(1)
        n, steps = 3, 8
        dataset = Dataset.from_trajectories(
            rng.normal(size=(n, steps + 1, 180)).astype(np.float32),
            rng.integers(0, 27, (n, steps)).astype(np.int32)
            if discrete
            else rng.uniform(-1, 1, (n, steps, 3)).astype(np.float32),
            rng.normal(-200.0, 20.0, (n, steps)).astype(np.float32),
            np.zeros((n, steps, 1), np.float32),
            np.zeros((n, steps), bool),
        )
        save_native(dataset, tmp_path / name)
        config = validate_hyperparameters(name, {"hidden": [8]})
        evaluation = {"env_id": env_id, "episodes": 2, "seed": 5, "horizon": 4}
        job = {
            "label": f"test-{name}",
            "algorithm": name,
            "dataset": str(tmp_path / name),
            "num_actions": 27 if discrete else None,
            "d3rlpy": peer_parity.d3rlpy_spec(name, config, 16).to_job(),
            "observation_scaler": peer_parity.d3rlpy_observation_scaler(
                observation_normalizer(dataset)
            ),
            "reward_scaler": peer_parity.d3rlpy_reward_scaler(RewardScaling.fit(dataset, "std")),
            "seeds": [0, 1],
            "updates": 12,
            "evaluation": evaluation,
        }
        result = peer_parity.run_peer_job(job, tmp_path, PEER_PYTHON)
        ours = evaluate_policy(
            (lambda obs: np.zeros(obs.shape[0], np.int32))
            if discrete
            else (lambda obs: np.zeros((obs.shape[0], 3), np.float32)),
            env_id,
            2,
            5,
            horizon=4,
        )
        assert result["episodes_digest"] == ours.digest
        assert [seed["seed"] for seed in result["seeds"]] == [0, 1]
        assert all(len(seed["returns"]) == 2 and seed["train_s"] > 0 for seed in result["seeds"])
        assert result["n_transitions"] == dataset.n_transitions
        assert result["d3rlpy_config"]["batch_size"] == 16
        assert result["versions"]["d3rlpy"].startswith("2.8")
    assert not any(Path(REPO_ROOT).glob("d3rlpy_logs*"))


# --------------------------------------------------------------------------- --base


def _saved_study(tmp_path: Path, **changes) -> Path:
    """A saved two-dataset study with BC and TD3+BC on medium and IQL on high."""
    from benchmarks.harness import BenchmarkResult

    args = peer_parity.parse_args(["--peer-python", "/bin/sh", "--rows", "bc:medium"])
    config = {
        "rows": ["bc:medium", "td3bc:medium", "iql:high"],
        "algorithms": ["bc", "td3bc", "iql"],
        "env_ids": {"bc": "IB-v0", "td3bc": "IB-v0", "iql": "IB-v0"},
        **peer_parity.settings_of(args),
        "device": "cpu",
        **changes,
    }

    def dataset(quality: str, rows: dict) -> dict:
        for name, row in rows.items():
            row["hyperparameters"] = {"ours": {}, "d3rlpy": {"config": name, "kwargs": {}}}
            row["differences"] = [f"{name} difference"]
        return {
            "env_id": "IB-v0",
            "quality": quality,
            "n_transitions": 1000,
            "behaviour_return": -240.0,
            "behaviour_score": 48.3,
            "algorithms": rows,
        }

    datasets = {
        "IB-v0-medium": dataset(
            "medium", {"bc": _row((45.0, 2.0), (46.0, 2.0)), "td3bc": _row((50.0, 1), (51.0, 1))}
        ),
        "IB-v0-high": dataset("high", {"iql": _row((70.0, 2.0), (60.0, 5.0))}),
    }
    results = {
        "datasets": datasets,
        "differences": {name: [f"{name} difference"] for name in ("bc", "td3bc", "iql")},
        "common_differences": ["everywhere"],
        "summary": peer_parity.summary(datasets),
    }
    return BenchmarkResult("peer_parity", config=config, results=results).save(tmp_path)


def test_base_study_must_share_the_settings_that_decide_the_numbers(tmp_path, capsys):
    path = _saved_study(tmp_path, n_updates=500)
    with pytest.raises(SystemExit):
        peer_parity.main(
            ["--peer-python", "/bin/sh", "--rows", "bc:medium", "--base", str(path), "--no-save"]
        )
    err = capsys.readouterr().err
    assert "settings differ: n_updates 500 (here 10000)" in err
    other = tmp_path / "other.json"
    other.write_text('{"name": "learning", "config": {}, "results": {}}')
    for argv, message in (
        (["--base", str(other)], "not a peer-parity result (benchmark 'learning')"),
        (["--base", str(tmp_path / "missing.json")], "No such file"),
        (["--rerun-peer"], "--rerun-peer: only with --base"),
        (["--set", "alpha"], "--set 'alpha': expected FIELD=VALUE"),
        (["--set", "hidden=[8]"], "--set 'hidden=[8]': expected FIELD=VALUE"),
    ):
        with pytest.raises(SystemExit):
            peer_parity.main(["--peer-python", "/bin/sh", *argv, "--no-save"])
        assert message in capsys.readouterr().err


def test_base_study_gives_back_d3rlpys_seeds_only_for_the_same_job(tmp_path):
    path = _saved_study(tmp_path)
    args = peer_parity.parse_args(
        ["--peer-python", "/bin/sh", "--rows", "bc:medium", "--base", str(path)]
    )
    entry = {"env_id": "IB-v0", "quality": "medium", "n_transitions": 1000}
    entry["behaviour_return"] = -240.0
    job = {"config": "bc", "kwargs": {}}
    scaling = {"kind": "std", "shift": 0.0, "scale": 0.1}
    theirs = peer_parity.reusable_peer(args, entry, "bc", job, scaling)
    assert theirs["reused_from"] == path.name and theirs["score"]["mean"] == 46.0
    # Any difference in d3rlpy's job, the scaling or the data runs d3rlpy again.
    assert (
        peer_parity.reusable_peer(args, entry, "bc", {**job, "kwargs": {"x": 1}}, scaling) is None
    )
    assert peer_parity.reusable_peer(args, entry, "bc", job, {**scaling, "scale": 0.2}) is None
    assert (
        peer_parity.reusable_peer(args, {**entry, "n_transitions": 999}, "bc", job, scaling) is None
    )
    assert peer_parity.reusable_peer(args, entry, "cql", job, scaling) is None
    args.rerun_peer = True
    assert peer_parity.reusable_peer(args, entry, "bc", job, scaling) is None


def test_base_study_carries_the_rows_not_run_again(tmp_path):
    from benchmarks.harness import BenchmarkResult

    path = _saved_study(tmp_path)
    base = BenchmarkResult.load(path)
    new_row = _row((40.0, 1.0), (46.0, 2.0))  # BC run again, now below d3rlpy
    new_row["d3rlpy"]["reused_from"] = path.name
    config = {"rows": ["bc:medium"], "env_ids": {"bc": "IB-v0"}, "algorithms": ["bc"]}
    config |= {key: base.config[key] for key in (*peer_parity.BASE_SETTINGS, "data_seed")}
    config |= {"device": "cpu"}
    results = {
        "datasets": {
            "IB-v0-medium": {**base.results["datasets"]["IB-v0-medium"], "algorithms": {}}
        },
        "differences": {"bc": ["new bc difference"]},
        "common_differences": ["everywhere"],
    }
    results["datasets"]["IB-v0-medium"]["algorithms"]["bc"] = new_row
    merged_config, merged = peer_parity.with_base(config, results, base, path.name)
    assert merged_config["rows"] == ["bc:medium", "td3bc:medium", "iql:high"]
    assert merged_config["algorithms"] == ["bc", "td3bc", "iql"]
    medium = merged["datasets"]["IB-v0-medium"]["algorithms"]
    assert medium["bc"] is new_row and "carried_from" not in medium["bc"]
    assert medium["td3bc"]["carried_from"] == path.name
    assert merged["datasets"]["IB-v0-high"]["algorithms"]["iql"]["carried_from"] == path.name
    assert merged["summary"] == {"rows": 3, "met": 2, "not_met": ["IB-v0-medium bc"]}
    # A carried row from before the initialization was per algorithm names it now.
    assert merged["differences"]["td3bc"][0].startswith("Initialization")
    assert merged["differences"]["bc"] == ["new bc difference"]
    page = peer_parity.markdown(merged_config, merged)
    assert f"Carried over unchanged from `{path.name}`" in page
    assert "IB-v0-medium TD3+BC, IB-v0-high IQL" in page
    assert f"d3rlpy's seeds read back from `{path.name}`" in page


def test_base_study_of_another_data_seed_carries_its_other_datasets_only(tmp_path):
    from benchmarks.harness import BenchmarkResult

    path = _saved_study(tmp_path)  # data seed 0
    base = BenchmarkResult.load(path)
    config = {"rows": ["td3bc:medium"], "env_ids": {"td3bc": "CSTR-v0"}, "algorithms": ["td3bc"]}
    config |= {key: base.config[key] for key in peer_parity.BASE_SETTINGS}
    config |= {"device": "cpu", "data_seed": 17}
    cstr = {
        **base.results["datasets"]["IB-v0-medium"],
        "env_id": "CSTR-v0",
        "data_seed": 17,
        "algorithms": {"td3bc": _row((72.0, 1.0), (72.5, 1.0))},
    }
    for row in cstr["algorithms"].values():
        row["hyperparameters"] = {"ours": {}, "d3rlpy": {"config": "td3bc", "kwargs": {}}}
        row["differences"] = []
    results = {
        "datasets": {"CSTR-v0-medium": cstr},
        "differences": {"td3bc": []},
        "common_differences": ["everywhere"],
    }
    merged_config, merged = peer_parity.with_base(config, results, base, path.name)
    assert list(merged["datasets"]) == ["IB-v0-medium", "IB-v0-high", "CSTR-v0-medium"]
    assert merged["datasets"]["IB-v0-medium"]["data_seed"] == 0
    assert merged["datasets"]["IB-v0-medium"]["algorithms"]["td3bc"]["carried_from"] == path.name
    assert merged["summary"]["rows"] == 4
    page = peer_parity.markdown(merged_config, merged)
    assert "100 trajectories each, data seed 0; CSTR-v0-medium 17)" in page
    # The same dataset under another seed would mix two datasets' rows: refused by name.
    results["datasets"] = {"IB-v0-medium": {**cstr, "env_id": "IB-v0"}}
    with pytest.raises(ValueError, match="IB-v0-medium was generated with data seed 0 there"):
        peer_parity.with_base(config, results, base, path.name)


def test_page_of_a_saved_study_is_written_without_training(tmp_path, capsys):
    path = _saved_study(tmp_path)
    doc = tmp_path / "page.md"
    argv = ["--peer-python", "/bin/sh", "--doc", str(doc)]
    assert peer_parity.main([*argv, "--page-from", str(path)]) == 0
    page = doc.read_text()
    assert "| IB-v0-high | IQL | 48.3 | 60.0 ± 5.0 | 70.0 ± 2.0 | met |" in page
    other = tmp_path / "other.json"
    other.write_text('{"name": "learning", "config": {}, "results": {}}')
    doc.unlink()
    assert peer_parity.main([*argv, "--page-from", str(other)]) == 2
    assert "not a peer-parity result" in capsys.readouterr().err and not doc.exists()
