"""The compiled programs of a :class:`~.plant_model.PlantModel`: the one-step prediction
of a batch of any leading shape and the open-loop rollout of a batch of starts."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from neorl_industrial.core.models import Dynamics, DynamicsParams, out_of_distribution


def predict_program(dynamics: Dynamics) -> Callable[..., dict[str, jax.Array]]:
    """The compiled one-step prediction of a batch of any leading shape."""
    layout = dynamics.layout
    frame = layout.frame_size

    @jax.jit
    def program(params: DynamicsParams, observations: jax.Array, actions: jax.Array):
        shape = observations.shape[:-1]
        flat_obs = observations.reshape(-1, observations.shape[-1])
        flat_act = jnp.broadcast_to(actions, (*shape, actions.shape[-1])).reshape(
            flat_obs.shape[0], -1
        )
        members = jax.vmap(dynamics.predict, in_axes=(0, None, None, None))(
            params.networks, params, flat_obs, flat_act
        )  # [E, B, T] normalized
        variance = jnp.mean(jnp.exp(2.0 * members.log_std), axis=0) + jnp.var(members.mean, axis=0)
        variance = jnp.where(params.target_fixed, 0.0, variance)

        def member_mean(member: jax.Array) -> tuple[jax.Array, ...]:
            return jax.vmap(
                lambda o, a: dynamics.transition(params, o, a, jax.random.PRNGKey(0), member, True)
            )(flat_obs, flat_act)

        next_obs, rewards, costs, _ = jax.vmap(member_mean)(jnp.arange(params.n_members))
        ood = out_of_distribution(params, flat_obs, flat_act)
        result = {
            "next_observation": jnp.mean(next_obs, axis=0),
            "next_frame_std": jnp.sqrt(variance[:, :frame]) * params.target_std[:frame],
            "reward": jnp.mean(rewards, axis=0),
            "costs": jnp.mean(costs, axis=0),
            "done_probability": jnp.mean(jax.nn.sigmoid(members.logit), axis=0) * layout.terminals,
            "member_std": jnp.std(next_obs[..., :frame], axis=0),
            "out_of_distribution": ood,
            "outside_data": ood > 0.0,
        }
        return jax.tree.map(lambda x: x.reshape(*shape, *x.shape[1:]), result)

    return program


def rollout_program(
    dynamics: Dynamics, member: int | None, deterministic: bool
) -> Callable[..., dict[str, jax.Array]]:
    """The compiled open-loop rollout of a batch of starts."""

    @jax.jit
    def program(params, observations, actions, key):
        def one(observation, actions, key):
            def body(observation, inputs):
                action, key = inputs
                out = dynamics.step(params, observation, action, key, member, deterministic)
                return out.next_observation, out

            keys = jax.random.split(key, actions.shape[0])
            _, outs = jax.lax.scan(body, observation, (actions, keys))
            return outs

        keys = jax.random.split(key, observations.shape[0])
        outs = jax.vmap(one)(observations, actions, keys)
        return {
            "observations": jnp.concatenate([observations[:, None], outs.next_observation], axis=1),
            "rewards": outs.reward,
            "costs": outs.costs,
            "done": outs.done,
            "member_std": outs.member_std,
            "out_of_distribution": outs.out_of_distribution,
        }

    return program
