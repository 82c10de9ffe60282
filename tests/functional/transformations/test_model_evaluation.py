"""Model-based evaluation as one program over policies × members × starts: its shapes, the
same numbers as a plain loop over policies, the shield in the loop, pessimism that lowers
a policy leaving the data, and the logged replay on the same noise."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.models import DynamicsConfig, DynamicsLayout, make_dynamics
from neorl_industrial.core.safety import ConstraintSpec
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.dynamics import data_statistics
from neorl_industrial.functional.transformations.model_evaluation import (
    ModelRolloutOptions,
    make_logged_replay,
    make_policy_rollouts,
)

HORIZON = 12
MEMBERS = 3


def linear_dataset(episodes: int, steps: int, seed: int) -> Dataset:
    """``x' = 0.9 x + 0.3 u + noise`` (two features), actions in [-0.5, 0.5] only; reward
    ``-|x_0|``, one cost ``max(x_1 - 1, 0)``."""
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(episodes):
        x = rng.normal(size=2)
        xs, us = [x], []
        for _ in range(steps):
            u = rng.uniform(-0.5, 0.5, size=1)
            x = 0.9 * x + 0.3 * u + 0.05 * rng.normal(size=2)
            xs.append(x)
            us.append(u)
        xs = np.asarray(xs, np.float32)
        data.append(
            {
                "observations": xs,
                "actions": np.asarray(us, np.float32),
                "rewards": -np.abs(xs[:-1, 0]),
                "costs": np.maximum(xs[1:, 1:2] - 1.0, 0.0),
            }
        )
    return Dataset.from_episodes(data)


def act(params, observation, key=None, deterministic=True):
    """A linear policy in [-1, 1]: ``clip(gain x_0 + bias)``."""
    del key, deterministic
    return jnp.clip(params["gain"] * observation[:1] + params["bias"], -1.0, 1.0)


@pytest.fixture(scope="module")
def model():
    data = linear_dataset(8, 20, 0)
    layout = DynamicsLayout(observation_size=2, frame_size=2, action_size=1, n_costs=1)
    dynamics = make_dynamics(
        DynamicsConfig(hidden=(16,), n_members=MEMBERS, n_elites=MEMBERS), layout
    )
    stats = data_statistics(data, dynamics, [-1.0], [1.0])
    keys = jax.random.split(jax.random.PRNGKey(0), MEMBERS)
    params = stats.replace(networks=jax.vmap(dynamics.init)(keys))
    starts = data.initial_observations()
    return dynamics, params, data, starts


POLICIES = {"gain": jnp.asarray([[-0.5], [0.0], [0.3]]), "bias": jnp.asarray([[0.0], [0.2], [1.0]])}


@pytest.fixture(scope="module")
def rolled(model):
    dynamics, params, _, starts = model
    lengths = jnp.asarray([HORIZON, 5, 1, HORIZON, 7, HORIZON, HORIZON, 3], jnp.int32)
    program = jax.jit(
        make_policy_rollouts(dynamics, act, horizon=HORIZON, discount=0.9, close_after=4)
    )
    sums = program(POLICIES, params, starts, lengths, jax.random.PRNGKey(1))
    return program, lengths, jax.device_get(sums)


def test_one_program_over_policies_members_and_starts(rolled):
    _, lengths, sums = rolled
    assert sums.discounted_return.shape == (3, MEMBERS, 8)
    assert sums.discounted_costs.shape == (3, MEMBERS, 8, 1)
    assert sums.closing_observation.shape == (3, MEMBERS, 8, 2)
    # Each start counts its own length (no terminal states in this data).
    np.testing.assert_array_equal(sums.steps[0, 0], np.asarray(lengths))
    # A start followed for one step has discounted = undiscounted = its first reward.
    np.testing.assert_allclose(sums.discounted_return[..., 2], sums.total_return[..., 2])
    # The closing weight is γ^k for starts followed at least k = 4 steps, 0 otherwise.
    expected = np.where(np.asarray(lengths) >= 4, 0.9**4, 0.0)
    np.testing.assert_allclose(sums.closing_weight[1, 2], expected, rtol=1e-6)
    assert np.all(np.isfinite(sums.discounted_return))


def test_the_vmapped_program_equals_a_loop_over_policies(model, rolled):
    _, params, _, starts = model
    program, lengths, sums = rolled
    for p in range(3):
        one = jax.tree.map(lambda leaf, p=p: leaf[p : p + 1], POLICIES)
        alone = jax.device_get(program(one, params, starts, lengths, jax.random.PRNGKey(1)))
        np.testing.assert_allclose(
            alone.discounted_return[0], sums.discounted_return[p], rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            alone.total_uncertainty[0], sums.total_uncertainty[p], rtol=1e-5, atol=1e-5
        )


def test_a_policy_leaving_the_data_carries_more_uncertainty(model, rolled):
    _, _, sums = rolled
    # Policy 2 pushes the action to 1 (the data's actions lie in [-0.5, 0.5]).
    assert sums.outside_data_steps[2].sum() == sums.steps[2].sum()
    assert sums.outside_data_steps[0].sum() < sums.outside_data_steps[2].sum()
    per_step = sums.total_uncertainty / np.maximum(sums.steps, 1)
    assert per_step[2].mean() > per_step[0].mean() + 0.5  # at least the action's excess


def test_the_shield_acts_inside_the_rollout(model):
    dynamics, params, _, starts = model
    spec = ConstraintSpec.from_dict({"action_bounds": {"u": [-0.1, 0.1]}})
    constraints = spec.compile(2, 1, ("x0", "x1"), ("u",))
    lengths = jnp.full((8,), HORIZON, jnp.int32)
    shielded = make_policy_rollouts(
        dynamics, act, horizon=HORIZON, discount=0.9, constraints=constraints
    )
    sums = jax.device_get(
        jax.jit(shielded)(POLICIES, params, starts, lengths, jax.random.PRNGKey(1))
    )
    # The bias-1 policy is overridden at every step, and then stays inside the data.
    assert sums.overridden_steps[2].sum() == sums.steps[2].sum()
    assert sums.outside_data_steps[2].sum() < sums.steps[2].sum()


def test_the_logged_replay_shares_the_noise_of_the_policies(model):
    dynamics, params, _, starts = model
    lengths = jnp.full((8,), HORIZON, jnp.int32)
    replay = jax.jit(make_logged_replay(dynamics, horizon=HORIZON, discount=0.9))
    logged = jnp.full((8, HORIZON, 1), 0.2, jnp.float32)
    replayed = jax.device_get(replay(params, starts, logged, lengths, jax.random.PRNGKey(1)))
    assert replayed.discounted_return.shape == (MEMBERS, 8)
    assert replayed.overridden_steps.sum() == 0
    # A policy that always proposes the logged action follows the same trajectories:
    # member m from start n draws the same noise in both programs.
    rollouts = make_policy_rollouts(dynamics, _constant_act, horizon=HORIZON, discount=0.9)
    constant = jnp.full((1, 1), 0.2, jnp.float32)
    sums = jax.device_get(
        jax.jit(rollouts)(constant, params, starts, lengths, jax.random.PRNGKey(1))
    )
    np.testing.assert_allclose(
        sums.discounted_return[0], replayed.discounted_return, rtol=1e-6, atol=1e-6
    )
    np.testing.assert_allclose(sums.total_costs[0], replayed.total_costs, rtol=1e-6, atol=1e-6)


def _constant_act(params, observation, key=None, deterministic=True):
    del observation, key, deterministic
    return params


def test_disagreement_measured_every_few_steps_counts_the_same_steps(model, rolled):
    dynamics, params, _, starts = model
    _, lengths, every_step = rolled
    program = jax.jit(
        make_policy_rollouts(
            dynamics, act, horizon=HORIZON, discount=0.9, close_after=4, disagreement_every=5
        )
    )
    sums = jax.device_get(program(POLICIES, params, starts, lengths, jax.random.PRNGKey(1)))
    # 12 steps in blocks of 5 (padded to 15): the same steps counted, the same closing
    # weights, a held disagreement of the same size as one measured every step.
    np.testing.assert_array_equal(sums.steps, every_step.steps)
    np.testing.assert_allclose(sums.closing_weight, every_step.closing_weight)
    ratio = sums.total_uncertainty.sum() / every_step.total_uncertainty.sum()
    assert 0.5 < ratio < 2.0


def test_no_step_counts_a_reward_above_the_cap(model, rolled):
    dynamics, params, _, starts = model
    _, lengths, uncapped = rolled
    cap = float(np.median(uncapped.total_return / np.maximum(uncapped.steps, 1)))
    program = jax.jit(
        make_policy_rollouts(
            dynamics, act, horizon=HORIZON, discount=0.9, close_after=4, reward_cap=cap
        )
    )
    capped = jax.device_get(program(POLICIES, params, starts, lengths, jax.random.PRNGKey(1)))
    assert np.all(capped.total_return <= cap * capped.steps + 1e-4)
    assert np.all(capped.total_return <= uncapped.total_return + 1e-4)
    assert np.any(capped.total_return < uncapped.total_return - 1e-4)


def test_steps_far_outside_the_data_are_summed_apart(model, rolled):
    dynamics, params, _, starts = model
    _, lengths, plain = rolled
    options = ModelRolloutOptions(horizon=HORIZON, discount=0.9, close_after=4, far_outside=0.0)
    program = jax.jit(make_policy_rollouts(dynamics, act, options))
    sums = jax.device_get(program(POLICIES, params, starts, lengths, jax.random.PRNGKey(1)))
    # The same rollouts (the threshold only sorts the steps)...
    np.testing.assert_allclose(sums.discounted_return, plain.discounted_return, rtol=1e-6)
    assert np.all(plain.far_weight == 0.0) and np.all(plain.far_return == 0.0)
    # ...and at a threshold of 0 every step outside the data is far: a rollout that never
    # left the data has no far weight, one that left it has some, never more than all of
    # its steps' discounted weight.
    inside = sums.outside_data_steps == 0
    assert np.all(sums.far_weight[inside] == 0.0)
    assert np.all(sums.far_weight[~inside] > 0.0) and (~inside).any()
    all_steps = (1.0 - 0.9 ** sums.steps.astype(np.float64)) / (1.0 - 0.9)
    assert np.all(sums.far_weight <= all_steps + 1e-5)
    # The far return is the return of those steps: the whole return where every step was.
    every = sums.outside_data_steps == sums.steps
    np.testing.assert_allclose(
        sums.far_return[every], sums.discounted_return[every], rtol=1e-5, atol=1e-5
    )


def test_given_features_follow_the_log_step_by_step(model, rolled):
    # x_1 marked given (exogenous): the same networks, each start's logged next frames.
    dynamics, params, _, starts = model
    _, lengths, plain = rolled
    layout = dataclasses.replace(dynamics.layout, given=(1,))
    given_dynamics = make_dynamics(dynamics.config, layout)
    logged = jnp.asarray(np.random.default_rng(5).uniform(-0.5, 0.5, (8, HORIZON, 2)), jnp.float32)
    program = jax.jit(
        make_policy_rollouts(given_dynamics, act, horizon=HORIZON, discount=0.9, close_after=4)
    )
    sums = jax.device_get(program(POLICIES, params, starts, lengths, jax.random.PRNGKey(1), logged))
    # After k = 4 steps the given feature is the 4th logged frame's, in every policy and
    # member; the other feature is the model's (not the log's).
    reached = np.asarray(lengths) >= 4
    closing = sums.closing_observation[:, :, reached]
    np.testing.assert_allclose(
        closing[..., 1], np.broadcast_to(np.asarray(logged)[reached, 3, 1], closing.shape[:-1])
    )
    assert not np.allclose(closing[..., 0], np.asarray(logged)[reached, 3, 0])
    # The members cannot disagree on what the log gives: the measured disagreement is
    # that of the predicted feature alone (the uncertainty differs from the plain run).
    assert not np.allclose(sums.total_uncertainty, plain.total_uncertainty)
    # Without logged frames the program is the plain one.
    again = jax.device_get(program(POLICIES, params, starts, lengths, jax.random.PRNGKey(1)))
    np.testing.assert_allclose(again.discounted_return, plain.discounted_return, rtol=1e-6)


def test_offsets_are_added_to_the_policy_s_action_step_by_step(model):
    # A constant policy plus offsets of 0.2 is the constant policy 0.2 higher; an offset
    # that would push the action past 1 is clipped onto it.
    dynamics, params, _, starts = model
    lengths = jnp.full((8,), HORIZON, jnp.int32)
    program = jax.jit(make_policy_rollouts(dynamics, act, horizon=HORIZON, discount=0.9))
    key = jax.random.PRNGKey(2)
    zero = {"gain": jnp.zeros((1, 1)), "bias": jnp.zeros((1, 1))}
    shifted = {"gain": jnp.zeros((1, 1)), "bias": jnp.full((1, 1), 0.2)}
    offsets = jnp.full((8, HORIZON, 1), 0.2)
    added = jax.device_get(program(zero, params, starts, lengths, key, None, offsets))
    direct = jax.device_get(program(shifted, params, starts, lengths, key))
    np.testing.assert_allclose(added.discounted_return, direct.discounted_return, rtol=1e-6)
    full = {"gain": jnp.zeros((1, 1)), "bias": jnp.ones((1, 1))}
    clipped = jax.device_get(program(full, params, starts, lengths, key, None, offsets))
    at_one = jax.device_get(program(full, params, starts, lengths, key))
    np.testing.assert_allclose(clipped.discounted_return, at_one.discounted_return, rtol=1e-6)
    # Offsets that change along the steps reach the rollout (not only their first step).
    late = jnp.zeros((8, HORIZON, 1)).at[:, 5:].set(0.5)
    moved = jax.device_get(program(zero, params, starts, lengths, key, None, late))
    still = jax.device_get(program(zero, params, starts, lengths, key))
    assert not np.allclose(moved.discounted_return, still.discounted_return)
