"""Which policies a run may keep: a policy whose parameters or actions are not finite,
or that the shield replaces by its fallback where the operators' own action passes,
fails; the verdict's ranking puts the recommended candidate first, then the qualifying,
then those within their cost limits, each by its lower bound. Hyperparameters and batch
sizes outside their sane ranges are refused by name before anything is traced."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.registry import HyperparameterError, validate_hyperparameters
from neorl_industrial.core.safety import ConstraintSpec
from neorl_industrial.functional.transformations.sweep import SweepError, plan_sweep
from neorl_industrial.wrappers.training.config import TrainingSection
from neorl_industrial.wrappers.training.plan import PlanError, RunPlan
from neorl_industrial.wrappers.training.selection import (
    best_evaluated_run,
    policy_health,
    verdict_ranking,
)
from tests.wrappers.conftest import ib_shaped_dataset


def act(params, observation, key=None, deterministic=True):
    del key, deterministic
    return jnp.tanh(params["w"] * observation[:2]) * params["scale"] ** 2


def test_a_policy_that_cannot_act_fails_by_name():
    observations = jnp.asarray(np.random.default_rng(0).normal(size=(64, 3)), jnp.float32)
    policies = {
        "w": jnp.asarray([1.0, np.nan, 1.0]),
        "scale": jnp.asarray([1.0, 1.0, 1e30]),
    }
    healthy, poisoned, exploding = policy_health(act, policies, observations)
    assert healthy.failure is None and healthy.non_finite_share == 0.0
    assert "parameters hold NaN or infinity" in poisoned.failure
    # Finite parameters, actions that overflow to infinity.
    assert exploding.finite_parameters and exploding.non_finite_share == 1.0
    assert "proposes non-finite actions" in exploding.failure
    assert "100.0% of 64 logged observations" in exploding.failure


def test_the_fallback_counts_only_where_the_operators_action_passes():
    constraints = ConstraintSpec.from_dict(
        {
            "action_bounds": {"action_0": [-1.0, 1.0], "action_1": [-1.0, 1.0]},
            "linear": [{"name": "sum", "action": {"action_0": 1.0, "action_1": 1.0}, "bound": 1.5}],
        }
    ).compile(3, 2)
    observations = jnp.zeros((10, 3), jnp.float32)
    logged = jnp.full((10, 2), 0.2, jnp.float32)
    # A NaN proposal always falls back; a finite one is projected onto the rule.
    policies = {"w": jnp.asarray([1.0, 1.0]), "scale": jnp.asarray([1.0, np.nan])}
    fine, broken = policy_health(
        act, policies, observations, logged_actions=logged, constraints=constraints
    )
    assert fine.fallback_share == 0.0 and fine.failure is None
    assert broken.fallback_share == 1.0 and broken.non_finite_share == 1.0


def test_the_verdicts_ranking_and_the_evaluations_choice():
    def row(name, qualifies, lower, within=True):
        costs = [{"within_limit": within}]
        estimates = [
            {"estimator": "model", "improvement": {"lower": lower}, "costs": costs},
            {"estimator": "fqe", "improvement": {"lower": 100.0}, "costs": []},
        ]
        return {"name": name, "qualifies": qualifies, "estimates": estimates}

    verdict = {
        "deciding": ["model", "model+fqe"],
        "recommended": "b",
        "candidates": [
            row("a", True, 5.0),
            row("b", True, 3.0),
            row("c", False, 9.0, within=False),
            row("d", False, 1.0),
            row("e", False, float("nan")),
        ],
    }
    assert verdict_ranking(verdict) == ["b", "a", "d", "e", "c"]
    best = [
        {"metrics": {"return": 10.0, "normalized_cost": 0.5}},
        {"metrics": {"return": 20.0, "normalized_cost": 2.0}},
        None,
        {"metrics": {"return": 5.0, "normalized_cost": 0.9}},
    ]
    assert best_evaluated_run(best, [0, 1, 2, 3]) == 0
    assert best_evaluated_run(best, [1, 2, 3]) == 3  # run 0 failed
    assert best_evaluated_run(best, [2]) == 2


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("td3bc-lag", {"actor_lr": 1e308}, "actor_lr: expected a learning rate in (0, 1]"),
        ("iql-lag", {"beta": 1e6}, "beta: expected IQL's inverse temperature in (0, 1000]"),
        ("iql", {"expectile": 1.0}, "expectile: expected an expectile in (0, 1)"),
        ("td3bc", {"tau": 2.0}, "tau: expected a target-network rate in (0, 1], got 2"),
        ("td3bc-lag", {"pid": {"max_multiplier": 1e300}}, "pid.max_multiplier: expected"),
        ("td3bc-lag", {"discount": 1.5}, "discount: expected a discount in (0, 1], got 1.5"),
        ("mopo", {"penalty_coef": 1e5}, "penalty_coef: expected MOPO's lambda in [0, 1000]"),
        ("mopo", {"reward_shift": 1e300}, "reward_shift: expected a setting in [-1e+06, 1e+06]"),
    ],
)  # fmt: skip
def test_hyperparameters_outside_their_range_are_refused_by_name(name, values, message):
    with pytest.raises(HyperparameterError) as refused:
        validate_hyperparameters(name, values)
    assert message in str(refused.value)
    assert str(refused.value).startswith("algorithm.hyperparameters.")


def test_a_value_yaml_reads_as_text_is_range_checked_once_it_is_a_number(tmp_path):
    from neorl_industrial.wrappers.training.config import ConfigError, RunConfig

    config = tmp_path / "run.yaml"
    config.write_text("algorithm: {name: td3bc-lag}\n")
    # YAML 1.1 reads 1e308 (no dot) as text; the type check makes it a number.
    with pytest.raises(ConfigError, match=r"actor_lr: expected a learning rate in \(0, 1\]"):
        RunConfig.from_files([config], ["algorithm.hyperparameters.actor_lr=1e308"])


def test_a_grid_value_and_a_batch_size_outside_their_range_are_refused():
    with pytest.raises(SweepError, match=r"configuration 1 \{'alpha': 1e\+300\}: .*alpha"):
        plan_sweep("td3bc", {"alpha": [2.5, 1e300]}, obs_size=3, action_size=2)
    with pytest.raises(PlanError, match=r"training\.batch_size: expected 1 to 65,536"):
        RunPlan.create(
            ib_shaped_dataset(episodes=2, steps=5),
            algorithm="bc",
            training=TrainingSection(batch_size=10**9, updates=1, chunk=1),
            evaluation=None,
        )
