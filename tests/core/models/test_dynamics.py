"""The dynamics ensemble's pure parts: known channels as JAX expressions, the step's
stacked-frame shift, its known and learned channels, the out-of-distribution measure."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.models import (
    DynamicsConfig,
    DynamicsLayout,
    DynamicsParams,
    KnownSignal,
    KnownSignals,
    compile_expression,
    gaussian_nll,
    make_dynamics,
    match_row,
    out_of_distribution,
)
from neorl_industrial.integration.datasets import Expression

SOURCES = [
    "-abs(temperature - 350) - 0.01 * valve",
    "max(temperature - 420, 0, pressure * 2)",
    "min(pressure, 1.5) ** 2 / (1 + exp(-valve / 50))",
    "sqrt(abs(pressure)) + log(1 + temperature) - +valve",
    "(temperature > 420) + 2 * (0.75 <= pressure < 2)",
    "3",
]


@pytest.mark.parametrize("source", SOURCES)
def test_jax_expression_matches_the_logs_numpy_evaluation(source):
    rng = np.random.default_rng(0)
    columns = {
        "temperature": rng.uniform(300, 450, 64),
        "pressure": rng.uniform(0.5, 2.5, 64),
        "valve": rng.uniform(0, 100, 64),
    }
    expected = Expression(source).evaluate(columns, 64)
    function, names = compile_expression(source)
    traced = jax.jit(lambda c: jnp.broadcast_to(function(c), (64,)))(
        {k: jnp.asarray(v, jnp.float32) for k, v in columns.items()}
    )
    np.testing.assert_allclose(traced, expected, rtol=2e-5, atol=1e-4)
    assert names == Expression(source).names


@pytest.mark.parametrize(
    "source, message",
    [
        ("temperature.real", "not allowed"),
        ("temperature == 3", "not allowed"),
        ("__import__('os')", "not allowed"),
        ("abs(1, 2)", "takes one argument"),
        ("max(temperature)", "two or more"),
        ("1 +", "not a valid expression"),
        ("1e400", "larger than a float64"),
        ("x" * 1001, "longer than"),
        ("-" * 150 + "x", "nested"),
    ],
)
def test_expression_outside_the_grammar_is_refused_by_name(source, message):
    with pytest.raises(ValueError, match=message):
        compile_expression(source)


def test_match_row_finds_the_row_the_data_agrees_with():
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(50, 2))
    nxt = rng.normal(size=(50, 2))
    act = rng.uniform(0, 100, size=(50, 1))
    names, actions = ("t", "p"), ("valve",)
    current = -np.abs(obs[:, 0]) - 0.01 * act[:, 0]
    assert match_row("-abs(t) - 0.01 * valve", current, obs, act, nxt, names, actions) == "current"
    following = np.maximum(nxt[:, 1], 0.0)
    assert match_row("max(p, 0)", following, obs, act, nxt, names, actions) == "next"
    # Another column of the log (an alarm flag), or a definition the data does not follow.
    assert match_row("alarm", following, obs, act, nxt, names, actions) is None
    assert match_row("max(p, 1)", following, obs, act, nxt, names, actions) is None
    # A definition reading an action cannot be evaluated on the next row.
    assert match_row("valve", act[:, 0], obs, act, nxt, names, actions, rows=("next",)) is None


def _params(dynamics, obs_size, action_size, key=0, members=3):
    layout = dynamics.layout
    keys = jax.random.split(jax.random.PRNGKey(key), members)
    return DynamicsParams(
        networks=jax.vmap(dynamics.init)(keys),
        obs_mean=jnp.zeros(obs_size),
        obs_std=jnp.ones(obs_size),
        target_mean=jnp.zeros(layout.target_size),
        target_std=jnp.full(layout.target_size, 0.1),
        target_fixed=jnp.zeros(layout.target_size, bool),
        cost_low=jnp.zeros(layout.n_costs),
        obs_low=jnp.full(obs_size, -1.0),
        obs_high=jnp.full(obs_size, 1.0),
        policy_action_low=jnp.full(action_size, -0.5),
        policy_action_high=jnp.full(action_size, 0.5),
        action_low=jnp.zeros(action_size),
        action_high=jnp.full(action_size, 100.0),
    )


def test_step_shifts_stacked_frames_and_computes_known_channels():
    # Observations of 3 frames of 2 features (newest first); reward known on the next row,
    # cost 0 known on the current row (in plant units of the valve), cost 1 learned.
    names = ("t_0", "p_0", "t_1", "p_1", "t_2", "p_2")
    known = KnownSignals(
        signals=(
            KnownSignal("reward", None, "-abs(t_0 - 0.5)", "next"),
            KnownSignal("heat", 0, "max(t_0 - 0.2, 0) + 0.01 * valve", "current"),
        ),
        observation_names=names,
        action_names=("valve",),
    )
    layout = DynamicsLayout(observation_size=6, frame_size=2, action_size=1, n_costs=2, known=known)
    assert layout.target_size == 2 + 0 + 1  # frame change and the learned cost
    dynamics = make_dynamics(DynamicsConfig(hidden=(16,), n_members=3, n_elites=3), layout)
    params = _params(dynamics, 6, 1)
    observation = jnp.asarray([0.3, -0.2, 0.1, 0.0, -0.1, 0.4])
    action = jnp.asarray([0.5])  # 75 % in plant units
    out = jax.jit(dynamics.step)(params, observation, action, jax.random.PRNGKey(3))
    np.testing.assert_allclose(out.next_observation[2:], observation[:4])  # history shifted
    np.testing.assert_allclose(out.reward, -abs(float(out.next_observation[0]) - 0.5), rtol=1e-6)
    np.testing.assert_allclose(out.costs[0], max(0.3 - 0.2, 0) + 0.75, rtol=1e-6)
    assert out.member_std.shape == (2,) and float(jnp.max(out.member_std)) > 0.0
    assert not bool(out.done)
    assert float(out.out_of_distribution) == 0.0
    # A learned cost is never predicted below the data's smallest value of it.
    floored = dynamics.step(
        params.replace(cost_low=jnp.asarray([0.0, 5.0])), observation, action, jax.random.PRNGKey(3)
    )
    assert float(floored.costs[1]) == 5.0 and float(out.costs[1]) < 5.0
    # A chosen member, deterministic: its mean; the same call twice gives the same step.
    first = dynamics.step(params, observation, action, jax.random.PRNGKey(4), 1, True)
    again = dynamics.step(params, observation, action, jax.random.PRNGKey(5), 1, True)
    np.testing.assert_allclose(first.next_observation, again.next_observation)
    single = dynamics.transition(params, observation, action, jax.random.PRNGKey(9), 1, True)
    np.testing.assert_allclose(single[0], first.next_observation, rtol=1e-6)
    other = dynamics.step(params, observation, action, jax.random.PRNGKey(4), 2, True)
    assert not np.allclose(other.next_observation[:2], first.next_observation[:2])


def test_a_prediction_outside_physics_is_clipped_onto_it_and_reported():
    # One feature, a learned reward and a learned 0/1 alarm; the networks' output shifted so
    # that the level falls 3 units a step from 0.5, below its physical floor of 0.
    layout = DynamicsLayout(observation_size=1, frame_size=1, action_size=1, n_costs=1)
    dynamics = make_dynamics(DynamicsConfig(hidden=(8,), n_members=2, n_elites=2), layout)
    params = _params(dynamics, 1, 1, members=2).replace(
        target_mean=jnp.asarray([-3.0, 50.0, 7.0]), target_std=jnp.full(3, 1e-3)
    )
    observation, action = jnp.asarray([0.5]), jnp.asarray([0.0])
    free = dynamics.step(params, observation, action, jax.random.PRNGKey(0), 0, True)
    assert float(free.next_observation[0]) < -2.0 and float(free.outside_physics) == 0.0
    bounded = params.replace(
        frame_low=jnp.asarray([0.0]),
        frame_high=jnp.asarray([3.2]),
        cost_high=jnp.asarray([1.0]),
        reward_low=jnp.asarray(-2.0),
        reward_high=jnp.asarray(0.0),
    )
    out = dynamics.step(bounded, observation, action, jax.random.PRNGKey(0), 0, True)
    assert float(out.next_observation[0]) == 0.0  # on the floor, not below it
    # How far it left, in the feature's spread (obs_std 1): about 2.5 below the floor.
    assert 2.0 < float(out.outside_physics) < 3.0
    assert float(out.reward) == 0.0 and float(out.costs[0]) == 1.0  # the data's range
    checked = dynamics.checked_transition(bounded, observation, action, None, 0, True)
    np.testing.assert_allclose(checked[0], out.next_observation)
    np.testing.assert_allclose(checked[4], out.outside_physics, rtol=1e-6)


def test_given_features_take_the_logged_frame_in_the_reward_and_the_next_step():
    # Two features: a level the valve moves and a feed temperature no action moves
    # (given); the reward reads both on the next row.
    names = ("level", "feed")
    known = KnownSignals(
        signals=(KnownSignal("reward", None, "-abs(level - feed)", "next"),),
        observation_names=names,
        action_names=("valve",),
    )
    layout = DynamicsLayout(
        observation_size=2, frame_size=2, action_size=1, n_costs=0, known=known, given=(1,)
    )
    assert layout.given_mask().tolist() == [False, True]
    dynamics = make_dynamics(DynamicsConfig(hidden=(8,), n_members=3, n_elites=3), layout)
    # The feed is predicted far below its physical floor of 0; the log says 0.7.
    params = _params(dynamics, 2, 1).replace(
        target_mean=jnp.asarray([0.1, -5.0]),
        target_std=jnp.full(2, 1e-3),
        frame_low=jnp.zeros(2),
        frame_high=jnp.full(2, 10.0),
    )
    observation, action, logged = (
        jnp.asarray([0.5, 0.6]),
        jnp.asarray([0.0]),
        jnp.asarray([9.0, 0.7]),
    )
    free = dynamics.step(params, observation, action, jax.random.PRNGKey(0), 0, True)
    assert float(free.next_observation[1]) == 0.0 and float(free.outside_physics) > 4.0
    out = dynamics.step(params, observation, action, jax.random.PRNGKey(0), 0, True, logged)
    # The given feature is the log's; the level is still the model's (not the log's 9).
    np.testing.assert_allclose(out.next_observation, [float(free.next_observation[0]), 0.7])
    np.testing.assert_allclose(out.reward, -abs(float(out.next_observation[0]) - 0.7), rtol=1e-6)
    # Neither charged as outside physics nor counted in the members' disagreement.
    assert float(out.outside_physics) == 0.0 and float(out.member_std[1]) == 0.0
    checked = dynamics.checked_transition(params, observation, action, None, 0, True, logged)
    np.testing.assert_allclose(checked[0], out.next_observation)
    assert float(checked[4]) == 0.0
    # Without a layout's given features a logged frame changes nothing.
    plain = dataclasses.replace(layout, given=())
    same = make_dynamics(dynamics.config, plain).step(
        params, observation, action, jax.random.PRNGKey(0), 0, True, logged
    )
    np.testing.assert_allclose(same.next_observation, free.next_observation)
    with pytest.raises(ValueError, match="given features \\(2,\\)"):
        DynamicsLayout(observation_size=2, frame_size=2, action_size=1, n_costs=0, given=(2,))


def test_step_vmaps_over_members_and_starts():
    layout = DynamicsLayout(observation_size=2, frame_size=2, action_size=1, n_costs=0)
    dynamics = make_dynamics(DynamicsConfig(hidden=(8,), n_members=3, n_elites=2), layout)
    params = _params(dynamics, 2, 1)
    starts = jnp.zeros((5, 2))
    actions = jnp.zeros((5, 1))
    program = jax.vmap(  # members × starts
        jax.vmap(dynamics.step, in_axes=(None, 0, 0, None, None)),
        in_axes=(None, None, None, None, 0),
    )
    out = program(params, starts, actions, jax.random.PRNGKey(0), jnp.arange(3))
    assert out.next_observation.shape == (3, 5, 2)
    assert out.costs.shape == (3, 5, 0) and out.reward.shape == (3, 5)


def test_out_of_distribution_measures_the_excess_in_spreads():
    layout = DynamicsLayout(observation_size=2, frame_size=2, action_size=1, n_costs=0)
    dynamics = make_dynamics(DynamicsConfig(hidden=(8,), n_members=2, n_elites=2), layout)
    params = _params(dynamics, 2, 1)
    inside = out_of_distribution(params, jnp.asarray([0.5, -1.0]), jnp.asarray([0.5]))
    assert float(inside) == 0.0
    far = out_of_distribution(params, jnp.asarray([3.0, 0.0]), jnp.asarray([0.0]))
    assert float(far) == pytest.approx(2.0)
    action = out_of_distribution(params, jnp.asarray([0.0, 0.0]), jnp.asarray([0.9]))
    assert float(action) == pytest.approx(0.4)
    # Counting the first feature only (a stacked observation's newest frame): the second's
    # excess is not charged again.
    older = out_of_distribution(params, jnp.asarray([0.5, 9.0]), jnp.asarray([0.0]), 1)
    assert float(older) == 0.0
    newest = out_of_distribution(params, jnp.asarray([3.0, 9.0]), jnp.asarray([0.0]), 1)
    assert float(newest) == pytest.approx(2.0)


def test_gaussian_nll_is_the_normal_log_density():
    mean, log_std, target = jnp.asarray(0.3), jnp.asarray(math.log(2.0)), jnp.asarray(1.5)
    expected = 0.5 * ((1.5 - 0.3) / 2.0) ** 2 + math.log(2.0) + 0.5 * math.log(2 * math.pi)
    assert float(gaussian_nll(mean, log_std, target)) == pytest.approx(expected, rel=1e-6)


def test_config_refuses_bad_values_by_name():
    with pytest.raises(ValueError, match="n_elites"):
        DynamicsConfig(n_members=3, n_elites=4)
    with pytest.raises(ValueError, match="activation"):
        DynamicsConfig(activation="sigmoid")
    with pytest.raises(ValueError, match="frame_size"):
        DynamicsLayout(observation_size=5, frame_size=2, action_size=1, n_costs=0)


def test_targets_constant_in_the_data_are_held_not_learned():
    # A fixed setpoint (feature 1) never changes in the data: its change is held at the
    # data's mean (0), sampled or not, and the loss ignores it.
    layout = DynamicsLayout(observation_size=2, frame_size=2, action_size=1, n_costs=0)
    dynamics = make_dynamics(DynamicsConfig(hidden=(8,), n_members=2, n_elites=2), layout)
    params = _params(dynamics, 2, 1).replace(target_fixed=jnp.asarray([False, True, False]))
    observation = jnp.asarray([0.2, 7.5])
    for key in range(3):
        out = dynamics.step(params, observation, jnp.asarray([0.1]), jax.random.PRNGKey(key))
        assert float(out.next_observation[1]) == 7.5 and float(out.member_std[1]) == 0.0
        assert float(out.next_observation[0]) != 0.2
    from neorl_industrial.core.models import ModelBatch

    networks = jax.tree.map(lambda leaf: leaf[0], params.networks)
    batch = ModelBatch(
        observations=jnp.zeros((4, 2)),
        actions=jnp.zeros((4, 1)),
        targets=jnp.zeros((4, 3)).at[:, 1].set(1e6),  # wild, but not learned
        terminals=jnp.zeros(4, bool),
    )
    loss, metrics = dynamics.loss(
        networks, params.replace(target_fixed=jnp.asarray([0, 1, 1], bool)), batch
    )
    held, _ = dynamics.loss(
        networks,
        params.replace(target_fixed=jnp.asarray([0, 1, 1], bool)),
        batch._replace(targets=jnp.zeros((4, 3))),
    )
    assert float(loss) == pytest.approx(float(held)) and float(metrics["mse"]) < 1e3


def test_a_window_loss_rolls_the_member_forward_on_its_own_predictions():
    # Stacked frames (3 of 2 features), a learned cost: the first step of a window is the
    # one-step loss; the second starts from the member's mean prediction (history
    # shifted) and is scored against the logged next frame; steps past the episode's end
    # weigh nothing.
    from neorl_industrial.core.models import ModelBatch

    layout = DynamicsLayout(observation_size=6, frame_size=2, action_size=1, n_costs=1)
    dynamics = make_dynamics(DynamicsConfig(hidden=(16,), n_members=2, n_elites=2), layout)
    params = _params(dynamics, 6, 1)
    networks = jax.tree.map(lambda leaf: leaf[1], params.networks)
    rng = np.random.default_rng(0)
    size = layout.target_size  # the frame's change, the learned reward and cost
    batch = ModelBatch(
        observations=jnp.asarray(rng.normal(size=(4, 2, 6)), jnp.float32),
        actions=jnp.asarray(rng.uniform(-1, 1, size=(4, 2, 1)), jnp.float32),
        targets=jnp.asarray(0.1 * rng.normal(size=(4, 2, size)), jnp.float32),
        terminals=jnp.zeros((4, 2), bool),
    )
    both = jnp.ones((4, 2), bool)
    first = jax.tree.map(lambda x: x[:, 0], batch)
    first_only = jnp.asarray([[True, False]] * 4)
    one_window, one_metrics = dynamics.window_loss(networks, params, batch, first_only)
    one_step, metrics = dynamics.loss(networks, params, first)
    assert float(one_window) == pytest.approx(float(one_step), rel=1e-5)
    assert float(one_metrics["mse"]) == pytest.approx(float(metrics["mse"]), rel=1e-5)

    # By hand: the second step's input is the member's mean prediction of the first.
    followed = jax.vmap(
        lambda o, a: dynamics.transition(params, o, a, jax.random.PRNGKey(0), 1, True)[0]
    )(first.observations, first.actions)
    logged_next = batch.observations[:, 1, :2] + batch.targets[:, 1, :2]
    second_targets = jnp.concatenate(
        [logged_next - followed[:, :2], batch.targets[:, 1, 2:]], axis=-1
    )
    second = ModelBatch(followed, batch.actions[:, 1], second_targets, batch.terminals[:, 1])
    two_step, _ = dynamics.loss(networks, params, second)
    window, _ = dynamics.window_loss(networks, params, batch, both)
    assert float(window) == pytest.approx((float(one_step) + float(two_step)) / 2, rel=1e-5)
    np.testing.assert_allclose(followed[:, 2:], first.observations[:, :4])  # history shifted

    # Past its episode's end a step counts for nothing, whatever it holds.
    cut = both.at[0, 1].set(False)
    wild = batch._replace(targets=batch.targets.at[0, 1].set(1e6))
    assert float(dynamics.window_loss(networks, params, wild, cut)[0]) == pytest.approx(
        float(dynamics.window_loss(networks, params, batch, cut)[0]), rel=1e-6
    )
    # The gradient reaches the network through every step.
    grads = jax.grad(lambda n: dynamics.window_loss(n, params, batch, both)[0])(networks)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
