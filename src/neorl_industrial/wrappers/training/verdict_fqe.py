"""The FQE estimators of a verdict (``fqe``: Fitted Q Evaluation of every candidate on the
held-out episodes; ``model+fqe``: the model rollouts closed by FQE's value) and the
operators' clone that stands for today's operation where the model is needed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.bc import BCConfig, make_bc
from neorl_industrial.core.agents.fqe import FQEConfig
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.model_evaluation import (
    RolloutSums,
)
from neorl_industrial.functional.transformations.offline import train_offline
from neorl_industrial.functional.transformations.ope import fitted_q_evaluation_values
from neorl_industrial.wrappers.training.verdict_evidence import (
    _between,
    _interval,
    _widened,
    bootstrap_means,
)
from neorl_industrial.wrappers.training.verdict_results import (
    FQE_BATCH_SIZE,
    Calibration,
    CostEstimate,
    EstimatorResult,
    Interval,
    VerdictSettings,
)


def _fqe_estimators(
    *,
    act,
    fqe_act,
    fqe_values,
    policy_params,
    heldout: Dataset,
    settings: VerdictSettings,
    first: jax.Array,
    candidates: RolloutSums,
    baseline: RolloutSums,
    clone: _Clone,
    calibration: Calibration,
    logged_discounted: np.ndarray,
    closing_error: list[Interval],
    start_episodes: np.ndarray,
    reward_spread: float,
    cost_spread: np.ndarray,
    costs_of: Callable[[np.ndarray, int], tuple[CostEstimate, ...]],
) -> tuple[list[list[EstimatorResult]], list[EstimatorResult]]:
    """``fqe`` and ``model+fqe`` of every candidate, and of today's operation (the
    operators' clone: its FQE, and its model rollouts closed by it)."""
    if fqe_act is None:

        def fqe_act(params: Any, observations: jax.Array) -> jax.Array:
            return jax.vmap(lambda o: act(params, o, None, deterministic=True))(observations)

    config = FQEConfig(hidden=settings.fqe_hidden, discount=settings.discount)
    common = dict(
        n_updates=settings.fqe_updates,
        seeds=settings.fqe_seeds,
        config=config,
        batch_size=FQE_BATCH_SIZE,
    )
    values = fqe_values or fitted_q_evaluation_values(heldout, fqe_act, policy_params, **common)
    clone_params = jax.tree.map(lambda leaf: leaf[None], clone.params)

    def clone_act(params: Any, observations: jax.Array) -> jax.Array:
        return jax.vmap(lambda o: clone.act(params, o, None, deterministic=True))(observations)

    clone_values = fitted_q_evaluation_values(heldout, clone_act, clone_params, **common)
    n_policies = candidates.discounted_return.shape[0]
    starts = jnp.broadcast_to(first, (n_policies, *first.shape))
    # At the starts, and closing at the states the model reached after k steps.
    at_starts, closing = _values_at(  # [P, S, N, 1 + C], [P, S, M, N, 1 + C]
        values, starts, jnp.asarray(candidates.closing_observation, jnp.float32)
    )
    clone_at_starts, clone_closing = _values_at(
        clone_values, first[None], jnp.asarray(baseline.closing_observation, jnp.float32)[None]
    )
    clone_at_starts, clone_closing = clone_at_starts[0], clone_closing[0]
    penalty = settings.penalty

    def head(
        sums: RolloutSums, tail: np.ndarray, penalty: float = settings.penalty
    ) -> tuple[np.ndarray, np.ndarray]:
        """``model+fqe`` return ``[..., M, N]`` and discounted costs ``[..., M, N, C]``."""
        tail = tail.mean(axis=-4)  # over FQE seeds
        weight = sums.closing_weight
        value = sums.head_return - penalty * reward_spread * sums.head_uncertainty
        value = value + weight * tail[..., 0]
        costs = sums.head_costs + penalty * cost_spread * sums.head_uncertainty[..., None]
        costs = costs + weight[..., None] * tail[..., 1:]
        return value, costs

    # The operators' estimate is raised by its uncertainty (pessimism on the baseline).
    logged_combined, logged_combined_costs = head(
        jax.tree.map(lambda x: x[None], baseline), clone_closing[None], penalty=-penalty
    )
    logged_combined, logged_combined_costs = logged_combined[0], logged_combined_costs[0]
    logged_plain = head(jax.tree.map(lambda x: x[None], baseline), clone_closing[None], 0.0)[0][0]
    logged_low = head(
        jax.tree.map(lambda x: x[None], baseline), clone_closing[None], penalty=penalty
    )[0][0]
    results: list[list[EstimatorResult]] = []
    seed = settings.seed

    def interval(values: np.ndarray, draw_seed: int) -> Interval:
        draws = bootstrap_means(values, start_episodes, settings.bootstrap, draw_seed)
        return _interval(values, draws, settings.level)

    # model+fqe's own error on today's operation (its unpenalised estimate of the clone
    # against the logged returns), as the model's calibration: its improvement interval
    # is widened by the larger of the two.
    unpenalised, _ = head(jax.tree.map(lambda x: x[None], baseline), clone_closing[None], 0.0)
    error = interval(unpenalised[0] - logged_discounted[None], seed)
    own_error = Calibration.error_size(error)
    share = max(calibration.model_error_share, own_error / calibration.size)
    closing_error.append(error)

    for p in range(n_policies):
        fqe_returns = at_starts[p, ..., 0]  # [S, N]
        difference = fqe_returns - clone_at_starts[..., 0]
        fqe = EstimatorResult(
            estimator="fqe",
            discounted_return=interval(fqe_returns, seed + p),
            episode_return=None,
            improvement=interval(difference, seed + p),
            penalty=0.0,
            costs=costs_of(at_starts[p, ..., 1:], seed + p),
        )
        own = jax.tree.map(lambda x, p=p: x[p], candidates)
        combined, combined_costs = head(own, closing[p])
        plain, _ = head(own, closing[p], 0.0)
        optimistic, _ = head(own, closing[p], -penalty)
        between = _between(
            plain - logged_plain,
            combined - logged_combined,
            optimistic - logged_low,
            start_episodes,
            settings,
            seed + p,
        )
        mixed = EstimatorResult(
            estimator="model+fqe",
            discounted_return=interval(combined, seed + p),
            episode_return=None,
            improvement=_widened(
                between,
                max(
                    calibration.model_error,
                    own_error,
                    share * (float(np.mean(np.abs(plain))) + float(np.mean(np.abs(logged_plain)))),
                ),
            ),
            penalty=float(np.mean(penalty * reward_spread * own.head_uncertainty)),
            costs=costs_of(combined_costs, seed + p),
        )
        results.append([fqe, mixed])
    behaviour = [
        EstimatorResult(
            estimator="fqe",
            discounted_return=interval(clone_at_starts[..., 0], seed),
            episode_return=None,
            improvement=None,
            penalty=0.0,
            costs=costs_of(clone_at_starts[..., 1:], seed),
        ),
        EstimatorResult(
            estimator="model+fqe",
            discounted_return=interval(logged_combined, seed),
            episode_return=None,
            improvement=None,
            penalty=0.0,
            costs=costs_of(logged_combined_costs, seed),
        ),
    ]
    return results, behaviour


def _values_at(values: Callable[[Any], np.ndarray], *observations: jax.Array) -> list[np.ndarray]:
    """``values`` (of ``fitted_q_evaluation_values``) at several sets of observations
    ``[P, ..., obs]`` in one call: one compiled program (the policy and its shield inside
    traced once) instead of one per shape. Each result is ``[P, n_seeds, ..., 1 + C]``."""
    flat = [jnp.reshape(o, (o.shape[0], -1, o.shape[-1])) for o in observations]
    joined = values(jnp.concatenate(flat, axis=1))  # [P, n_seeds, K, 1 + C]
    bounds = np.cumsum([f.shape[1] for f in flat])[:-1]
    return [
        part.reshape(*part.shape[:2], *o.shape[1:-1], part.shape[-1])
        for part, o in zip(np.split(joined, bounds, axis=2), observations, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class _Clone:
    act: Callable[..., jax.Array]
    params: Any


def _operators_policy(clone: _Clone, heldout: Dataset, noise: bool) -> _Clone:
    """Today's operation as a policy for the model: the clone's action plus, with
    ``noise``, Gaussian noise of the spread of the logged actions around it (per action,
    in [-1, 1]; operators do not repeat the same move from the same state), clipped to
    [-1, 1]. Its parameters carry a leading policy axis of 1."""
    observations = heldout.transition_observations()
    mean = jax.vmap(lambda o: clone.act(clone.params, o, None, deterministic=True))(observations)
    residual = np.asarray(jax.device_get(heldout.actions - mean), np.float64)
    spread = residual.reshape(heldout.n_transitions, -1).std(axis=0) if noise else 0.0
    params = {
        "clone": clone.params,
        "noise": jnp.asarray(np.broadcast_to(spread, (heldout.action_size,)), jnp.float32),
    }

    def act(params: Any, observation: jax.Array, key: Any = None, deterministic: bool = True):
        action = clone.act(params["clone"], observation, None, deterministic=True)
        if deterministic or key is None:
            return action
        drawn = params["noise"] * jax.random.normal(key, action.shape, action.dtype)
        return jnp.clip(action + drawn, -1.0, 1.0)

    return _Clone(act=act, params=jax.tree.map(lambda leaf: leaf[None], params))


def _behaviour_clone(heldout: Dataset, settings: VerdictSettings) -> _Clone:
    """A behaviour-cloned policy of the held-out episodes (actions in [-1, 1])."""
    obs_mean, obs_std = heldout.observation_moments()
    config = BCConfig(
        hidden=settings.fqe_hidden,
        obs_mean=tuple(float(x) for x in obs_mean),
        obs_std=tuple(float(x) for x in obs_std),
    )
    bc = make_bc(config, heldout.observation_size, heldout.action_size)
    state, _ = train_offline(
        bc,
        heldout,
        seeds=(settings.seed,),
        n_updates=settings.bc_updates,
        chunk_updates=min(1000, settings.bc_updates),
        batch_size=256,
    )
    return _Clone(act=bc.act, params=jax.tree.map(lambda leaf: leaf[0], state.agent.policy))
