"""The dataset factory: behaviour policies of graded quality and the datasets they make.

Following NeoRL, every registered environment gets datasets of five qualities. ``random``
acts uniformly at random. ``low``, ``medium`` and ``high`` come from behaviour policies
whose return lies about 25, 50 and 75 % of the way from the random policy's return to the
best return reached in training, and ``expert`` from the best policy; they act with their
mean action 80 % of the time and a sampled action 20 %.

Behaviour policies are trained in house with SAC on the JAX environment and kept as
versioned artifacts (a manifest and one file of parameters per quality), so a dataset is
regenerated bit for bit from its environment, quality, size and seed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

import neorl_industrial
from neorl_industrial.core.agents.sac import PolicyParams, SACConfig, make_sac
from neorl_industrial.core.environments import make, rollout, uniform_random_policy
from neorl_industrial.functional.state_management import Dataset
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
from neorl_industrial.wrappers.hostio import atomic_directory

QUALITIES = ("random", "low", "medium", "high", "expert")
#: Where each trained quality sits between the random return (0) and the best return (1).
QUALITY_FRACTIONS = {"low": 0.25, "medium": 0.5, "high": 0.75, "expert": 1.0}
#: Probability that a behaviour policy acts with a sampled instead of its mean action.
SAMPLE_PROBABILITY = 0.2
#: Dataset sizes by name, in trajectories.
SIZES = {"small": 100, "medium": 1000, "large": 10000}
#: Behaviour policies shipped with the package.
POLICY_ROOT = Path(__file__).parent / "behaviour_policies"
MANIFEST = "manifest.json"


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
    """

    env_id: str
    version: str
    sac_config: SACConfig
    returns_per_step: dict[str, float]
    policies: dict[str, PolicyParams]
    training: dict[str, Any] = dataclasses.field(default_factory=dict)

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
                "package_version": neorl_industrial.__version__,
                "sac_config": dataclasses.asdict(self.sac_config),
                "returns_per_step": self.returns_per_step,
                "qualities": sorted(self.policies),
                "training": self.training,
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
        config = SACConfig(
            **{**manifest["sac_config"], "hidden": tuple(manifest["sac_config"]["hidden"])}
        )
        env, _ = make(env_id)
        template = (
            make_sac(config, env.observation_size, env.action_size)
            .init(jax.random.PRNGKey(0))
            .policy
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
        online: the training budget; a default that fits a CPU in minutes.
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
    online = online or OnlineConfig(seed=seed)
    algorithm = make_sac(sac, env.observation_size, env.action_size)
    _, history = train_online(train_key, env, params, algorithm, online, progress=progress)

    horizon = int(params.horizon)
    random_per_step = _mean_return(eval_key, env_id, None, None) / horizon
    best = history.best()
    selected: dict[str, Any] = {}
    for quality, fraction in QUALITY_FRACTIONS.items():
        target = random_per_step + fraction * (best.return_per_step - random_per_step)
        selected[quality] = best if quality == "expert" else history.closest(target)
    return BehaviourPolicies(
        env_id=env_id,
        version=version,
        sac_config=sac,
        returns_per_step={
            "random": random_per_step,
            **{q: evaluation.return_per_step for q, evaluation in selected.items()},
        },
        policies={q: evaluation.policy for q, evaluation in selected.items()},
        training={
            "seed": seed,
            "online": dataclasses.asdict(online),
            "wall_time_s": history.evaluations[-1].wall_time_s,
            "env_steps": {q: evaluation.env_steps for q, evaluation in selected.items()},
            "curve": [(e.env_steps, e.return_per_step) for e in history.evaluations],
        },
    )


#: Discrete environments act with the policies of their continuous twin, discretized.
POLICY_SOURCE = {"IB-discrete-v0": "IB-v0"}


def _discretize(action: jax.Array) -> jax.Array:
    """The index of the nearest of the 27 actions {-1, 0, 1}^3 (velocity varies slowest)."""
    steps = jnp.round(jnp.clip(action, -1.0, 1.0)).astype(jnp.int32) + 1
    return steps[0] * 9 + steps[1] * 3 + steps[2]


def _policy_functions(policies: BehaviourPolicies | None, quality: str, env) -> tuple[Any, Any]:
    """``(policy, policy_params)`` acting as the behaviour policy of ``quality``."""
    if quality == "random":
        return uniform_random_policy(env), None
    algorithm = make_sac(
        policies.sac_config, env.observation_size, 3 if env.discrete else env.action_size
    )
    to_env = _discretize if env.discrete else (lambda action: action)
    policy = behaviour_policy(
        lambda p, obs: to_env(algorithm.act(p, obs, deterministic=True)),
        lambda p, obs, key: to_env(algorithm.act(p, obs, key)),
        SAMPLE_PROBABILITY,
    )
    return policy, policies.policies[quality]


def _mean_return(key, env_id: str, policies: BehaviourPolicies | None, quality: str | None):
    env, params = make(env_id)
    if quality is None:
        policy, policy_params = uniform_random_policy(env), None
    else:
        algorithm = make_sac(policies.sac_config, env.observation_size, env.action_size)
        policy = lambda p, obs, _key: algorithm.act(p, obs, deterministic=True)  # noqa: E731
        policy_params = policies.policies[quality]
    horizon = int(params.horizon)
    result = jax.jit(
        lambda k: rollout(k, env, params, policy, 64, horizon, policy_params=policy_params)
    )(key)
    return float(result.mean_episode_return())


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
    if quality not in QUALITIES:
        raise ValueError(f"quality: unknown quality {quality!r}; expected one of {QUALITIES}")
    if (
        isinstance(n_trajectories, bool)
        or not isinstance(n_trajectories, int)
        or n_trajectories < 1
    ):
        raise ValueError(f"n_trajectories: expected a positive integer, got {n_trajectories!r}")
    overrides = dict(env_params or {})
    env, params = make(env_id, **overrides)
    if quality != "random" and policies is None:
        policies = BehaviourPolicies.load(POLICY_SOURCE.get(env_id, env_id))
    policy, policy_params = _policy_functions(policies, quality, env)
    horizon = int(params.horizon)
    size = min(chunk, n_trajectories)
    generate = jax.jit(
        lambda key, buffer: generate_trajectories(
            key,
            env,
            params,
            policy,
            size,
            horizon,
            policy_params=policy_params,
            observation_buffer=buffer,
        ),
        donate_argnums=1,
    )
    n_chunks = math.ceil(n_trajectories / size)
    keys = jax.random.split(jax.random.PRNGKey(seed), n_chunks)
    # Host arrays are filled chunk by chunk; the device buffer of observations is reused.
    arrays: dict[str, np.ndarray] = {}
    buffer = jnp.zeros((size, horizon + 1, env.observation_size), jnp.float32)
    for index, key in enumerate(keys):
        part = generate(key, buffer)
        rows = slice(index * size, min((index + 1) * size, n_trajectories))
        for field in ("observations", "actions", "rewards", "costs", "terminated"):
            values = np.asarray(getattr(part, field))[: rows.stop - rows.start]
            if field not in arrays:
                arrays[field] = np.empty((n_trajectories, *values.shape[1:]), values.dtype)
            arrays[field][rows] = values
        buffer = part.observations
    dataset = Dataset.from_trajectories(**arrays, name=f"{env_id}-{quality}")
    returns = np.asarray(dataset.episode_returns())
    defaults = dataclasses.asdict(make(env_id)[1])
    recorded = {k: np.asarray(v).item() for k, v in dataclasses.asdict(params).items()}
    changed = {k for k, v in recorded.items() if np.asarray(defaults[k]).item() != v}
    static = {k: v for k, v in overrides.items() if k not in recorded}
    reference = policies.returns_per_step if policies is not None and not changed else None
    card = DatasetCard(
        name=f"{env_id}-{quality}-{n_trajectories}",
        description=f"{quality} behaviour on {env_id}: {n_trajectories} trajectories of "
        f"{horizon} steps",
        source="generated",
        env_id=env_id,
        env_params={**recorded, **static},
        behaviour_policy=BehaviourPolicy(
            name=quality,
            version=None if quality == "random" else policies.version,
            mean_return=float(returns.mean()),
        ),
        random_return=None if reference is None else reference["random"] * horizon,
        expert_return=None if reference is None else reference["expert"] * horizon,
        cost_names=list(env.cost_names),
        # The environment's own default limits (its default constraint spec's).
        cost_limits={
            name: limit
            for name, limit in env.default_constraints().cost_limits.items()
            if name in env.cost_names
        },
        seed=seed,
    ).with_sizes(dataset)
    return dataset, card
