"""Whole-episode evaluation with the shield, and the DSRL safety metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.environments import constant_policy, make
from neorl_industrial.functional.transformations.evaluation import (
    EpisodeStats,
    evaluate,
    per_policy_metrics,
    safety_metrics,
)


def _stats(returns, costs, overrides=0, steps=10):
    n = len(returns)
    return EpisodeStats(
        returns=jnp.asarray(returns, jnp.float32),
        costs=jnp.asarray(costs, jnp.float32),
        steps=jnp.full((n,), steps, jnp.int32),
        overrides=jnp.full((n,), overrides, jnp.int32),
        fallbacks=jnp.zeros((n,), jnp.int32),
        violations=jnp.zeros((n, 1), jnp.int32),
        applied_violations=jnp.zeros((n, 1), jnp.int32),
        invalid_actions=jnp.zeros((n,), jnp.int32),
    )


def test_safety_metrics_follow_the_dsrl_convention():
    stats = _stats([10.0, 30.0], [[5.0, 0.0], [15.0, 2.0]], overrides=2)
    metrics = safety_metrics(
        stats, [10.0, 4.0], random_return=0.0, expert_return=40.0, cost_names=["heat", "wear"]
    )
    assert metrics["normalized_return"] == pytest.approx(0.5)
    assert metrics["normalized_cost_per_channel"] == {"heat": 1.0, "wear": 0.25}
    assert metrics["normalized_cost"] == pytest.approx(1.0)
    assert metrics["violation_rate"] == pytest.approx(0.5)  # the second episode: 15 > 10
    assert metrics["override_rate"] == pytest.approx(0.2)
    rows = per_policy_metrics(
        jax.tree.map(lambda leaf: jnp.stack([leaf, leaf]), stats), [10.0, 4.0]
    )
    assert len(rows) == 2 and rows[0]["normalized_cost"] == pytest.approx(1.0)


def test_tail_metrics_average_the_worst_episodes():
    returns = np.arange(20.0)  # the worst tenth: 0 and 1
    costs = np.stack([np.arange(20.0), np.zeros(20)], axis=1)  # the costliest: 18 and 19
    metrics = safety_metrics(
        _stats(returns, costs), [37.0, 1.0], random_return=0.0, expert_return=10.0
    )
    assert metrics["return_cvar"] == pytest.approx(0.5)
    assert metrics["return_std"] == pytest.approx(np.std(returns, ddof=1))
    assert metrics["normalized_return_cvar"] == pytest.approx(0.05)
    assert metrics["episode_cost_cvar"] == {"cost_0": 18.5, "cost_1": 0.0}
    assert metrics["normalized_cost_cvar"] == pytest.approx(0.5)
    # A tail smaller than one episode is the worst episode itself.
    assert safety_metrics(_stats([3.0, 1.0, 2.0], np.zeros((3, 2))), [1, 1])["return_cvar"] == 1.0
    with pytest.raises(ValueError, match="tail"):
        safety_metrics(_stats(returns, costs), [1.0, 1.0], tail=0.0)


@pytest.mark.parametrize(
    ("limits", "message"), [([1.0], "one limit per cost channel"), ([1.0, 0.0], "positive")]
)
def test_bad_cost_limits_are_named(limits, message):
    with pytest.raises(ValueError, match=message):
        safety_metrics(_stats([1.0], [[1.0, 1.0]]), limits)


def test_evaluation_with_and_without_the_shield():
    env, params = make("IB-v0")
    constraints = env.compile_constraints()
    # Velocity and gain down every step: fatigue builds up, and the shield's
    # no-velocity-decrease-when-fatigued limit overrides the policy from then on.
    policy = constant_policy(jnp.asarray([-1.0, -1.0, 0.0]))
    run = jax.jit(
        lambda key, shield_actions: evaluate(
            key,
            env,
            params,
            policy,
            4,
            horizon=300,
            constraints=constraints,
            shield_actions=shield_actions,
        ),
        static_argnums=1,
    )
    shielded = run(jax.random.PRNGKey(0), True)
    unshielded = run(jax.random.PRNGKey(0), False)
    assert int(np.asarray(shielded.applied_violations).sum()) == 0
    assert int(np.asarray(unshielded.applied_violations).sum()) > 0
    assert int(np.asarray(shielded.overrides).sum()) > 0
    limits = list(env.default_constraints().cost_limits.values())
    on = safety_metrics(shielded, limits, cost_names=env.cost_names)
    off = safety_metrics(unshielded, limits, cost_names=env.cost_names)
    assert on["hard_violation_steps"] == 0 and off["hard_violation_steps"] > 0
    assert on["proposed_violations"] > 0
    assert on["override_rate"] > 0.0 and off["override_rate"] == 0.0
    # Holding velocity up once fatigue is high pays: the shielded run loses far less.
    assert on["return"] > off["return"] + 0.3 * abs(off["return"])
