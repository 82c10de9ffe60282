"""The FQE estimators of a verdict (``fqe``: Fitted Q Evaluation of every candidate on the
held-out episodes; ``model+fqe``: the model rollouts closed by FQE's value) and the
operators' clone that stands for today's operation where the model is needed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from neorl_industrial.core.agents.bc import BCConfig, make_bc
from neorl_industrial.core.agents.fqe import FQEConfig
from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.functional.transformations.model_evaluation import (
    RolloutSums,
)
from neorl_industrial.functional.transformations.offline import Schedule, train_offline
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


class VerdictCandidates(NamedTuple):
    """The candidates a verdict judges.

    Attributes:
        names: one name per candidate.
        act: ``act(policy_params, observation, key, deterministic=True)`` of one raw
            observation, actions in the policy's [-1, 1] (an ``Algorithm.act``).
        policy_params: the candidates' parameters stacked on a leading axis.
        fqe_act: ``fqe_act(params, observations [B, obs]) -> actions [B, act]`` shielded
            as :class:`~.ope.OffPolicyEvaluator` scores them (None: ``act`` batched).
        fqe_values: the candidates' FQE value function already fitted on the held-out
            episodes with ``fqe_act`` and the settings' FQE updates, seeds and widths (what
            :func:`~neorl_industrial.functional.transformations.ope.fitted_q_evaluation_values`
            returns, as an :class:`~.ope.OffPolicyEvaluator` keeps it): used instead of
            fitting the same FQEs again (None: fitted here). The behaviour clone's FQE is
            always fitted.
    """

    names: Sequence[str]
    act: Callable[..., jax.Array]
    policy_params: Any
    fqe_act: Callable[..., jax.Array] | None = None
    fqe_values: Callable[[Any], np.ndarray] | None = None


class FqeResults(NamedTuple):
    """Per candidate its ``fqe`` and ``model+fqe`` results, today's operation's, and
    ``model+fqe``'s own error on today's operation (its calibration)."""

    candidates: list[list[EstimatorResult]]
    behaviour: list[EstimatorResult]
    closing_error: Interval


@dataclasses.dataclass(frozen=True)
class _Head:
    """``model+fqe``: the model's return over its first steps, closed by FQE's value at
    the state the model reached, each step paying ``penalty`` spreads of its
    uncertainty."""

    reward_spread: float
    cost_spread: np.ndarray
    penalty: float

    def __call__(
        self, sums: RolloutSums, tail: np.ndarray, penalty: float | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return ``[..., M, N]`` and discounted costs ``[..., M, N, C]``."""
        penalty = self.penalty if penalty is None else penalty
        tail = tail.mean(axis=-4)  # over FQE seeds
        weight = sums.closing_weight
        value = sums.head_return - penalty * self.reward_spread * sums.head_uncertainty
        value = value + weight * tail[..., 0]
        costs = sums.head_costs + penalty * self.cost_spread * sums.head_uncertainty[..., None]
        costs = costs + weight[..., None] * tail[..., 1:]
        return value, costs


@dataclasses.dataclass(frozen=True)
class _ModelFqe:
    """``model+fqe`` of a candidate against today's operation: the paired difference
    between the candidate's reading (lowered by its uncertainty for the lower bound,
    raised for the upper) and the operators' plain reading, widened by the larger of the
    model's and its own error on today's operation (measured against the logged returns:
    the baseline's pessimism).

    Attributes:
        head: the reading.
        plain: the operators' reading ``[M, N]`` without pessimism.
        calibration: the model's calibration check.
        own_error: ``model+fqe``'s own error on today's operation.
    """

    head: _Head
    plain: np.ndarray
    calibration: Calibration
    own_error: float
    settings: VerdictSettings
    start_episodes: np.ndarray
    costs_of: Callable[[np.ndarray, int], tuple[CostEstimate, ...]]

    def candidate(self, own: RolloutSums, tail: np.ndarray, seed: int) -> EstimatorResult:
        """The candidate's estimate from its rollouts ``own`` closed by ``tail``."""
        combined, combined_costs = self.head(own, tail)
        plain, _ = self.head(own, tail, 0.0)
        optimistic, _ = self.head(own, tail, -self.head.penalty)
        between = _between(
            plain - self.plain,
            combined - self.plain,
            optimistic - self.plain,
            self.start_episodes,
            self.settings,
            seed,
        )
        share = max(self.calibration.model_error_share, self.own_error / self.calibration.size)
        scale = float(np.mean(np.abs(plain))) + float(np.mean(np.abs(self.plain)))
        draws = bootstrap_means(combined, self.start_episodes, self.settings.bootstrap, seed)
        return EstimatorResult(
            estimator="model+fqe",
            discounted_return=_interval(combined, draws, self.settings.level),
            episode_return=None,
            improvement=_widened(
                between, max(self.calibration.model_error, self.own_error, share * scale)
            ),
            penalty=float(
                np.mean(self.head.penalty * self.head.reward_spread * own.head_uncertainty)
            ),
            costs=self.costs_of(combined_costs, seed),
        )


def _fitted_fqe(
    policies: VerdictCandidates, clone: _Clone, heldout: Dataset, settings: VerdictSettings
) -> tuple[Callable[[Any], np.ndarray], Callable[[Any], np.ndarray]]:
    """The candidates' FQE value functions (fitted here unless given) and the clone's."""
    act = policies.act
    fqe_act = policies.fqe_act
    if fqe_act is None:

        def fqe_act(params: Any, observations: jax.Array) -> jax.Array:
            return jax.vmap(lambda o: act(params, o, None, deterministic=True))(observations)

    common = dict(
        schedule=Schedule(n_updates=settings.fqe_updates, batch_size=FQE_BATCH_SIZE),
        seeds=settings.fqe_seeds,
        config=FQEConfig(hidden=settings.fqe_hidden, discount=settings.discount),
    )
    values = policies.fqe_values or fitted_q_evaluation_values(
        heldout, fqe_act, policies.policy_params, **common
    )

    def clone_act(params: Any, observations: jax.Array) -> jax.Array:
        return jax.vmap(lambda o: clone.act(params, o, None, deterministic=True))(observations)

    clone_params = jax.tree.map(lambda leaf: leaf[None], clone.params)
    return values, fitted_q_evaluation_values(heldout, clone_act, clone_params, **common)


def _fqe_estimators(
    policies: VerdictCandidates,
    heldout: Dataset,
    settings: VerdictSettings,
    starts: Any,
    rollouts: tuple[RolloutSums, RolloutSums, _Clone],
    calibration: Calibration,
    head: _Head,
    costs_of: Callable[[np.ndarray, int], tuple[CostEstimate, ...]],
) -> FqeResults:
    """``fqe`` and ``model+fqe`` of every candidate, and of today's operation (the
    operators' clone: its FQE, and its model rollouts closed by it).

    ``starts`` is the verdict's held-out starts (``first``, ``episodes``,
    ``logged_discounted``); ``rollouts`` the candidates', the clone's and the clone."""
    candidates, baseline, clone = rollouts
    values, clone_values = _fitted_fqe(policies, clone, heldout, settings)
    n_policies = candidates.discounted_return.shape[0]
    first = starts.first
    # At the starts, and closing at the states the model reached after k steps.
    at_starts, closing = _values_at(  # [P, S, N, 1 + C], [P, S, M, N, 1 + C]
        values,
        jnp.broadcast_to(first, (n_policies, *first.shape)),
        jnp.asarray(candidates.closing_observation, jnp.float32),
    )
    clone_at_starts, clone_closing = _values_at(
        clone_values, first[None], jnp.asarray(baseline.closing_observation, jnp.float32)[None]
    )
    clone_at_starts, clone_closing = clone_at_starts[0], clone_closing[0]
    operators = jax.tree.map(lambda x: x[None], baseline)
    # The operators' plain reading: its error against the logged returns (below) is the
    # baseline's pessimism.
    plain, plain_costs = (x[0] for x in head(operators, clone_closing[None], 0.0))

    def interval(values: np.ndarray, draw_seed: int) -> Interval:
        draws = bootstrap_means(values, starts.episodes, settings.bootstrap, draw_seed)
        return _interval(values, draws, settings.level)

    # model+fqe's own error on today's operation (its unpenalised estimate of the clone
    # against the logged returns), as the model's calibration: its improvement interval
    # is widened by the larger of the two.
    error = interval(plain - starts.logged_discounted[None], settings.seed)
    mixed = _ModelFqe(
        head, plain, calibration, Calibration.error_size(error), settings,
        starts.episodes, costs_of,
    )  # fmt: skip
    results = []
    for p in range(n_policies):
        seed = settings.seed + p
        fqe_returns = at_starts[p, ..., 0]  # [S, N]
        fqe = EstimatorResult(
            estimator="fqe",
            discounted_return=interval(fqe_returns, seed),
            episode_return=None,
            improvement=interval(fqe_returns - clone_at_starts[..., 0], seed),
            penalty=0.0,
            costs=costs_of(at_starts[p, ..., 1:], seed),
        )
        own = jax.tree.map(lambda x, p=p: x[p], candidates)
        results.append([fqe, mixed.candidate(own, closing[p], seed)])
    behaviour = [
        EstimatorResult(
            estimator="fqe",
            discounted_return=interval(clone_at_starts[..., 0], settings.seed),
            episode_return=None,
            improvement=None,
            penalty=0.0,
            costs=costs_of(clone_at_starts[..., 1:], settings.seed),
        ),
        EstimatorResult(
            estimator="model+fqe",
            discounted_return=interval(plain, settings.seed),
            episode_return=None,
            improvement=None,
            penalty=0.0,
            costs=costs_of(plain_costs, settings.seed),
        ),
    ]
    return FqeResults(results, behaviour, error)


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


def clone_residuals(clone: _Clone, data: Dataset) -> np.ndarray:
    """``[n_transitions, action_size]`` the logged actions less the clone's (in [-1, 1]):
    what the operators did that the clone of the logged state does not."""
    observations = data.transition_observations()
    mean = jax.vmap(lambda o: clone.act(clone.params, o, None, deterministic=True))(observations)
    residual = np.asarray(jax.device_get(data.actions - mean), np.float32)
    return residual.reshape(data.n_transitions, -1)


def _operators_policy(clone: _Clone, action_size: int, residuals: np.ndarray | None) -> _Clone:
    """Today's operation as a policy for the model: the clone's action plus, given the
    logged actions' ``residuals`` around it (:func:`clone_residuals`), Gaussian noise of
    their spread (per action, in [-1, 1]; operators do not repeat the same move from the
    same state), clipped to [-1, 1]; None: the clone's action. Its parameters carry a
    leading policy axis of 1."""
    spread = 0.0 if residuals is None else np.asarray(residuals, np.float64).std(axis=0)
    params = {
        "clone": clone.params,
        "noise": jnp.asarray(np.broadcast_to(spread, (action_size,)), jnp.float32),
    }

    def act(params: Any, observation: jax.Array, key: Any = None, deterministic: bool = True):
        action = clone.act(params["clone"], observation, None, deterministic=True)
        if deterministic or key is None:
            return action
        drawn = params["noise"] * jax.random.normal(key, action.shape, action.dtype)
        return jnp.clip(action + drawn, -1.0, 1.0)

    return _Clone(act=act, params=jax.tree.map(lambda leaf: leaf[None], params))


def _behaviour_clone(heldout: Dataset, settings: VerdictSettings) -> _Clone:
    """A behaviour-cloned policy of the held-out episodes (actions in [-1, 1]).

    Where observations stack earlier rows, the clone reads the newest row only, as the
    operators' screen shows it: cloned on the rows before, it learns to repeat the
    operators' last move (the copycat of behaviour cloning on histories) instead of their
    response to the plant, and drifts once it runs closed loop."""
    frame = heldout.observations.shape[1]
    clone = _newest_row_clone(heldout.newest_frames(), settings)
    if heldout.frame_stack == 1:
        return clone

    def act(params: Any, observation: jax.Array, key: Any = None, deterministic: bool = True):
        return clone.act(params, observation[..., :frame], key, deterministic=deterministic)

    return _Clone(act=act, params=clone.params)


def _newest_row_clone(heldout: Dataset, settings: VerdictSettings) -> _Clone:
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
        schedule=Schedule(
            n_updates=settings.bc_updates,
            chunk_updates=min(1000, settings.bc_updates),
            batch_size=256,
        ),
    )
    return _Clone(act=bc.act, params=jax.tree.map(lambda leaf: leaf[0], state.agent.policy))
