"""Statistical agreement with the reference, using JAX's own random numbers.

Replay tests pin the dynamics; these check that the port's noise (drawn by JAX, not
replayed) gives the reference's reward distribution under fixed policies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from neorl_industrial.core.environments import make, rollout
from tests.core.environments.reference_ib import ids_module

N_REFERENCE_EPISODES = 12
EPISODE_LENGTH = 400


def _reference_episode_rewards(setpoint, stationary, action_fn, seed):
    """Per-step rewards of reference episodes: [episodes, steps]."""
    rng = np.random.default_rng(seed)
    rewards = np.empty((N_REFERENCE_EPISODES, EPISODE_LENGTH))
    for episode in range(N_REFERENCE_EPISODES):
        plant = ids_module.IDS(setpoint, stationary_p=stationary, inital_seed=seed + episode)
        for t in range(EPISODE_LENGTH):
            plant.step(action_fn(rng))
            rewards[episode, t] = plant.state["reward"]
    return rewards


def _port_episode_rewards(env_id, setpoint, policy, n_episodes):
    env, params = make(env_id, setpoint=setpoint, horizon=EPISODE_LENGTH)
    result = jax.jit(
        lambda key: rollout(key, env, params, policy, n_episodes, EPISODE_LENGTH, record=True)
    )(jax.random.PRNGKey(123))
    return np.asarray(result.transitions.reward).T  # [episodes, steps]


def _zero_policy(_params, _obs, _key):
    return jnp.zeros(3)


def _random_policy(_params, _obs, key):
    return jax.random.uniform(key, (3,), minval=-1.0, maxval=1.0)


def _tilted_policy(_params, _obs, _key):
    return jnp.array([0.3, -0.2, 0.1])


CASES = [
    ("IB-classic-v0", 70.0, True, "zero"),
    ("IB-classic-v0", 30.0, True, "random"),
    ("IB-classic-v0", 50.0, True, "tilted"),
    ("IB-nonstationary-v0", 60.0, False, "random"),
]
POLICIES = {
    "zero": (_zero_policy, lambda rng: np.zeros(3)),
    "random": (_random_policy, lambda rng: 2.0 * rng.random(3) - 1.0),
    "tilted": (_tilted_policy, lambda rng: np.array([0.3, -0.2, 0.1])),
}


@pytest.mark.parametrize(("env_id", "setpoint", "stationary", "policy_name"), CASES)
def test_reward_mean_and_spread_match_the_reference(env_id, setpoint, stationary, policy_name):
    port_policy, reference_policy = POLICIES[policy_name]
    reference = _reference_episode_rewards(setpoint, stationary, reference_policy, seed=2024)
    port = _port_episode_rewards(env_id, setpoint, port_policy, 256)
    # Episodes are independent; steps within one are not, so compare episode means.
    # Mean reward, then the spread of the per-step reward within episodes (the noise the
    # port draws itself), each as a per-episode statistic compared within 4 standard errors.
    for statistic in ("mean", "std"):
        ref_values = getattr(reference, statistic)(axis=1)
        port_values = getattr(port, statistic)(axis=1)
        standard_error = np.sqrt(
            ref_values.var(ddof=1) / len(ref_values) + port_values.var(ddof=1) / len(port_values)
        )
        difference = abs(ref_values.mean() - port_values.mean())
        assert difference < 4.0 * standard_error + 1e-3 * abs(ref_values.mean()), (
            f"reward {statistic} {port_values.mean():.2f} vs reference {ref_values.mean():.2f} "
            f"(standard error {standard_error:.2f})"
        )
