"""The dataset factory on the process tasks: shipped behaviour policies, datasets in the
plant's units, cards that describe the task, and SAC trained online in plant units."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.agents.sac import SACConfig, make_sac
from neorl_industrial.core.environments import make, registered_envs
from neorl_industrial.functional.state_management import ActionScaler
from neorl_industrial.functional.transformations import (
    ActionScaledEnv,
    OnlineConfig,
    normalized_actions,
    train_online,
)
from neorl_industrial.integration.datasets import DatasetCard
from neorl_industrial.integration.datasets.factory import (
    POLICY_SOURCE,
    QUALITIES,
    BehaviourPolicies,
    generate_dataset,
    open_loop_return,
)

#: Every registered task that is not an Industrial Benchmark variant ships its policies.
PROCESS_TASKS = sorted(env_id for env_id in registered_envs() if not env_id.startswith("IB-"))
N_TRAJECTORIES = 3
SEED = 11


@pytest.fixture(scope="module")
def shipped():
    """The shipped behaviour policies of every process task (a variant's are its base
    task's)."""
    return {
        env_id: BehaviourPolicies.load(POLICY_SOURCE.get(env_id, env_id))
        for env_id in PROCESS_TASKS
    }


@pytest.fixture(scope="module")
def generated(shipped):
    """A tiny dataset and card of every quality of every process task."""
    return {
        (env_id, quality): generate_dataset(
            env_id, quality, N_TRAJECTORIES, seed=SEED, policies=shipped[env_id]
        )
        for env_id in PROCESS_TASKS
        for quality in QUALITIES
    }


def test_every_process_task_ships_graded_policies(shipped):
    assert {"FourTank-v0", "DMSD-v0"} <= set(PROCESS_TASKS)
    for env_id, policies in shipped.items():
        returns = [policies.returns_per_step[quality] for quality in QUALITIES]
        assert policies.version == "v1"
        assert returns == sorted(returns) and len(set(returns)) == len(returns), (
            env_id,
            policies.returns_per_step,
        )
        # The expert reference is the best known controller: never below the trained expert.
        reference = policies.expert_reference["return_per_step"]
        assert reference >= policies.returns_per_step["expert"], env_id


def test_four_tank_expert_reference_is_the_replayed_nmpc_oracle(shipped):
    reference = shipped["FourTank-v0"].expert_reference
    assert "NMPC oracle" in reference["controller"]
    env, params = make("FourTank-v0")
    actions = np.asarray(reference["actions"])
    assert actions.shape == (int(params.horizon), env.action_size)
    assert np.all((actions >= env.action_low - 1e-6) & (actions <= env.action_high + 1e-6))
    replayed = open_loop_return("FourTank-v0", actions) / int(params.horizon)
    assert replayed == pytest.approx(reference["return_per_step"], rel=1e-6)
    with pytest.raises(ValueError, match="actions: expected shape"):
        open_loop_return("FourTank-v0", actions[:10])


@pytest.mark.parametrize("env_id", PROCESS_TASKS)
def test_datasets_act_in_plant_units(shipped, generated, env_id):
    env, _ = make(env_id)
    policies = shipped[env_id]
    identity = ActionScaler.is_identity(env.action_low, env.action_high)
    for quality in QUALITIES:
        dataset, _ = generated[(env_id, quality)]
        actions = np.asarray(dataset.actions)
        assert actions.shape[1] == env.action_size
        assert np.all(actions >= env.action_low) and np.all(actions <= env.action_high), quality
    # The mean-action steps of a trained quality are the policy's [-1, 1] action unscaled.
    dataset, _ = generated[(env_id, "medium")]
    sac = make_sac(policies.sac_config, env.observation_size, env.action_size)
    unit_actions = jax.vmap(
        lambda obs: sac.act(policies.policies["medium"], obs, deterministic=True)
    )(dataset.transition_observations())
    plant = (
        unit_actions
        if identity
        else ActionScaler.create(env.action_low, env.action_high).unscale(unit_actions)
    )
    is_mean = np.all(np.isclose(dataset.actions, plant, rtol=1e-5, atol=1e-5), axis=1)
    assert 0.7 < is_mean.mean() < 0.9
    if not identity:
        # Recorded in plant units, not in the policy's [-1, 1].
        assert np.abs(np.asarray(dataset.actions)).max() > 1.5


@pytest.mark.parametrize("env_id", PROCESS_TASKS)
def test_cards_describe_the_task(shipped, generated, env_id):
    env, params = make(env_id)
    policies = shipped[env_id]
    horizon = int(params.horizon)
    for quality in QUALITIES:
        dataset, card = generated[(env_id, quality)]
        assert dataset.n_costs == env.n_costs and card.cost_names == list(env.cost_names)
        assert card.behaviour_policy.name == quality
        assert dataset.n_episodes == N_TRAJECTORIES and card.seed == SEED
    dataset, card = generated[(env_id, "expert")]
    # Every parameter, arrays included, as JSON data that rebuilds it.
    for name, leaf in vars(params).items():
        np.testing.assert_array_equal(np.asarray(card.env_params[name], np.float32), leaf)
    reference = policies.expert_reference
    assert card.random_return == pytest.approx(policies.returns_per_step["random"] * horizon)
    assert card.expert_return == pytest.approx(reference["return_per_step"] * horizon)
    assert card.model_extra["expert_reference"] == {
        "controller": reference["controller"],
        "return_per_step": reference["return_per_step"],
    }
    # every cost channel carries its episode limit (the pipeline's from the environment,
    # since its cost is not expressible in a constraint spec)
    assert card.cost_limits == env.default_cost_limits()
    assert set(card.cost_limits) == set(env.cost_names)
    # The card survives JSON and names the task: names, units and plant bounds.
    task = DatasetCard.model_validate_json(card.to_json()).task(dataset)
    assert task.observation_names == env.observation_names
    assert task.action_names == env.action_names
    assert task.action_units == env.action_units
    assert task.observation_units == env.observation_units
    np.testing.assert_allclose(task.action_low, env.action_low, rtol=1e-6)
    np.testing.assert_allclose(task.action_high, env.action_high, rtol=1e-6)


@pytest.mark.parametrize("env_id", PROCESS_TASKS)
def test_regeneration_is_bit_identical(shipped, generated, env_id):
    dataset, card = generated[(env_id, "high")]
    again, again_card = generate_dataset(
        env_id, "high", N_TRAJECTORIES, seed=SEED, policies=shipped[env_id]
    )
    other, _ = generate_dataset(
        env_id, "high", N_TRAJECTORIES, seed=SEED + 1, policies=shipped[env_id]
    )
    for field in ("observations", "actions", "rewards", "costs"):
        np.testing.assert_array_equal(getattr(again, field), getattr(dataset, field))
    assert again_card.env_params == card.env_params
    assert not np.array_equal(other.actions, dataset.actions)


def test_the_stochastic_cstr_logs_a_random_feed_with_policies_trained_on_it(shipped, generated):
    dataset, card = generated[("CSTR-stochastic-v0", "medium")]
    quiet, _ = generated[("CSTR-v0", "medium")]
    assert card.env_id == "CSTR-stochastic-v0"
    assert shipped["CSTR-stochastic-v0"].env_id == "CSTR-stochastic-v0"
    # Trained on the random feed, its policies see a spread of feeds in their statistics.
    feed_std = np.asarray(shipped["CSTR-stochastic-v0"].sac_config.obs_std[3:])
    np.testing.assert_array_less([1.0, 0.01], feed_std)
    feed = np.asarray(dataset.all_observations())[:, 3:]
    assert len(np.unique(feed[:, 0])) > 100  # every logged interval's own feed
    assert np.unique(np.asarray(quiet.all_observations())[:, 3:], axis=0).shape[0] == 1
    # The medium policy keeps the reactor running: no episode diverges.
    assert not np.asarray(dataset.terminals).any()


def test_array_params_are_compared_with_the_defaults(shipped, generated):
    _, params = make("FourTank-v0")
    default_setpoint = np.asarray(params.setpoint).tolist()
    dataset, card = generated[("FourTank-v0", "high")]

    def generate(setpoint):
        return generate_dataset(
            "FourTank-v0",
            "high",
            N_TRAJECTORIES,
            seed=SEED,
            policies=shipped["FourTank-v0"],
            env_params={"setpoint": setpoint},
        )

    same, same_card = generate(default_setpoint)
    np.testing.assert_array_equal(same.observations, dataset.observations)
    assert same_card.expert_return == card.expert_return is not None
    assert same_card.env_params["setpoint"] == default_setpoint
    held, held_card = generate([0.3, 0.25])
    assert held_card.random_return is None and held_card.expert_return is None
    np.testing.assert_allclose(held_card.env_params["setpoint"], [[0.3, 0.25]], rtol=1e-6)
    setpoints = np.asarray(held.observations)[:, -2:]
    np.testing.assert_allclose(setpoints, np.broadcast_to([0.3, 0.25], setpoints.shape))
    assert held_card.task().env_id == "FourTank-v0"


def test_sac_trains_online_in_plant_units():
    env, params = make("DMSD-v0", horizon=10)
    sac = make_sac(SACConfig(hidden=(8, 8)), env.observation_size, env.action_size)
    config = OnlineConfig(n_envs=4, total_env_steps=80, warmup_steps=0, eval_every=80)
    state, history = train_online(jax.random.PRNGKey(0), env, params, sac, config)
    assert [evaluation.env_steps for evaluation in history.evaluations] == [0, 80]
    assert int(state.step) == history.evaluations[-1].updates == 20
    assert all(np.isfinite(evaluation.mean_return) for evaluation in history.evaluations)


def test_action_scaled_env_steps_the_plant_with_unscaled_actions():
    env, params = make("DMSD-v0")
    scaled = normalized_actions(env)
    assert isinstance(scaled, ActionScaledEnv) and scaled.inner is env
    np.testing.assert_array_equal(scaled.action_low, -1.0)
    assert scaled.observation_names == env.observation_names and scaled.name == "DMSD-v0"

    @jax.jit
    def first_steps(key):
        state, _ = scaled.reset(key, params)
        _, through = scaled.step(key, state, jnp.array([-1.0, 0.5]), params)
        _, direct = env.step(key, state, jnp.array([-30.0, 15.0]), params)
        return through, direct

    through, direct = first_steps(jax.random.PRNGKey(3))
    np.testing.assert_allclose(through.observation, direct.observation, rtol=1e-6)
    assert float(through.reward) == pytest.approx(float(direct.reward), rel=1e-5)
    # Tasks in [-1, 1] already are not wrapped; discrete ones cannot be.
    ib, _ = make("IB-v0")
    assert normalized_actions(ib) is ib
    with pytest.raises(ValueError, match="env: IB-discrete-v0 has discrete actions"):
        normalized_actions(make("IB-discrete-v0")[0])
    with pytest.raises(ValueError, match="env: IB-v0 already acts in"):
        ActionScaledEnv(ib)


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="quality: unknown quality 'great'"):
        generate_dataset("FourTank-v0", "great", 1)
    with pytest.raises(ValueError, match="env_id: unknown environment 'FiveTank-v0'"):
        generate_dataset("FiveTank-v0", "expert", 1)
    with pytest.raises(ValueError, match="env_id: no behaviour policies for 'FourTank-v0'"):
        BehaviourPolicies.load("FourTank-v0", root="/nonexistent")
