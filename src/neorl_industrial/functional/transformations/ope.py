"""Off-policy evaluation from logged data: the discounted return and costs of a policy,
estimated by Fitted Q Evaluation (``core.agents.fqe``) without a simulator.

:func:`fitted_q_evaluation` prepares the data the way FQE learns best, trains one FQE per
seed in one vmapped program (``train_offline``), and reports the estimates in the
dataset's own units at the episodes' first observations.

Preprocessing, undone in the result:

* Rewards are shifted by ``reward_shift`` and every signal is scaled so that its per-step
  spread is ``sqrt(1 - γ)`` (0.1 for γ = 0.99); a constant signal gets the scale
  ``sqrt(1 - γ)``. The heads' TD errors are then of comparable size (they share one
  network), and the values regressed are of order ``1 / sqrt(1 - γ)``: Adam moves the
  parameters by steps of a fixed size, so targets near one leave a larger relative
  noise in the estimate, while targets near ``1 / (1 - γ)`` take long to reach from a
  small initialization. On the Industrial Benchmark a per-step spread of ``1 - γ``
  measured errors several times larger in the cost estimates.
* The shift matters: an industrial process never terminates and its rewards sit far from
  zero (the Industrial Benchmark's around -225 per step), while policies differ by a few
  tens of percent. Without a terminal state every transition bootstraps with ``γ``, so a
  shift ``b`` of every reward moves every value by exactly ``b / (1 - γ)``; FQE learns
  the small difference, and the shift is added back. With terminal states in the data the
  correction would depend on the time left, so the shift must be 0 there.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from neorl_industrial.core.agents.fqe import FQE, DeterministicPolicy, FQEConfig, FQEState, make_fqe
from neorl_industrial.core.agents.types import Algorithm
from neorl_industrial.functional.state_management import Dataset, sample
from neorl_industrial.functional.state_management.train_state import TrainState, init_train_states
from neorl_industrial.functional.transformations.offline import (
    ChunkCallback,
    Schedule,
    train_offline,
)


@dataclasses.dataclass(frozen=True)
class OPEResult:
    """Estimated discounted return and costs of one policy, per FQE seed and their mean.

    Attributes:
        returns: ``[n_seeds]`` estimated discounted return, mean over the initial
            observations, in the dataset's reward units.
        costs: ``[n_seeds, n_costs]`` estimated discounted cost of each channel.
        return_mean: mean of ``returns`` over seeds.
        cost_mean: ``[n_costs]`` mean of ``costs`` over seeds.
        discount: the γ of the estimates.
        reward_shift: subtracted from every reward for training (added back here).
        reward_scale: multiplied into the shifted rewards for training.
        cost_scales: ``[n_costs]`` multiplied into each cost channel for training.
        state: the trained FQE runs (leading seed axis; estimates in training units).
        fqe: the evaluator that ``state`` belongs to.
        history: per chunk, the updates done, seconds and mean metrics per seed.
    """

    returns: np.ndarray
    costs: np.ndarray
    return_mean: float
    cost_mean: np.ndarray
    discount: float
    reward_shift: float
    reward_scale: float
    cost_scales: np.ndarray
    state: TrainState
    fqe: FQE
    history: list[dict[str, Any]]

    def values(self, observations: Any) -> np.ndarray:
        """``[n_seeds, ..., 1 + n_costs]`` estimated ``Q(s, π(s))`` at other observations
        ``[..., obs_size]``, in the dataset's units (return, then each cost)."""
        estimates = jax.vmap(self.fqe.estimate, in_axes=(0, None))(
            self.state.agent, jnp.asarray(observations, jnp.float32)
        )
        return _to_dataset_units(
            np.asarray(estimates, np.float64),
            self.discount,
            self.reward_shift,
            self.reward_scale,
            self.cost_scales,
        )


def _to_dataset_units(
    estimates: np.ndarray,
    discount: float,
    reward_shift: float,
    reward_scale: float,
    cost_scales: np.ndarray,
) -> np.ndarray:
    returns = estimates[..., :1] / reward_scale + reward_shift / (1.0 - discount)
    return np.concatenate([returns, estimates[..., 1:] / cost_scales], axis=-1)


class SignalScales(NamedTuple):
    """FQE's training scales; each None is chosen from the data (see the module's
    docstring).

    Attributes:
        reward_shift: subtracted from rewards for training; None: the mean reward when no
            episode ends in a terminal state, else 0.
        reward_scale: multiplied into the shifted rewards; None: ``sqrt(1 - γ) / std``.
        cost_scale: one for every channel or one per channel; None: ``sqrt(1 - γ) / std``
            of each channel.
    """

    reward_shift: float | None = None
    reward_scale: float | None = None
    cost_scale: float | Sequence[float] | None = None


def signal_scales(
    dataset: Dataset,
    discount: float,
    reward_shift: float | None = None,
    reward_scale: float | None = None,
    cost_scale: float | Sequence[float] | None = None,
) -> tuple[float, float, np.ndarray]:
    """``(reward_shift, reward_scale, cost_scales)`` for FQE on ``dataset``; each None
    is chosen from the data (see the module's docstring).

    Raises:
        ValueError: for a non-zero shift on data with terminal states, non-positive or
            non-finite scales, or a number of cost scales other than the channels.
    """
    rewards, costs, terminals = jax.device_get((dataset.rewards, dataset.costs, dataset.terminals))
    rewards = np.asarray(rewards, np.float64)
    costs = np.asarray(costs, np.float64).reshape(len(rewards), -1)
    has_terminals = bool(np.any(terminals))
    if reward_shift is None:
        reward_shift = 0.0 if has_terminals else float(rewards.mean())
    reward_shift = float(reward_shift)
    if not np.isfinite(reward_shift):
        raise ValueError(f"reward_shift: expected a finite number, got {reward_shift}")
    if reward_shift != 0.0 and has_terminals:
        raise ValueError(
            f"reward_shift: must be 0 for data with terminal states (got {reward_shift}): "
            "a shifted reward changes a value by an amount that depends on the time left"
        )
    step_scale = float(np.sqrt(1.0 - discount))
    if reward_scale is None:
        reward_scale = step_scale / _spread(rewards - reward_shift)
    reward_scale = float(reward_scale)
    if cost_scale is None:
        cost_scales = np.array([step_scale / _spread(column) for column in costs.T], np.float64)
    else:
        if np.ndim(cost_scale) > 0 and np.shape(cost_scale) != (costs.shape[1],):
            raise ValueError(
                f"cost_scale: expected one number or one scale per cost channel "
                f"({costs.shape[1]}), got {np.size(cost_scale)} values"
            )
        cost_scales = np.broadcast_to(np.asarray(cost_scale, np.float64), (costs.shape[1],))
    for name, value in (("reward_scale", reward_scale), ("cost_scale", cost_scales)):
        if not np.all(np.isfinite(value)) or not np.all(np.asarray(value) > 0):
            raise ValueError(f"{name}: expected positive finite scales, got {value}")
    return reward_shift, reward_scale, np.array(cost_scales, np.float64)


def _spread(values: np.ndarray) -> float:
    """Standard deviation, or 1 for a (near) constant signal."""
    spread = float(np.std(values)) if values.size else 0.0
    return spread if spread > 1e-6 else 1.0


def _prepare(
    dataset: Dataset,
    config: FQEConfig | None,
    initial_observations: Any,
    given: SignalScales | None = None,
) -> tuple[FQEConfig, jax.Array, tuple[float, float, np.ndarray], Dataset]:
    """The config with observation statistics, the checked initial observations, the
    signal scales and the dataset scaled for training."""
    if dataset.discrete:
        raise ValueError(
            "dataset: has discrete actions; fitted_q_evaluation evaluates continuous-action "
            "policies"
        )
    config = FQEConfig() if config is None else config
    if config.obs_mean is None:
        obs_mean, obs_std = dataset.observation_moments()
        config = config.replace(obs_mean=obs_mean, obs_std=obs_std)
    if initial_observations is None:
        initial_observations = dataset.initial_observations()
    initial_observations = jnp.asarray(initial_observations, jnp.float32)
    if initial_observations.ndim != 2 or initial_observations.shape[1] != (
        dataset.observation_size
    ):
        raise ValueError(
            f"initial_observations: expected shape [n, {dataset.observation_size}] (the "
            f"dataset's observation size), got {tuple(initial_observations.shape)}"
        )
    if not bool(jnp.all(jnp.isfinite(initial_observations))):
        raise ValueError("initial_observations: NaN or infinite values")
    scales = signal_scales(dataset, config.discount, *(given or SignalScales()))
    shift, scale, cost_scales = scales
    scaled = dataset.replace(
        rewards=(dataset.rewards - shift) * scale,
        costs=dataset.costs * jnp.asarray(cost_scales, jnp.float32),
    )
    return config, initial_observations, scales, scaled


@struct.dataclass
class PolicyFQEState:
    """One FQE run and the parameters of the policy it evaluates (not trained)."""

    fqe: FQEState
    policy_params: Any


def fitted_q_evaluation_values(
    dataset: Dataset,
    act: Any,
    policy_params: Any,
    schedule: Schedule,
    *,
    seeds: Sequence[int] = (0,),
    config: FQEConfig | None = None,
) -> Callable[[Any], np.ndarray]:
    """Trains FQE of several policies of one kind at once (every policy x FQE seed is one
    run of a single vmapped program) and returns their value function.

    Args:
        dataset: logged transitions of continuous actions.
        act: ``act(params, observations[B, obs_size]) -> actions[B, action_size]``,
            deterministic and jit-able.
        policy_params: the policies' parameters, stacked on a leading policy axis ``P``.
        schedule, seeds, config: as :func:`fitted_q_evaluation` (the scales are chosen
            from the data).

    Returns:
        ``values(observations [P, ..., obs_size]) -> [P, n_seeds, ..., 1 + n_costs]``:
        each policy's estimated ``Q(s, π(s))`` at its own observations, in the dataset's
        units (discounted return, then each channel's discounted cost).
    """
    config, _, (shift, scale, cost_scales), scaled = _prepare(dataset, config, None)
    n_policies = int(jax.tree.leaves(policy_params)[0].shape[0])
    seeds = tuple(int(seed) for seed in seeds)
    sizes = (dataset.observation_size, dataset.action_size, dataset.n_costs)

    def fqe_of(params: Any) -> FQE:
        return make_fqe(config, *sizes, lambda observations: act(params, observations))

    template = fqe_of(jax.tree.map(lambda leaf: leaf[0], policy_params))

    def update(state: PolicyFQEState, batch: Any, key: jax.Array) -> tuple[Any, Any]:
        fqe, metrics = fqe_of(state.policy_params).update(state.fqe, batch, key)
        return state.replace(fqe=fqe), metrics

    algorithm = Algorithm(init=template.init, update=update, act=lambda *args: None)
    fresh = init_train_states(algorithm, [seed for _ in range(n_policies) for seed in seeds])
    repeated = jax.tree.map(lambda leaf: jnp.repeat(leaf, len(seeds), axis=0), policy_params)
    state = fresh.replace(agent=PolicyFQEState(fqe=fresh.agent, policy_params=repeated))
    state, _ = train_offline(
        algorithm,
        scaled,
        schedule,
        sampler=functools.partial(sample, gamma=config.discount),
        check_action_units=False,
        state=state,
    )
    runs = state.agent
    estimate = jax.jit(
        jax.vmap(
            lambda run, observations: fqe_of(run.policy_params).estimate(run.fqe, observations)
        )
    )

    def values(observations: Any) -> np.ndarray:
        observations = jnp.asarray(observations, jnp.float32)
        if observations.shape[0] != n_policies or observations.shape[-1] != sizes[0]:
            raise ValueError(
                f"observations: expected [{n_policies}, ..., {sizes[0]}] (one set per "
                f"policy), got {tuple(observations.shape)}"
            )
        per_run = jnp.repeat(observations, len(seeds), axis=0)
        estimates = np.asarray(jax.device_get(estimate(runs, per_run)), np.float64)
        estimates = estimates.reshape(n_policies, len(seeds), *estimates.shape[1:])
        return _to_dataset_units(estimates, config.discount, shift, scale, cost_scales)

    return values


def start_estimates(
    values: Callable[[Any], np.ndarray], initial_observations: Any, n_policies: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(returns [n_policies, n_seeds], costs [n_policies, n_seeds, n_costs])``: the mean
    over ``initial_observations [n, obs_size]`` of every policy's values (from
    :func:`fitted_q_evaluation_values`), in the dataset's units."""
    starts = jnp.asarray(initial_observations, jnp.float32)
    starts = jnp.broadcast_to(starts, (n_policies, *starts.shape))
    estimates = values(starts).mean(axis=2)  # over the initial observations
    return estimates[..., 0], estimates[..., 1:]


def fitted_q_evaluation(
    dataset: Dataset,
    policy: DeterministicPolicy,
    schedule: Schedule,
    *,
    seeds: Sequence[int] = (0,),
    config: FQEConfig | None = None,
    initial_observations: Any = None,
    scales: SignalScales | None = None,
    callback: ChunkCallback | None = None,
) -> OPEResult:
    """Estimates the discounted return and costs of ``policy`` from ``dataset`` alone.

    Args:
        dataset: logged transitions of continuous actions (any behaviour).
        policy: ``policy(observations[B, obs_size]) -> actions[B, action_size]``,
            deterministic and jit-able, on raw observations.
        schedule: FQE updates per seed (rounded up to whole chunks), per compiled chunk,
            and the transitions per update.
        seeds: one FQE per seed (initialization and sampling), trained together.
        config: FQE's hyperparameters (default :class:`FQEConfig`); without observation
            statistics the dataset's per-feature mean and spread are used.
        initial_observations: ``[n, obs_size]`` where to evaluate the policy; by default
            the first observation of every episode of ``dataset``.
        scales: the training scales (:class:`SignalScales`; None: all from the data).
        callback: called on the host after every chunk with the metrics per seed.

    Returns:
        The :class:`OPEResult`, in the dataset's units.

    Raises:
        ValueError: naming the argument, for discrete actions, a policy whose actions do
            not fit the dataset, initial observations of the wrong shape, or bad scales.
    """
    config, initial_observations, (shift, scale, cost_scales), scaled = _prepare(
        dataset, config, initial_observations, scales
    )
    fqe = make_fqe(config, dataset.observation_size, dataset.action_size, dataset.n_costs, policy)
    state, history = train_offline(
        fqe,
        scaled,
        schedule,
        seeds=tuple(seeds),
        sampler=functools.partial(sample, gamma=config.discount),
        check_action_units=False,
        callback=callback,
    )
    estimates = jax.vmap(fqe.estimate, in_axes=(0, None))(state.agent, initial_observations)
    values = _to_dataset_units(
        np.asarray(estimates, np.float64).mean(axis=1), config.discount, shift, scale, cost_scales
    )
    return OPEResult(
        returns=values[:, 0],
        costs=values[:, 1:],
        return_mean=float(values[:, 0].mean()),
        cost_mean=values[:, 1:].mean(axis=0),
        discount=config.discount,
        reward_shift=shift,
        reward_scale=scale,
        cost_scales=cost_scales,
        state=state,
        fqe=fqe,
        history=history,
    )
