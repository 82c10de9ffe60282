"""The dataset factory: behaviour policies of graded quality and the datasets they make.

Following NeoRL, every registered environment gets datasets of five qualities. ``random``
acts uniformly at random. ``expert`` is the best policy reached in training, and ``low``,
``medium`` and ``high`` are training snapshots whose return lies about 25, 50 and 75 % of
the way from the random policy's return to the expert's; they act with their mean action
80 % of the time and a sampled action 20 %. The expert return of normalized scores is the
best known controller's (the trained expert, unless the artifact names a better one).

Behaviour policies are trained in house with SAC on the JAX environment and kept as
versioned artifacts (a manifest and one file of parameters per quality), so a dataset is
regenerated bit for bit from its environment, quality, size and seed.

Tasks whose actions are in plant units (pump voltages, forces) are learned and acted in
[-1, 1] by SAC and driven through the task's action scaler, so datasets record actions in
plant units, as a plant's log would.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from neorl_industrial.core.agents.sac import PolicyParams, SACConfig, make_sac
from neorl_industrial.core.environments import Environment, make, rollout, uniform_random_policy
from neorl_industrial.functional.state_management import Dataset, with_action_scaling
from neorl_industrial.functional.transformations.action_scaling import action_scaler_for
from neorl_industrial.functional.transformations.generation import (
    behaviour_policy,
    generate_trajectories,
)
from neorl_industrial.functional.transformations.online import (
    OnlineConfig,
    random_rollout_statistics,
    train_online,
)
from neorl_industrial.integration.datasets.card import BehaviourPolicy, DatasetCard
from neorl_industrial.integration.datasets.native import clear_stale_staging
from neorl_industrial.version import __version__
from neorl_industrial.wrappers.hostio import atomic_directory, to_json_data

QUALITIES = ("random", "low", "medium", "high", "expert")
#: Where each trained quality sits between the random return (0) and the best return (1).
QUALITY_FRACTIONS = {"low": 0.25, "medium": 0.5, "high": 0.75, "expert": 1.0}
#: Probability that a behaviour policy acts with a sampled instead of its mean action.
SAMPLE_PROBABILITY = 0.2
#: Dataset sizes by name, in trajectories.
SIZES = {"small": 100, "medium": 1000, "large": 10000}
#: Episodes over which the returns of the random and the selected policies are measured.
EVALUATION_EPISODES = 64
#: Training snapshots measured again for each quality (the best, or the nearest to its
#: target, by their training evaluation).
CANDIDATES = 3
#: Behaviour policies shipped with the package.
POLICY_ROOT = Path(__file__).parent / "behaviour_policies"
MANIFEST = "manifest.json"
#: What the expert reference of artifacts that do not name one is.
TRAINED_EXPERT = "trained SAC expert (deterministic)"
#: The online budget each id's shipped behaviour policies were trained with (overrides
#: of :class:`OnlineConfig`), so that training again reproduces them. Process tasks have
#: short episodes and SAC passes their low and medium targets within a few hundred
#: updates, hence evaluations (snapshots to pick qualities from) every few episodes.
TRAINING_PLANS: dict[str, dict[str, int]] = {
    "IB-v0": {"total_env_steps": 200_000, "eval_every": 2400},
    "IB-classic-v0": {"total_env_steps": 200_000, "eval_every": 800},
    "IB-nonstationary-v0": {"total_env_steps": 200_000, "eval_every": 2400},
    "FourTank-v0": {"total_env_steps": 52_800, "eval_every": 240},
    "DMSD-v0": {"total_env_steps": 200_640, "eval_every": 960},
    "Pipeline-v0": {"total_env_steps": 100_080, "eval_every": 240},
    "CSTR-v0": {"total_env_steps": 52_800, "eval_every": 96},
    # Policies of the deterministic feed do not transfer: it is constant in their data, so
    # its normalization scale is the floor and any deviation saturates their actions.
    "CSTR-stochastic-v0": {"total_env_steps": 52_800, "eval_every": 96},
}


@dataclasses.dataclass
class BehaviourPolicies:
    """A versioned set of behaviour policies for one environment.

    Attributes:
        env_id: the environment they act in.
        version: the artifact version (datasets name it in their card).
        sac_config: the SAC configuration (network sizes, observation normalization).
        returns_per_step: measured mean return per step of each quality's mean action,
            plus ``random``.
        policies: parameters of each trained quality.
        training: how they were trained (budget, seed, wall time, env steps per policy).
        expert_reference: the best known controller, whose return is the expert return
            of normalized scores: ``controller`` (a description), its measured
            ``return_per_step`` and, for a controller replayed open loop, its
            ``actions``; by default the trained expert.
    """

    env_id: str
    version: str
    sac_config: SACConfig
    returns_per_step: dict[str, float]
    policies: dict[str, PolicyParams]
    training: dict[str, Any] = dataclasses.field(default_factory=dict)
    expert_reference: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.expert_reference is None:
            self.expert_reference = {
                "controller": TRAINED_EXPERT,
                "return_per_step": self.returns_per_step["expert"],
            }

    def with_expert_reference(self, controller: str, actions: Any) -> BehaviourPolicies:
        """A copy whose expert reference is the controller that chose ``actions``, one
        per step of an episode at the defaults, replayed by :func:`open_loop_return`
        (for tasks whose reset and dynamics are deterministic, such as FourTank-v0)."""
        _, params = make(self.env_id)
        actions = np.asarray(actions, np.float64)
        return dataclasses.replace(
            self,
            expert_reference={
                "controller": controller,
                "return_per_step": open_loop_return(self.env_id, actions) / int(params.horizon),
                "actions": actions.tolist(),
            },
        )

    def save(self, root: str | Path = POLICY_ROOT, *, overwrite: bool = False) -> Path:
        """Writes ``root/<env_id>/<version>/`` atomically and returns it (after removing
        what killed saves left there, with a warning)."""
        path = Path(root) / self.env_id / self.version
        clear_stale_staging(path.absolute().parent)
        with atomic_directory(path, overwrite=overwrite) as staging:
            for quality, params in self.policies.items():
                (staging / f"{quality}.msgpack").write_bytes(
                    serialization.to_bytes(jax.device_get(params))
                )
            manifest = {
                "env_id": self.env_id,
                "version": self.version,
                "package_version": __version__,
                "sac_config": dataclasses.asdict(self.sac_config),
                "returns_per_step": self.returns_per_step,
                "qualities": sorted(self.policies),
                "training": self.training,
                "expert_reference": self.expert_reference,
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
        return path

    @classmethod
    def load(
        cls, env_id: str, version: str | None = None, root: str | Path = POLICY_ROOT
    ) -> BehaviourPolicies:
        """Loads a version (the newest when ``version`` is None).

        Raises:
            ValueError: naming the environment and the versions that exist.
        """
        base = Path(root) / env_id
        versions = sorted(p.name for p in base.glob("*") if (p / MANIFEST).is_file())
        if not versions:
            raise ValueError(
                f"env_id: no behaviour policies for {env_id!r} under {base}; train them with "
                "train_behaviour_policies()"
            )
        version = version or versions[-1]
        if version not in versions:
            raise ValueError(f"version: {version!r} not found for {env_id}; have {versions}")
        path = base / version
        manifest = json.loads((path / MANIFEST).read_text())
        config = SACConfig.create(**manifest["sac_config"])
        env, _ = make(env_id)
        # Shapes only: the parameters are read from the files.
        template = jax.eval_shape(
            lambda: (
                make_sac(config, env.observation_size, env.action_size)
                .init(jax.random.PRNGKey(0))
                .policy
            )
        )
        policies = {
            quality: serialization.from_bytes(template, (path / f"{quality}.msgpack").read_bytes())
            for quality in manifest["qualities"]
        }
        return cls(
            env_id=env_id,
            version=version,
            sac_config=config,
            returns_per_step=manifest["returns_per_step"],
            policies=policies,
            training=manifest.get("training", {}),
            expert_reference=manifest.get("expert_reference"),
        )


def train_behaviour_policies(
    env_id: str = "IB-v0",
    *,
    version: str = "v1",
    seed: int = 0,
    online: OnlineConfig | None = None,
    sac: SACConfig | None = None,
    reward_scale: float | None = None,
    progress: Callable[[int, dict[str, float]], None] | None = None,
) -> BehaviourPolicies:
    """Trains SAC online and keeps the snapshots closest to each quality's target return.

    Args:
        env_id: a registered continuous-action environment.
        version: the artifact version to give the set.
        seed: seed of the whole procedure.
        online: the training budget; by default the id's entry of ``TRAINING_PLANS``
            (``OnlineConfig``'s defaults for an id without one), minutes on a CPU.
        sac: the agent; by default a (64, 64) network (small, so generating data is fast)
            with observations normalized by a random rollout's statistics.
        reward_scale: overrides the default reward scale (1 / std of random rewards).
        progress: host callback after every training chunk.
    """
    env, params = make(env_id)
    key = jax.random.PRNGKey(seed)
    stats_key, train_key, eval_key = jax.random.split(key, 3)
    stats = random_rollout_statistics(stats_key, env, params)
    if sac is None:
        sac = SACConfig(
            hidden=(64, 64),
            reward_scale=reward_scale or 1.0 / max(stats.reward_std, 1e-6),
            reward_shift=-stats.reward_mean,
            obs_mean=tuple(stats.obs_mean.tolist()),
            obs_std=tuple(np.maximum(stats.obs_std, 1e-3).tolist()),
        )
    online = online or OnlineConfig(seed=seed, **TRAINING_PLANS.get(env_id, {}))
    algorithm = make_sac(sac, env.observation_size, env.action_size)
    _, history = train_online(train_key, env, params, algorithm, online, progress=progress)

    horizon = int(params.horizon)
    random_per_step = _mean_return_program(env_id, None)(eval_key, None) / horizon
    # A training evaluation is a few episodes, so the best of many overstates the expert
    # and the nearest to a target may be far from it: the candidates are measured again
    # on more episodes, all with the random policy's key (the same episodes), and the
    # best and the nearest measured ones are kept.
    measure = _mean_return_program(env_id, sac)
    returns_per_step: dict[int, float] = {}

    def measured(evaluation: Any) -> float:
        if evaluation.env_steps not in returns_per_step:
            returns_per_step[evaluation.env_steps] = measure(eval_key, evaluation.policy) / horizon
        return returns_per_step[evaluation.env_steps]

    by_return = sorted(history.evaluations, key=lambda e: e.return_per_step, reverse=True)
    selected = {"expert": max(by_return[:CANDIDATES], key=measured)}
    for quality, fraction in QUALITY_FRACTIONS.items():
        if quality == "expert":
            continue
        target = random_per_step + fraction * (measured(selected["expert"]) - random_per_step)
        nearest = sorted(history.evaluations, key=lambda e: abs(e.return_per_step - target))
        selected[quality] = min(nearest[:CANDIDATES], key=lambda e: abs(measured(e) - target))
    selected = {quality: selected[quality] for quality in QUALITY_FRACTIONS}
    measured_returns = {quality: measured(e) for quality, e in selected.items()}
    return BehaviourPolicies(
        env_id=env_id,
        version=version,
        sac_config=sac,
        returns_per_step={"random": random_per_step, **measured_returns},
        policies={q: evaluation.policy for q, evaluation in selected.items()},
        training={
            "seed": seed,
            "online": dataclasses.asdict(online),
            "wall_time_s": history.evaluations[-1].wall_time_s,
            "env_steps": {q: evaluation.env_steps for q, evaluation in selected.items()},
            "evaluated_return_per_step": {
                q: evaluation.return_per_step for q, evaluation in selected.items()
            },
            "curve": [(e.env_steps, e.return_per_step) for e in history.evaluations],
        },
    )


def open_loop_return(env_id: str, actions: Any) -> float:
    """The return of ``actions`` (``[horizon, action_size]``, plant units) applied in turn
    from the reset of ``env_id`` at its defaults. For a task whose reset and dynamics are
    deterministic, this is the return of the controller that chose them.

    Raises:
        ValueError: naming ``actions`` when their shape is not one action per step.
    """
    env, params = make(env_id)
    actions = jnp.asarray(actions, jnp.float32)
    expected = (int(params.horizon), env.action_size)
    if actions.shape != expected:
        raise ValueError(f"actions: expected shape {expected} for {env_id}, got {actions.shape}")
    key = jax.random.PRNGKey(0)

    def step(state, action):
        state, timestep = env.step_env(key, state, action, params)
        return state, timestep.reward

    state, _ = env.reset(key, params)
    _, rewards = jax.lax.scan(step, state, actions)
    return float(rewards.sum())


#: Discrete environments act with the policies of their continuous twin, discretized.
POLICY_SOURCE = {"IB-discrete-v0": "IB-v0"}


def _discretize(action: jax.Array) -> jax.Array:
    """The index of the nearest of the 27 actions {-1, 0, 1}^3 (velocity varies slowest)."""
    steps = jnp.round(jnp.clip(action, -1.0, 1.0)).astype(jnp.int32) + 1
    return steps[0] * 9 + steps[1] * 3 + steps[2]


def _acting_algorithm(sac: SACConfig, env):
    """SAC acting in ``env``'s units: plant units through the task's action scaler, or
    [-1, 1] for a discrete environment (discretized after)."""
    if env.discrete:
        return make_sac(sac, env.observation_size, 3)
    algorithm = make_sac(sac, env.observation_size, env.action_size)
    return with_action_scaling(algorithm, action_scaler_for(env))


@dataclasses.dataclass(frozen=True)
class _EnvParams:
    """Environment parameters as a cache key: equal when their serialized leaves are."""

    value: Any = dataclasses.field(compare=False)
    serialized: bytes

    @classmethod
    def of(cls, params: Any) -> _EnvParams:
        return cls(params, serialization.to_bytes(params))


@functools.lru_cache(maxsize=8)
def _generator(
    env: Environment, params: _EnvParams, sac: SACConfig | None, size: int, horizon: int
):
    """The compiled program that generates ``size`` trajectories of ``horizon`` steps of
    the uniformly random policy (``sac`` None) or of a SAC behaviour policy with config
    ``sac``. Policy parameters are its argument, so every trained quality, and every
    regeneration, runs one program compiled once. The environment's parameters stay
    constants of the program, folded by XLA as in the programs that made the shipped
    datasets, which regenerate bit for bit."""
    if sac is None:
        policy = uniform_random_policy(env)
    else:
        algorithm = _acting_algorithm(sac, env)
        to_env = _discretize if env.discrete else (lambda action: action)
        policy = behaviour_policy(
            lambda p, obs: to_env(algorithm.act(p, obs, deterministic=True)),
            lambda p, obs, key: to_env(algorithm.act(p, obs, key, deterministic=False)),
            SAMPLE_PROBABILITY,
        )
    return jax.jit(
        lambda key, buffer, policy_params: generate_trajectories(
            key,
            env,
            params.value,
            policy,
            size,
            horizon,
            policy_params=policy_params,
            observation_buffer=buffer,
        ),
        donate_argnums=1,
    )


def _mean_return_program(
    env_id: str, sac: SACConfig | None
) -> Callable[[jax.Array, PolicyParams | None], float]:
    """``measure(key, policy) -> mean episode return`` over ``EVALUATION_EPISODES`` of
    the mean action of a SAC policy with config ``sac``, or of the uniformly random
    policy (``sac`` None, ``policy`` None); compiled once for all policies."""
    env, params = make(env_id)
    if sac is None:
        act = uniform_random_policy(env)
    else:
        algorithm = _acting_algorithm(sac, env)
        act = lambda p, obs, _key: algorithm.act(p, obs, deterministic=True)  # noqa: E731
    horizon = int(params.horizon)
    program = jax.jit(
        lambda key, policy: rollout(
            key, env, params, act, EVALUATION_EPISODES, horizon, policy_params=policy
        ).mean_episode_return()
    )
    return lambda key, policy: float(program(key, policy))


def generate_dataset(
    env_id: str,
    quality: str,
    n_trajectories: int,
    *,
    seed: int = 0,
    policies: BehaviourPolicies | None = None,
    chunk: int = 250,
    env_params: dict[str, Any] | None = None,
) -> tuple[Dataset, DatasetCard]:
    """Generates ``n_trajectories`` full episodes of the behaviour policy of ``quality``.

    ``env_params`` overrides the environment's configuration and parameters (a setpoint,
    the horizon, ...); the card records every parameter the data was generated with. The
    reference returns of normalized scores are measured at the defaults, so a card of
    overridden parameters leaves them out.

    Trajectories are generated ``chunk`` at a time by one compiled program (the last chunk
    is trimmed), so memory stays bounded and the result does not depend on the machine.

    Raises:
        ValueError: for an unknown quality, a non-positive size, or missing policies.
    """
    _check_request(quality, n_trajectories)
    overrides = dict(env_params or {})
    env, params = make(env_id, **overrides)
    trained = quality != "random"
    if trained and policies is None:
        policies = BehaviourPolicies.load(POLICY_SOURCE.get(env_id, env_id))
    horizon = int(params.horizon)
    dt = getattr(params, "dt", None)
    size = min(chunk, n_trajectories)
    generate = _generator(
        env, _EnvParams.of(params), policies.sac_config if trained else None, size, horizon
    )
    arrays = _generate_chunks(
        generate,
        policies.policies[quality] if trained else None,
        jax.random.PRNGKey(seed),
        n_trajectories,
        jnp.zeros((size, horizon + 1, env.observation_size), jnp.float32),
    )
    dataset = Dataset.from_trajectories(**arrays, name=f"{env_id}-{quality}")
    returns = np.asarray(dataset.episode_returns())
    recorded, changed = _recorded_params(env_id, params)
    static = {k: v for k, v in overrides.items() if k not in recorded}
    card = DatasetCard(
        name=f"{env_id}-{quality}-{n_trajectories}",
        description=f"{quality} behaviour on {env_id}: {n_trajectories} trajectories of "
        f"{horizon} steps",
        source="generated",
        env_id=env_id,
        env_params={**recorded, **static},
        behaviour_policy=BehaviourPolicy(
            name=quality,
            version=policies.version if trained else None,
            mean_return=float(returns.mean()),
        ),
        cost_names=list(env.cost_names),
        # The environment's own default limits (its default constraint spec's).
        cost_limits=env.default_cost_limits(),
        seed=seed,
        sampling_period=None if dt is None else float(dt),
        **_reference_fields(None if changed else policies, horizon),
    ).with_sizes(dataset)
    return dataset, card


def _check_request(quality: str, n_trajectories: Any) -> None:
    """Refuses an unknown ``quality`` and a size that is not a positive integer."""
    if quality not in QUALITIES:
        raise ValueError(f"quality: unknown quality {quality!r}; expected one of {QUALITIES}")
    if (
        isinstance(n_trajectories, bool)
        or not isinstance(n_trajectories, int)
        or n_trajectories < 1
    ):
        raise ValueError(f"n_trajectories: expected a positive integer, got {n_trajectories!r}")


def _generate_chunks(
    generate: Callable[..., Any],
    policy_params: PolicyParams | None,
    key: jax.Array,
    n_trajectories: int,
    buffer: jax.Array,
) -> dict[str, np.ndarray]:
    """The trajectory arrays of ``n_trajectories`` episodes, generated by ``generate``
    as many chunks of ``len(buffer)`` as it takes (one key of ``key`` each; the last
    chunk trimmed). Host arrays are filled chunk by chunk; the device buffer of
    observations is reused."""
    size = buffer.shape[0]
    keys = jax.random.split(key, math.ceil(n_trajectories / size))
    arrays: dict[str, np.ndarray] = {}
    for index, chunk_key in enumerate(keys):
        part = generate(chunk_key, buffer, policy_params)
        rows = slice(index * size, min((index + 1) * size, n_trajectories))
        for field in ("observations", "actions", "rewards", "costs", "terminated"):
            values = np.asarray(getattr(part, field))[: rows.stop - rows.start]
            if field not in arrays:
                arrays[field] = np.empty((n_trajectories, *values.shape[1:]), values.dtype)
            arrays[field][rows] = values
        buffer = part.observations
    return arrays


def _reference_fields(policies: BehaviourPolicies | None, horizon: int) -> dict[str, Any]:
    """The card's reference returns of an episode of ``horizon`` steps (None without
    ``policies``, whose returns are measured at the default parameters) and which
    controller the expert return is (its replayed actions stay in the manifest)."""
    if policies is None:
        return {"random_return": None, "expert_return": None}
    expert = policies.expert_reference
    return {
        "random_return": policies.returns_per_step["random"] * horizon,
        "expert_return": expert["return_per_step"] * horizon,
        "expert_reference": {key: expert[key] for key in ("controller", "return_per_step")},
    }


def _recorded_params(env_id: str, params: Any) -> tuple[dict[str, Any], set[str]]:
    """``(recorded, changed)``: every parameter as JSON data (arrays as nested lists, so
    ``make(env_id, **recorded)`` rebuilds them), and the names that differ from the
    defaults of ``env_id`` in value or shape."""
    leaves = dataclasses.asdict(params)
    defaults = dataclasses.asdict(make(env_id)[1])
    changed = {
        name
        for name, value in leaves.items()
        if not np.array_equal(np.asarray(value), np.asarray(defaults[name]))
    }
    return to_json_data(leaves, where="env_params"), changed
