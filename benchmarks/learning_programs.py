"""The learning study's agents and compiled programs: each algorithm with its defaults,
its reward scaling kind and the observation normalizer of a dataset; the programs that
initialize, train (in chunks, every dataset and seed at once) and evaluate its agents.

The safety study trains with these as well; peer parity normalizes observations with them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import progress
from benchmarks.learning_common import REGISTRY_NAMES


def make_algorithm(
    name: str,
    obs_size: int,
    action_size: int,
    hidden: Sequence[int] = (256, 256),
    n_updates: int = 100_000,
    overrides: Mapping[str, Any] | None = None,
    model: Any = None,
) -> Any:
    """Algorithm ``name`` with its defaults (but ``hidden`` layer widths and the
    hyperparameters in ``overrides``, e.g. ``weight_init``) and no observation statistics
    (the normalizer is set per dataset in the state).

    ``cql_bc`` is CQL with CORL's behaviour-cloning warm start over the first tenth of
    ``n_updates`` (CORL: 100 k of 1 M). ``mopo`` and ``mopo_bc`` train on the plant model
    ``model`` (a ``ModelHandle``; without one they can act, not train)."""
    from neorl_industrial.core.agents import (
        BCConfig,
        CQLConfig,
        IQLConfig,
        TD3BCConfig,
        make_bc,
        make_cql,
        make_iql,
        make_td3bc,
    )

    factories = {
        "bc": (make_bc, BCConfig),
        "td3bc": (make_td3bc, TD3BCConfig),
        "iql": (make_iql, IQLConfig),
        "cql": (make_cql, CQLConfig),
        "cql_alpha": (make_cql, lambda **kw: CQLConfig(lagrange=True, **kw)),
        "cql_bc": (make_cql, lambda **kw: CQLConfig(bc_steps=n_updates // 10, **kw)),
        # d3rlpy 2.8's CQL defaults: actor and temperature lr 1e-4, penalty weight 5 tuned
        # by a Lagrange multiplier (lr 1e-4, from 1) towards a gap of 10.
        "cql_d3rlpy": (
            make_cql,
            lambda **kw: CQLConfig(
                actor_lr=1e-4,
                alpha_lr=1e-4,
                cql_alpha=5.0,
                lagrange=True,
                target_action_gap=10.0,
                alpha_prime_lr=1e-4,
                **kw,
            ),
        ),
    }
    if name == "mopo":
        from neorl_industrial.core.agents.mopo import MOPOConfig, make_mopo

        config = MOPOConfig.create(hidden=tuple(hidden), **dict(overrides or {}))
        return make_mopo(config, obs_size, action_size, model)
    if name == "mopo_bc":
        from neorl_industrial.core.agents.mopo import MOPOBCConfig, make_mopo_bc

        config = MOPOBCConfig.create(hidden=tuple(hidden), **dict(overrides or {}))
        return make_mopo_bc(config, obs_size, action_size, model)
    if name not in factories:
        raise ValueError(f"algorithm: unknown {name!r}; expected one of {sorted(factories)}")
    factory, config = factories[name]
    return factory(config(hidden=tuple(hidden), **dict(overrides or {})), obs_size, action_size)


def reward_scaling_kind(name: str, override: str | None = None) -> str:
    """The reward scaling algorithm ``name`` trains with: ``override`` when given, else
    the algorithm registry's for it (the CQL variants use CQL's)."""
    if override is not None:
        return override
    from neorl_industrial.core.agents.registry import algorithm_entry

    return algorithm_entry(REGISTRY_NAMES.get(name, name)).reward_scaling


def observation_normalizer(dataset: Any) -> Any:
    """The dataset's per-feature observation normalizer."""
    from neorl_industrial.core.agents import ObservationNormalizer

    return ObservationNormalizer.create(*dataset.observation_moments())


# ----- training and evaluation programs ---------------------------------------------------
def init_states(algorithm: Any, normalizers: Any, n_seeds: int) -> Any:
    """Fresh runs of ``n_seeds`` seeds on each dataset: a ``TrainState`` with leading axes
    ``[dataset, seed]``, each dataset's observation normalizer in its policies.

    Seed ``i`` initializes the same networks on every dataset; the sampling keys are
    independent across datasets and seeds."""
    import jax

    # One compiled program instead of hundreds of dispatched operations (minutes on a
    # busy CPU); jax's cache keys on the module-level function and the static arguments.
    return jax.jit(_build_states, static_argnums=(0, 2))(algorithm, normalizers, n_seeds)


def _build_states(algorithm: Any, normalizers: Any, n_seeds: int) -> Any:
    import jax
    import jax.numpy as jnp

    from neorl_industrial.functional.state_management import TrainState
    from neorl_industrial.functional.transformations.offline import init_seeds

    n_datasets = int(normalizers.mean.shape[0])

    def init_for(normalizer: Any) -> Any:
        agents = init_seeds(algorithm, jnp.arange(n_seeds))
        repeated = jax.tree.map(
            lambda leaf: jnp.broadcast_to(leaf, (n_seeds, *leaf.shape)), normalizer
        )
        return agents.replace(policy=agents.policy.replace(normalizer=repeated))

    keys = jax.random.split(jax.random.PRNGKey(1), n_datasets * n_seeds)
    return TrainState(
        agent=jax.vmap(init_for)(normalizers),
        key=keys.reshape(n_datasets, n_seeds, -1),
        updates=jnp.zeros((n_datasets, n_seeds), jnp.int32),
    )


def compiled_chunk(algorithm: Any, batch_size: int, chunk_updates: int) -> Callable:
    """``chunk(states, datasets) -> (states, mean metrics)``: ``chunk_updates`` updates of
    every agent (leading axes ``[dataset, seed]``) in one compiled call, the states
    donated. Each chunk's randomness is split from the agents' own keys, so the result
    depends on the states alone."""
    import jax

    from neorl_industrial.functional.transformations.offline import make_train_chunk

    per_dataset = make_train_chunk(algorithm, batch_size, chunk_updates)
    return jax.jit(jax.vmap(per_dataset, in_axes=(0, 0)), donate_argnums=0)


def train_chunks(
    chunk: Callable, states: Any, datasets: Any, n_updates: int
) -> Iterator[tuple[Any, dict[str, Any]]]:
    """Runs ``chunk`` until the agents have done ``n_updates`` updates; after every chunk
    yields the states and the chunk's entry (updates done in total, seconds, CPU seconds
    of the process, mean metrics per agent). The states are donated to the next chunk:
    use them before."""
    import jax
    import jax.numpy as jnp

    # A fresh state may hold one buffer twice (a target network starts as its online
    # network) and a restored one is the caller's: every leaf gets its own copy before
    # the first donation.
    states = jax.tree.map(jnp.copy, states)
    done = int(np.asarray(states.updates).reshape(-1)[0])
    while done < n_updates:
        started, started_cpu = time.perf_counter(), time.process_time()
        states, metrics = chunk(states, datasets)
        metrics = jax.device_get(metrics)  # the chunk's one transfer
        seconds = time.perf_counter() - started
        done = int(np.asarray(states.updates).reshape(-1)[0])
        yield (
            states,
            {
                "updates": done,
                "seconds": seconds,
                # On a shared machine the wall time says little about the cost alone.
                "cpu_s": time.process_time() - started_cpu,
                "metrics": {name: np.asarray(value).tolist() for name, value in metrics.items()},
            },
        )


def train_all(
    algorithm: Any,
    datasets: Any,
    normalizers: Any,
    n_seeds: int,
    n_updates: int,
    chunk_updates: int,
    batch_size: int,
) -> tuple[Any, list[dict[str, Any]]]:
    """Trains ``n_seeds`` agents on each of the stacked ``datasets`` in one program,
    without checkpoints or evaluations (the safety study's training).

    Returns the final algorithm states (leading axes ``[dataset, seed]``) and, per chunk,
    the updates done, seconds and mean metrics.
    """
    chunk = compiled_chunk(algorithm, batch_size, chunk_updates)
    states = init_states(algorithm, normalizers, n_seeds)
    history = []
    for trained, entry in train_chunks(chunk, states, datasets, n_updates):
        states = trained
        history.append(entry)
        progress(f"  {entry['updates']:>7} updates, {entry['seconds']:.1f} s for the chunk")
    return states.agent, history


def evaluation_program(
    algorithm: Any, env: Any, env_params: Any, n_episodes: int
) -> Callable[[Any, Any], Any]:
    """``evaluate(policies, key) -> returns [dataset, seed, episode]``: every policy
    (leading axes ``[dataset, seed]``) over ``n_episodes`` whole episodes with its
    deterministic action, all at once in one compiled program."""
    import jax

    from neorl_industrial.core.environments import rollout

    horizon = int(env_params.horizon)

    def policy(policy_params: Any, observation: Any, key: Any) -> Any:
        return algorithm.act(policy_params, observation, key, deterministic=True)

    def one(policy_params: Any, key: Any) -> Any:
        result = rollout(
            key, env, env_params, policy, n_episodes, horizon, policy_params=policy_params
        )
        return result.episode_return_sum / result.episodes  # [n_episodes]

    def evaluate(policies: Any, key: Any) -> Any:
        leading = jax.tree.leaves(policies)[0].shape[:2]
        keys = jax.random.split(key, leading[0] * leading[1]).reshape(*leading, -1)
        return jax.vmap(jax.vmap(one))(policies, keys)

    return jax.jit(evaluate)


def evaluate_all(
    algorithm: Any, env: Any, env_params: Any, policies: Any, n_episodes: int, seed: int
) -> np.ndarray:
    """Mean episode return of every policy (leading axes ``[dataset, seed]``) over
    ``n_episodes`` whole episodes, its deterministic action, all policies at once."""
    import jax

    evaluate = evaluation_program(algorithm, env, env_params, n_episodes)
    return np.asarray(jax.device_get(evaluate(policies, jax.random.PRNGKey(seed))))
