"""MOPO and MOPO-Lag on a plant model fitted to a plant log with no simulator: training is
finite and lowers the critics' loss, the penalty grows with the members' predicted
spread, rollouts keep the shield's bounds, MOPO-Lag's multiplier rises over a cost limit;
and every agent's ``weight_init`` changes its initial weights."""

from __future__ import annotations

import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from neorl_industrial.core.agents import SACConfig, make_sac
from neorl_industrial.core.agents.mopo import mixed_batch, uncertainty_penalty
from neorl_industrial.core.agents.registry import ALGORITHMS, build_algorithm
from neorl_industrial.core.models import DynamicsConfig
from neorl_industrial.core.safety.spec import ConstraintSpec
from neorl_industrial.functional.transformations.model_rollouts import make_model_rollouts
from neorl_industrial.functional.transformations.offline import Schedule
from neorl_industrial.integration.datasets import load_any
from neorl_industrial.wrappers.models import FitSettings, PlantModel
from neorl_industrial.wrappers.training.model_based import (
    build_model_based,
    model_handle,
    train_model_based,
)

SCHEMA = """\
name: heater-3
timestamp: time
sampling_period: 60
observations:
  - {column: temperature, unit: degC, bounds: [0, 500]}
  - {column: pressure, unit: bar}
actions:
  - {column: valve, unit: "%", bounds: [0, 100]}
reward: -abs(temperature - 350) - 0.01 * valve
costs:
  - {name: overheating, expression: "max(temperature - 365, 0)", limit: 5.0}
"""
SMALL = {"hidden": [16, 16], "rollout_starts": 8, "rollout_horizon": 3, "buffer_size": 512}
TRAINING = {"schedule": Schedule(n_updates=200, chunk_updates=100, batch_size=32)}


def write_log(path, episodes: int, steps: int, seed: int = 0):
    """A heater under a noisy operator, ``T' = 0.8 T + 0.2 (300 + valve) + noise``,
    overheating now and then; episodes separated by an hour's gap."""
    rng = np.random.default_rng(seed)
    seconds, temperature, pressure, valve = [], [], [], []
    stamp = 0
    for _ in range(episodes):
        t = rng.uniform(330, 375)
        for _ in range(steps + 1):
            v = float(np.clip(50 + 0.8 * (350 - t) + rng.normal(0, 8), 0, 100))
            seconds.append(stamp)
            temperature.append(t)
            pressure.append(1.0 + 0.01 * t + rng.normal(0, 0.01))
            valve.append(v)
            t = 0.8 * t + 0.2 * (300 + v) + rng.normal(0, 0.5)
            stamp += 60
        stamp += 3600
    start = np.datetime64("2024-03-01T00:00:00", "s")
    table = pa.table(
        {
            "time": pa.array(start + np.asarray(seconds)),
            "temperature": temperature,
            "pressure": pressure,
            "valve": valve,
        }
    )
    pcsv.write_csv(table, path)
    return path


@pytest.fixture(scope="module")
def plant(tmp_path_factory):
    """A plant log (no simulator), its dataset and a small fitted plant model."""
    root = tmp_path_factory.mktemp("heater")
    log = write_log(root / "heater.csv", episodes=12, steps=30)
    schema = root / "schema.yaml"
    schema.write_text(textwrap.dedent(SCHEMA))
    dataset, card = load_any(log, schema=schema)
    task = card.task(dataset)
    assert not task.has_simulator
    model = PlantModel(task, DynamicsConfig(hidden=(16, 16), n_members=3, n_elites=2))
    model.fit(
        dataset,
        FitSettings(max_updates=200, chunk_updates=100, batch_size=64, horizon=8, windows=8),
    )
    return dataset, model


@pytest.fixture(scope="module")
def trained(plant):
    dataset, model = plant
    return train_model_based("mopo", dataset, model, hyperparameters=SMALL, **TRAINING)


@pytest.fixture(scope="module")
def trained_lag(plant):
    dataset, model = plant
    hyperparameters = {**SMALL, "cost_limits": [0.0]}
    return train_model_based(
        "mopo-lag", dataset, model, hyperparameters=hyperparameters, **TRAINING
    )


def test_mopo_trains_on_a_plant_log_finite_and_lowering_its_critic_loss(plant, trained):
    dataset, _ = plant
    algorithm, config, state, history = trained
    assert config.real_ratio == 0.05 and config.penalty_coef == 1.0
    for entry in history:
        for name, value in entry["metrics"].items():
            assert np.all(np.isfinite(value)), name
    first, last = history[0]["metrics"], history[-1]["metrics"]
    assert float(last["critic_loss"][0]) < float(first["critic_loss"][0])
    assert float(first["model_penalty"][0]) > 0.0
    assert int(state.agent.buffer.size[0]) == 512  # 200 updates x 24 transitions, the newest
    policy = jax.tree.map(lambda leaf: leaf[0], state.agent.policy)
    actions = algorithm.act(policy, jnp.asarray(dataset.observations[:5]), deterministic=True)
    assert actions.shape == (5, 1) and bool(jnp.all(jnp.abs(actions) <= 1.0))


def test_the_penalty_grows_with_the_members_predicted_spread(plant):
    _, model = plant
    params = model.params(0)
    observation = jnp.asarray([355.0, 4.55])
    action = jnp.asarray([0.1])
    target_size = model.dynamics.layout.target_size

    def penalty(shifts):
        """The penalty with member ``m``'s predicted log-std outputs moved by ``shifts[m]``."""

        def move(path, leaf):
            if jax.tree_util.keystr(path).endswith("['head']['bias']"):
                return leaf.at[:, target_size : 2 * target_size].add(jnp.asarray(shifts)[:, None])
            return leaf

        networks = jax.tree_util.tree_map_with_path(move, params.networks)
        moved = params.replace(networks=networks)
        return float(uncertainty_penalty(model.dynamics, moved, observation, action))

    narrow = penalty([-3.0, -3.0])
    one_wider = penalty([-3.0, -1.0])  # one member predicts a wider spread
    assert narrow > 0.0 and one_wider > 3.0 * narrow
    assert penalty([-1.0, -3.0]) > 3.0 * narrow  # the largest over the members counts


def test_rollouts_keep_the_shields_bounds_and_penalize_rewards(plant):
    _, model = plant
    task = model.task
    spec = ConstraintSpec.from_dict({"name": "narrow", "action_bounds": {"valve": [0, 40]}})
    params = model.params(0)
    statistics = {"obs_mean": params.obs_mean.tolist(), "obs_std": params.obs_std.tolist()}
    algorithm, _ = build_algorithm("mopo", 2, 1, {"hidden": [16], **statistics})
    policy = algorithm.init(jax.random.PRNGKey(3)).policy
    starts = jnp.broadcast_to(params.obs_mean, (64, 2))

    def plant_valve(transitions):
        return np.asarray(model.scaler.unscale(transitions.actions))[..., 0]

    def rollouts(handle, penalty_coef=1.0):
        program = make_model_rollouts(
            handle, algorithm.act, horizon=4, penalty_coef=penalty_coef, discount=0.99
        )
        return program(policy, starts, jax.random.PRNGKey(0))

    free = rollouts(model_handle(model, shielded=False))
    shielded = rollouts(model_handle(model, constraints=task.compile_constraints(spec)))
    assert free.actions.shape == (64, 4, 1)
    assert plant_valve(free).max() > 45.0  # the policy proposes more than the shield allows
    assert plant_valve(shielded).max() <= 40.0 + 1e-3
    assert bool(jnp.any(shielded.overridden)) and not bool(jnp.any(free.overridden))
    unpenalized = rollouts(model_handle(model, shielded=False), penalty_coef=0.0)
    gap = np.asarray(unpenalized.rewards - free.rewards)
    np.testing.assert_allclose(gap, np.asarray(free.penalties), rtol=1e-4, atol=1e-4)


def test_mopo_bc_clones_the_logged_actions_where_its_q_term_is_small(plant):
    """MOPO-BC's actor takes TD3+BC's step on the real batch: with a tiny ``alpha`` it
    clones the logged actions, its critics still trained on the model's rollouts."""
    dataset, model = plant
    hyperparameters = {**SMALL, "alpha": 1e-3}
    algorithm, config, state, history = train_model_based(
        "mopo-bc", dataset, model, hyperparameters=hyperparameters, **TRAINING
    )
    assert config.real_ratio == 0.05 and config.discount == 0.99
    assert float(history[0]["metrics"]["model_penalty"][0]) > 0.0
    assert np.isfinite(np.asarray(history[-1]["metrics"]["critic_loss"])).all()
    observations = dataset.transition_observations()
    logged = model.scaler.scale(jnp.asarray(dataset.actions))
    fresh = algorithm.init(jax.random.PRNGKey(0)).policy
    trained = jax.tree.map(lambda leaf: leaf[0], state.agent.policy)

    def error(policy):
        actions = algorithm.act(policy, observations, deterministic=True)
        return float(jnp.mean(jnp.square(actions - logged)))

    assert error(trained) < 0.5 * error(fresh)


def test_mopo_lag_multiplier_rises_when_model_costs_exceed_the_limit(trained_lag):
    _, config, state, history = trained_lag
    assert config.cost_limits == (0.0,)
    assert float(history[0]["metrics"]["model_cost"][0]) > 0.0
    multiplier = float(state.agent.learner.lagrangian.multiplier[0, 0])
    assert multiplier > 0.0


def test_a_model_based_agent_needs_a_fitting_model(plant):
    _, model = plant
    algorithm, _ = build_algorithm("mopo", 2, 1, {"hidden": [8]})
    state = algorithm.init(jax.random.PRNGKey(0))  # a template: it can act, not train
    with pytest.raises(ValueError, match="training needs a fitted plant model"):
        algorithm.update(state, None, jax.random.PRNGKey(1))
    with pytest.raises(ValueError, match="predicts observations of 2 and actions of 1"):
        build_model_based("mopo", 3, 1, {"hidden": [8]}, model_handle(model))
    with pytest.raises(ValueError, match="not model-based"):
        build_model_based("td3bc", 2, 1, {"hidden": [8]}, model_handle(model))


def _first_layer(params) -> tuple[np.ndarray, np.ndarray]:
    """The kernel and bias of the first layer the initialization shaped."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    kernels = [leaf for path, leaf in flat if "kernel" in jax.tree_util.keystr(path)]
    biases = [leaf for path, leaf in flat if "bias" in jax.tree_util.keystr(path)]
    return np.asarray(kernels[0]), np.asarray(biases[0])


@pytest.mark.parametrize("name", [*sorted(ALGORITHMS), "sac"])
def test_weight_init_changes_every_agents_initial_weights(plant, name):
    _, model = plant
    states = {}
    for weight_init in ("lecun", "uniform"):
        values = {"hidden": [64], "weight_init": weight_init}
        if name == "sac":
            algorithm = make_sac(SACConfig.create(**values), 2, 1)
        elif ALGORITHMS[name].model_based:
            algorithm, _ = build_model_based(name, 2, 1, values, model_handle(model))
        else:
            action_size = 27 if ALGORITHMS[name].discrete else 1
            algorithm, _ = build_algorithm(name, 2, action_size, values)
        states[weight_init] = algorithm.init(jax.random.PRNGKey(0))
    lecun = _first_layer(states["lecun"].policy.actor)
    uniform = _first_layer(states["uniform"].policy.actor)
    assert not np.any(lecun[1]) and np.any(uniform[1])  # zero biases against drawn ones
    bound = 1.0 / np.sqrt(lecun[0].shape[-2])  # 1 / sqrt(fan_in)
    assert np.abs(uniform[0]).max() <= bound + 1e-6 and np.abs(uniform[1]).max() <= bound + 1e-6
    # PyTorch's weights have a third of LeCun's variance: a spread ratio near 0.58.
    assert 0.4 < uniform[0].std() / lecun[0].std() < 0.75
    learner = getattr(states["uniform"], "learner", states["uniform"])
    networks = {part: getattr(learner, part, None) for part in ("critic", "value")}
    if hasattr(learner, "cost_critics"):
        networks["cost_critics"] = learner.cost_critics.critic
    for part, params in networks.items():
        if params is not None:
            assert all(np.any(bias) for bias in _biases(params)), part


def _biases(params) -> list[np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return [np.asarray(leaf) for path, leaf in flat if "bias" in jax.tree_util.keystr(path)]


def test_a_mixed_batch_takes_the_real_ratio_from_the_real_batch(trained):
    _, _, state, _ = trained
    buffer = jax.tree.map(lambda leaf: leaf[0], state.agent.buffer)
    real = buffer.sample(jax.random.PRNGKey(0), 40)
    real = real.replace(rewards=jnp.full((40,), 1e6))  # marks the real rows
    mixed = mixed_batch(real, buffer, jax.random.PRNGKey(1), 0.05)
    assert mixed.rewards.shape == (40,)
    assert int(jnp.sum(mixed.rewards == 1e6)) == 2  # round(0.05 * 40)


def test_an_agent_trains_mopo_with_its_plant_model_and_names_what_it_needs(plant, tmp_path):
    """Through the Agent: MOPO trains with the plant model handed to ``fit`` (no held-out
    episodes needed: the model trains, it does not judge), refuses to train without one or
    in a sweep, and the saved agent loads and acts without the model."""
    from neorl_industrial.wrappers.agents import Agent, AgentError

    dataset, model = plant
    agent = Agent("mopo", task=model.task, **SMALL)
    with pytest.raises(AgentError, match="trains on a plant model of this log"):
        agent.fit(dataset, updates=100, chunk=100, evaluate=False)
    with pytest.raises(AgentError, match="not swept in one program"):
        agent.sweep(dataset, {"actor_lr": [1e-4, 3e-4]}, updates=100)
    result = agent.fit(
        dataset, updates=100, chunk=100, batch_size=32, evaluate=False, plant_model=model
    )
    assert np.isfinite(np.asarray(result.history[-1]["metrics"]["critic_loss"])).all()
    assert agent.result.verdict is None
    observations = np.asarray(dataset.observations[:5])
    actions = np.asarray(agent.predict(observations))
    assert actions.shape == (5, 1) and ((actions >= 0.0) & (actions <= 100.0)).all()
    loaded = Agent.load(agent.save(tmp_path / "mopo"))
    np.testing.assert_allclose(np.asarray(loaded.predict(observations)), actions, atol=1e-5)
