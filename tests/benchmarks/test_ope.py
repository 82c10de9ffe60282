"""Tests of the off-policy evaluation study's pieces: the merged dataset, the simulator's
discounted values, the agreement statistics and the page."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import ope
from neorl_industrial.core.environments import constant_policy, make, rollout
from neorl_industrial.functional.state_management import Dataset


def _episodes(n: int, length: int, offset: float) -> Dataset:
    rng = np.random.default_rng(int(offset))
    return Dataset.from_trajectories(
        (rng.normal(size=(n, length + 1, 2)) + offset).astype(np.float32),
        rng.uniform(-1, 1, (n, length, 3)).astype(np.float32),
        np.full((n, length), offset, np.float32),
        np.zeros((n, length, 1), np.float32),
        np.zeros((n, length), bool),
    )


def test_concatenate_keeps_every_episode_in_order():
    first, second = _episodes(2, 3, 0.0), _episodes(3, 4, 10.0)
    merged = ope.concatenate([first, second])
    assert merged.n_episodes == 5 and merged.n_transitions == 2 * 3 + 3 * 4
    np.testing.assert_array_equal(merged.episode_lengths, [3, 3, 4, 4, 4])
    np.testing.assert_array_equal(merged.next_observations()[6:], second.next_observations())
    np.testing.assert_array_equal(merged.rewards[6:], second.rewards)


def test_discounted_values_match_the_rollout():
    env, params = make("IB-v0", horizon=6)
    action = jnp.array([0.5, -0.2, 0.1])
    policy = lambda observations: jnp.broadcast_to(action, (observations.shape[0], 3))  # noqa: E731
    key = jax.random.PRNGKey(3)
    recorded = rollout(key, env, params, constant_policy(action), 4, 6, record=True)
    weights = 0.9 ** np.arange(6)
    returns, costs = ope.discounted_values(key, env, params, policy, 4, 6, 0.9)
    np.testing.assert_allclose(
        returns, weights @ np.asarray(recorded.transitions.reward), rtol=1e-5
    )
    np.testing.assert_allclose(
        costs, np.einsum("t,tnc->nc", weights, np.asarray(recorded.transitions.cost)), atol=1e-5
    )
    undiscounted, _ = ope.discounted_values(key, env, params, policy, 4, 6, 1.0)
    np.testing.assert_allclose(undiscounted, recorded.total_reward, rtol=1e-5)


def test_action_distance_is_to_the_nearest_reference():
    observations = jnp.zeros((5, 2))
    near = lambda obs: jnp.full((obs.shape[0], 3), 0.1)  # noqa: E731
    far = lambda obs: jnp.full((obs.shape[0], 3), 0.9)  # noqa: E731
    assert ope.action_distance(near, [near, far], observations) == pytest.approx(0.0)
    assert ope.action_distance(lambda obs: 0 * near(obs), [near, far], observations) == (
        pytest.approx(0.1 * np.sqrt(3), rel=1e-5)
    )


def test_summary_rewards_agreement_and_punishes_errors():
    true_returns = [-300.0, -200.0, -100.0]
    true_costs = [[20.0], [5.0], [0.0]]
    perfect = ope.summarize(true_returns, true_returns, true_costs, true_costs, ["heat"], [10.0])
    assert perfect["return"]["spearman"] == pytest.approx(1.0)
    assert perfect["return"]["mare"] == 0.0 and perfect["return"]["regret_at_1"] == 0.0
    assert perfect["costs"]["heat"]["agreement"] == 1.0 and perfect["cost_agreement"] == 1.0
    reversed_ = ope.summarize(
        true_returns, [-100.0, -200.0, -300.0], true_costs, [[0.0], [12.0], [0.0]], ["heat"], [10.0]
    )
    assert reversed_["return"]["spearman"] == pytest.approx(-1.0)
    assert reversed_["return"]["regret_at_1"] == pytest.approx(200.0)
    assert reversed_["return"]["mare"] == pytest.approx((200 / 300 + 0 + 200 / 100) / 3)
    # policy 0 (20 > 10) called safe, policy 1 (5 <= 10) called unsafe: one of three right
    assert reversed_["costs"]["heat"]["agreement"] == pytest.approx(1 / 3)
    assert reversed_["costs"]["heat"]["mae"] == pytest.approx((20 + 7 + 0) / 3)
    constant = ope.summarize(true_returns, true_returns, [[0.0]] * 3, [[0.0]] * 3, ["c"], [1.0])
    assert constant["costs"]["c"]["spearman"] is None


def test_page_and_table_show_every_policy():
    names = ["fatigue"]
    policies = {
        name: {
            "description": text,
            "action_distance": 0.1 * index,
            "true_return": -100.0 - index,
            "true_return_se": 1.0,
            "true_costs": [float(index)],
            "fqe_return": -101.0 - index,
            "fqe_costs": [float(index) + 0.5],
            "fqe_s": 3.0,
        }
        for index, (name, text) in enumerate(ope.POLICIES.items())
    }
    entries = list(policies.values())
    summary = ope.summarize(
        [e["true_return"] for e in entries],
        [e["fqe_return"] for e in entries],
        [e["true_costs"] for e in entries],
        [e["fqe_costs"] for e in entries],
        names,
        [10.0],
    )
    results = {
        "dataset": {"n_transitions": 1000},
        "policies": policies,
        "summary": summary,
        "checks": ope.evaluate_targets({"return_spearman": 1.0}, ope.TARGETS),
    }
    config = {
        "env_id": "IB-v0",
        "qualities": list(ope.QUALITIES),
        "trajectories_per_quality": 2,
        "data_seed": 0,
        "cost_names": names,
        "episode_cost_limits": [100.0],
        "discount": 0.99,
        "horizon": 1000,
        "n_true_episodes": 4,
        "n_seeds": 1,
        "n_updates": 100,
        "batch_size": 256,
        "hidden": [64, 64],
        "learning_rate": 1e-4,
        "target_update_period": 100,
        "n_critics": 1,
        "max_grad_norm": 40.0,
        "device": "cpu",
    }
    page = ope.markdown(config, results)
    for name in ope.POLICIES:
        assert f"| {name} |" in page
    assert "Spearman rank correlation: 1.00" in page
    assert "not measured" in page  # the goals without a value
    # distances 0.0 and 0.1 ... 0.6: one policy acts like a behaviour policy, six do not
    assert "of the 1 policies that act like a behaviour policy" in page
    assert "of the 6 policies that act otherwise" in page
    (table,) = ope.report(config, results)
    assert len(table.rows) == len(ope.POLICIES)
