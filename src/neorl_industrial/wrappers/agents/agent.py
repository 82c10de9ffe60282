"""``Agent``: an offline agent for people, over the pure core.

    agent = Agent("td3bc-lag", env="IB-v0", hidden=(64, 64))
    result = agent.fit(dataset, updates=5000, eval_every=1000)
    action = agent.predict(observation, prev_action)      # passed through the shield
    agent.save("runs/td3bc-lag/agent"); Agent.load("runs/td3bc-lag/agent")
    agent.export("runs/td3bc-lag/policy")                  # served without training code

An agent knows its environment (spaces, names, simulator for evaluation), its hard
constraints (the shield's, from a ``ConstraintSpec``; the environment's defaults unless
given) and its cost limits (from the spec unless given). ``fit`` trains one run per seed
at once and keeps each run's best policy by the safety-aware criterion; ``predict`` uses
the best run's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

import neorl_industrial
from neorl_industrial.core.agents.registry import (
    HyperparameterError,
    algorithm_entry,
    build_algorithm,
    validate_hyperparameters,
)
from neorl_industrial.core.environments import make
from neorl_industrial.core.safety import ConstraintSpec, shield
from neorl_industrial.core.safety import cost_limits as spec_cost_limits
from neorl_industrial.core.safety.shield import SafetyReport
from neorl_industrial.functional.state_management import (
    Dataset,
    init_train_states,
    select_safe_episodes,
)
from neorl_industrial.wrappers.training import (
    Callback,
    Evaluator,
    RunConfig,
    Trainer,
    TrainResult,
    summarize_runs,
)

__all__ = ["Agent", "AgentError"]

FORMAT = "neorl-industrial-agent/1"
MANIFEST = "agent.json"
POLICIES = "policies.msgpack"


class AgentError(ValueError):
    """An agent that cannot do what was asked: names the argument, file or field."""


class Agent:
    """An offline agent: fit, predict, evaluate, save, load, export.

    Args:
        algorithm: a registered algorithm (``bc``, ``bc-safe``, ``td3bc``, ``td3bc-lag``,
            ``iql``, ``iql-lag``, ``cql``, ``discrete-bc``, ``discrete-cql``).
        env: a registered environment id.
        env_params: overrides of the environment's configuration and parameters.
        constraints: the hard constraints and costs: a ``ConstraintSpec``, a YAML file, or
            None for the environment's defaults.
        cost_limits: episode cost limit per cost channel; None: the spec's.
        **hyperparameters: what differs from the algorithm's published defaults.
    """

    def __init__(
        self,
        algorithm: str = "td3bc-lag",
        env: str = "IB-v0",
        *,
        env_params: dict[str, Any] | None = None,
        constraints: ConstraintSpec | str | Path | None = None,
        cost_limits: Sequence[float] | None = None,
        **hyperparameters: Any,
    ) -> None:
        try:
            self.entry = algorithm_entry(algorithm)
        except HyperparameterError as error:
            raise AgentError(str(error)) from None
        self.env_id = env
        self.env_params = dict(env_params or {})
        try:
            self.env, self.params = make(env, **self.env_params)
        except ValueError as error:
            raise AgentError(f"env: {error}") from None
        if self.entry.discrete != self.env.discrete:
            kind = "discrete" if self.entry.discrete else "continuous"
            raise AgentError(
                f"algorithm: {self.entry.name} needs {kind} actions; environment {env} has "
                f"{'discrete' if self.env.discrete else 'continuous'} ones"
            )
        if constraints is None:
            spec = self.env.default_constraints()
        elif isinstance(constraints, ConstraintSpec):
            spec = constraints
        else:
            spec = ConstraintSpec.from_yaml(constraints)
        self.constraint_spec: ConstraintSpec = spec
        self.constraints = self.env.compile_constraints(spec)
        spec_limits = list(spec_cost_limits(self.constraints).values())
        limits = list(cost_limits) if cost_limits is not None else spec_limits
        if limits and len(limits) != self.env.n_costs:
            raise AgentError(
                f"cost_limits: expected one episode cost limit per cost channel of {env} "
                f"({', '.join(self.env.cost_names)}), got {len(limits)}"
            )
        if any(not np.isfinite(limit) or limit <= 0 for limit in limits):
            raise AgentError(f"cost_limits: expected positive numbers, got {limits}")
        self.cost_limits: list[float] | None = [float(x) for x in limits] or None
        self.hyperparameters = dict(hyperparameters)
        if self.entry.safe:
            if self.cost_limits is None:
                raise AgentError(
                    f"cost_limits: {self.entry.name} needs episode cost limits; give "
                    "cost_limits or a constraint spec with costs"
                )
            defaults = {"cost_limits": self.cost_limits}
            fields = self.entry.fields
            if "episode_length" in fields:
                defaults["episode_length"] = int(self.params.horizon)
            self.hyperparameters = {**defaults, **self.hyperparameters}
        try:
            validate_hyperparameters(self.entry.name, self.hyperparameters)
        except HyperparameterError as error:
            raise AgentError(str(error)) from None
        self.algorithm: Any = None
        self.config: Any = None
        self.policies: Any = None  # stacked PolicyParams, one per run
        self.seeds: list[int] = []
        self.selected = 0
        self.result: TrainResult | None = None
        self.training: dict[str, Any] = {}
        self._decide: Any = None

    # ----- construction -----------------------------------------------------------------
    @classmethod
    def from_config(cls, config: RunConfig | str | Path, overrides: Sequence[str] = ()) -> Agent:
        """The agent a :class:`RunConfig` (or its YAML file) describes."""
        if not isinstance(config, RunConfig):
            config = RunConfig.from_yaml(config, list(overrides))
        elif overrides:
            config = config.with_overrides(list(overrides))
        return cls(
            config.algorithm.name,
            config.env.id,
            env_params=config.env.params,
            constraints=config.safety.constraints,
            cost_limits=config.safety.cost_limits,
            **config.algorithm.hyperparameters,
        )

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def fitted(self) -> bool:
        return self.policies is not None

    def _build(self, hyperparameters: dict[str, Any]) -> None:
        try:
            self.algorithm, self.config = build_algorithm(
                self.entry.name,
                self.env.observation_size,
                self.env.num_actions if self.entry.discrete else self.env.action_size,
                hyperparameters,
            )
        except HyperparameterError as error:
            raise AgentError(str(error)) from None
        self._decide = None

    # ----- training -------------------------------------------------------------------
    def check_dataset(self, dataset: Dataset) -> None:
        """Raises :class:`AgentError` when ``dataset`` does not fit the agent's spaces."""
        name = getattr(dataset, "name", None) or "dataset"
        if dataset.observation_size != self.env.observation_size:
            raise AgentError(
                f"{name}: observations have {dataset.observation_size} features; "
                f"{self.env_id} has {self.env.observation_size}"
            )
        if dataset.discrete != self.env.discrete:
            raise AgentError(
                f"{name}: {'discrete' if dataset.discrete else 'continuous'} actions; "
                f"{self.env_id} has {'discrete' if self.env.discrete else 'continuous'} ones"
            )
        if not dataset.discrete and dataset.action_size != self.env.action_size:
            raise AgentError(
                f"{name}: actions have {dataset.action_size} dimensions; "
                f"{self.env_id} has {self.env.action_size}"
            )
        if self.entry.safe and dataset.n_costs != len(self.cost_limits or []):
            raise AgentError(
                f"{name}: {dataset.n_costs} cost channels; {self.entry.name} has "
                f"{len(self.cost_limits or [])} cost limits"
            )

    def fit(
        self,
        dataset: Dataset,
        *,
        updates: int = 5000,
        seeds: Sequence[int] = (0,),
        batch_size: int = 256,
        chunk: int = 1000,
        eval_every: int = 0,
        eval_episodes: int = 10,
        eval_horizon: int | None = None,
        eval_shield: bool = True,
        eval_seed: int = 0,
        patience: int | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 0,
        keep_checkpoints: int = 2,
        resume: bool = False,
        callbacks: Sequence[Callback] = (),
        normalize_observations: bool = True,
        reward_scaling: str = "std",
        evaluate: bool = True,
    ) -> TrainResult:
        """Trains one run per seed on ``dataset`` (all at once) and keeps each run's best
        policy. Evaluation runs in the environment's simulator with the shield: every
        ``eval_every`` updates and at the end (``evaluate=False``: never; the final
        policies are kept).

        ``reward_scaling``: ``std`` divides rewards by their spread for training (the
        policy's returns are unchanged); ``none`` keeps them. Costs are never scaled.

        Raises:
            AgentError: for data that does not fit the agent, or bad settings.
            CheckpointMismatchError: when resuming from another run's checkpoint.
        """
        self.check_dataset(dataset)
        if reward_scaling not in ("std", "none"):
            raise AgentError(f"reward_scaling: expected 'std' or 'none', got {reward_scaling!r}")
        data = dataset
        if self.entry.select_safe_data:
            try:
                data = select_safe_episodes(dataset, self.cost_limits or [])
            except ValueError as error:
                raise AgentError(f"{self.entry.name}: {error}") from None
        hyperparameters = dict(self.hyperparameters)
        if normalize_observations:
            observations = np.asarray(jax.device_get(data.observations), np.float64)
            hyperparameters["obs_mean"] = observations.mean(0).tolist()
            hyperparameters["obs_std"] = observations.std(0).tolist()
        if reward_scaling == "std":
            spread = float(np.asarray(jax.device_get(data.rewards), np.float64).std())
            data = data.replace(rewards=data.rewards / max(spread, 1e-6))
        self._build(hyperparameters)
        evaluator = None
        if evaluate:
            evaluator = self._evaluator(eval_episodes, eval_horizon, eval_shield, eval_seed)
        trainer = Trainer(
            self.algorithm,
            data,
            seeds=seeds,
            batch_size=batch_size,
            chunk_updates=chunk,
            evaluator=evaluator,
            eval_every=eval_every,
            patience=patience,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            keep_checkpoints=keep_checkpoints,
            callbacks=callbacks,
            fingerprint={
                "algorithm": self.entry.name,
                "config": _plain(dataclasses.asdict(self.config)),
                "env": self.env_id,
                "env_params": self.env_params,
                "reward_scaling": reward_scaling,
                "constraints": self.constraint_spec.to_yaml(),
            },
        )
        try:
            result = trainer.fit(updates, resume=resume)
        except ValueError as error:
            if type(error) is ValueError:
                raise AgentError(str(error)) from None
            raise
        self.result = result
        self.policies = result.best_policies
        self.seeds = list(trainer.seeds)
        self.selected = result.best_run
        # The observation statistics are part of the trained agent's configuration.
        self.hyperparameters = hyperparameters
        self.training = {
            "updates": int(result.state.updates[0]),
            "seeds": self.seeds,
            "batch_size": batch_size,
            "reward_scaling": reward_scaling,
            "dataset": {
                "name": getattr(dataset, "name", None),
                "transitions": dataset.n_transitions,
                "episodes": dataset.n_episodes,
                "used_episodes": data.n_episodes,
            },
            "best": result.best,
            "summary": result.summary,
            "selected_run": self.selected,
            "stopped_early": result.stopped_early,
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        return result

    def _evaluator(
        self, episodes: int, horizon: int | None, shield_actions: bool, seed: int
    ) -> Evaluator:
        return Evaluator(
            self.algorithm,
            self.env,
            self.params,
            episodes=episodes,
            horizon=int(horizon or self.params.horizon),
            constraints=self.constraints,
            shield=shield_actions,
            cost_limits=self.cost_limits,
            cost_names=self.env.cost_names,
            seed=seed,
        )

    def _require_fitted(self, what: str) -> None:
        if not self.fitted:
            raise AgentError(f"{what}: the agent has no policy yet; fit or load it first")

    # ----- acting ----------------------------------------------------------------------
    def policy(self, run: int | None = None) -> Any:
        """The policy parameters of ``run`` (default: the selected, best run)."""
        self._require_fitted("policy")
        index = self.selected if run is None else run
        if not 0 <= index < len(self.seeds):
            raise AgentError(f"run: expected 0 <= run < {len(self.seeds)}, got {run}")
        return jax.tree.map(lambda leaf: leaf[index], self.policies)

    def decide(
        self,
        observation: Any,
        prev_action: Any = None,
        *,
        run: int | None = None,
        shield_actions: bool = True,
    ) -> tuple[np.ndarray, SafetyReport | None]:
        """The action(s) for one observation ``[obs]`` or a batch ``[b, obs]`` and the
        shield's report (None with ``shield_actions=False``). ``prev_action`` is the action
        applied at the previous step (rate limits); None: zeros, the start of an episode.
        """
        self._require_fitted("predict")
        obs = np.asarray(observation, np.float32)
        size = self.env.observation_size
        if obs.ndim not in (1, 2) or obs.shape[-1] != size:
            raise AgentError(
                f"observation: expected shape [{size}] or [batch, {size}], got {obs.shape}"
            )
        if not np.all(np.isfinite(obs)):
            raise AgentError("observation: expected finite numbers (got NaN or infinity)")
        single = obs.ndim == 1
        batch = obs[None] if single else obs
        if self.entry.discrete:
            actions = np.asarray(self._act_batch(self.policy(run), batch))
            return (actions[0] if single else actions), None
        if prev_action is None:
            prev = np.zeros((batch.shape[0], self.env.action_size), np.float32)
        else:
            prev = np.asarray(prev_action, np.float32).reshape(batch.shape[0], -1)
            if prev.shape[1] != self.env.action_size:
                raise AgentError(
                    f"prev_action: expected {self.env.action_size} values per observation, "
                    f"got shape {np.shape(prev_action)}"
                )
        if not shield_actions:
            actions = np.asarray(self._act_batch(self.policy(run), batch))
            return (actions[0] if single else actions), None
        if self._decide is None:
            act, constraints = self.algorithm.act, self.constraints

            def decide(policy: Any, observations: jax.Array, previous: jax.Array) -> Any:
                proposed = jax.vmap(lambda o: act(policy, o, None, deterministic=True))(
                    observations
                )
                return shield(constraints, observations, proposed, previous)

            self._decide = jax.jit(decide)
        safe, report = jax.device_get(self._decide(self.policy(run), batch, prev))
        if single:
            return np.asarray(safe[0]), jax.tree.map(lambda leaf: leaf[0], report)
        return np.asarray(safe), report

    def _act_batch(self, policy: Any, batch: np.ndarray) -> jax.Array:
        act = self.algorithm.act
        return jax.jit(jax.vmap(lambda o: act(policy, o, None, deterministic=True)))(batch)

    def predict(
        self, observation: Any, prev_action: Any = None, *, run: int | None = None
    ) -> np.ndarray:
        """The shielded action(s) for one observation or a batch (see :meth:`decide`)."""
        return self.decide(observation, prev_action, run=run)[0]

    def evaluate(
        self,
        episodes: int = 100,
        *,
        horizon: int | None = None,
        shield_actions: bool = True,
        seed: int = 1,
    ) -> dict[str, Any]:
        """Every run's policy over ``episodes`` simulated episodes (all at once): the
        metrics per run and their mean and 95 % confidence interval over runs."""
        self._require_fitted("evaluate")
        evaluator = self._evaluator(episodes, horizon, shield_actions, seed)
        runs = evaluator(self.policies, 0)
        return {"runs": runs, "summary": summarize_runs(runs), "selected_run": self.selected}

    # ----- files -------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        """What :meth:`save` writes next to the parameters."""
        return {
            "format": FORMAT,
            "neorl_industrial": neorl_industrial.__version__,
            "jax": jax.__version__,
            "algorithm": self.entry.name,
            "hyperparameters": _plain(self.hyperparameters),
            "env": {"id": self.env_id, "params": self.env_params},
            "observation_size": self.env.observation_size,
            "action_size": self.env.action_size,
            "observation_names": list(self.env.observation_names),
            "action_names": list(self.env.action_names),
            "constraints": self.constraint_spec.to_yaml(),
            "cost_limits": self.cost_limits,
            "cost_names": list(self.env.cost_names),
            "seeds": self.seeds,
            "selected_run": self.selected,
            "training": _plain(self.training),
        }

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Writes the agent to the directory ``path`` atomically: ``agent.json`` (config,
        environment, constraint spec, cost limits, versions, training summary) and
        ``policies.msgpack`` (every run's policy, normalizer included).

        Raises:
            AgentError: before fitting, or when ``path`` exists and ``overwrite`` is False
                (nothing is written then).
        """
        self._require_fitted("save")
        manifest = json.dumps(self.manifest(), indent=2, allow_nan=False)
        policies = serialization.to_bytes(jax.device_get(self.policies))
        return _write_directory(
            Path(path), {MANIFEST: manifest.encode(), POLICIES: policies}, overwrite
        )

    @classmethod
    def load(cls, path: str | Path) -> Agent:
        """The agent saved at ``path``: predicts exactly as it did when saved.

        Raises:
            AgentError: naming the file that is missing, unreadable or of another format.
        """
        path = Path(path)
        manifest_path = path / MANIFEST
        try:
            manifest = json.loads(manifest_path.read_text())
        except FileNotFoundError:
            raise AgentError(f"{manifest_path}: missing; {path} is not a saved agent") from None
        except json.JSONDecodeError as error:
            raise AgentError(f"{manifest_path}: not valid JSON ({error})") from None
        if manifest.get("format") != FORMAT:
            raise AgentError(
                f"{manifest_path}: format {manifest.get('format')!r}; this version reads {FORMAT!r}"
            )
        hyperparameters = dict(manifest["hyperparameters"])
        agent = cls(
            manifest["algorithm"],
            manifest["env"]["id"],
            env_params=manifest["env"]["params"],
            constraints=ConstraintSpec.from_yaml_text(manifest["constraints"], str(manifest_path)),
            cost_limits=manifest["cost_limits"],
            **{key: value for key, value in hyperparameters.items() if key != "cost_limits"},
        )
        agent._build(hyperparameters)
        agent.seeds = [int(seed) for seed in manifest["seeds"]]
        template = init_train_states(agent.algorithm, agent.seeds).agent.policy
        try:
            policies = serialization.from_bytes(template, (path / POLICIES).read_bytes())
        except FileNotFoundError:
            raise AgentError(f"{path / POLICIES}: missing") from None
        except (ValueError, KeyError, TypeError) as error:
            raise AgentError(
                f"{path / POLICIES}: does not match the saved configuration ({error})"
            ) from None
        agent.policies = jax.tree.map(jnp.asarray, policies)
        agent.selected = int(manifest["selected_run"])
        agent.training = manifest.get("training", {})
        return agent

    def export(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Writes a self-contained policy artifact (the selected run's policy, its
        normalizer and the shield, compiled and serialized) that the policy server loads
        without any training code; see :mod:`neorl_industrial.wrappers.agents.export`."""
        self._require_fitted("export")
        if self.entry.discrete:
            raise AgentError(
                "export: exported artifacts serve continuous actions through the shield; "
                f"{self.entry.name} acts on discrete ones"
            )
        from neorl_industrial.wrappers.agents.export import export_policy

        act = self.algorithm.act
        return export_policy(
            path,
            act=lambda policy, observation: act(policy, observation, None, deterministic=True),
            policy_params=self.policy(),
            observation_size=self.env.observation_size,
            action_size=self.env.action_size,
            constraints_spec=self.constraint_spec,
            observation_names=list(self.env.observation_names),
            action_names=list(self.env.action_names),
            action_low=np.asarray(self.env.action_low, np.float32),
            action_high=np.asarray(self.env.action_high, np.float32),
            metadata={
                "algorithm": self.entry.name,
                "env": self.env_id,
                "seed": self.seeds[self.selected],
                "cost_limits": self.cost_limits,
                "training": _plain(self.training),
            },
            overwrite=overwrite,
        )


def _plain(value: Any) -> Any:
    """JSON-ready: tuples to lists, numpy to Python numbers."""
    return json.loads(json.dumps(value, default=_default))


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


def _write_directory(path: Path, files: dict[str, bytes], overwrite: bool) -> Path:
    """Writes ``files`` into the directory ``path`` all or nothing: into a temporary
    sibling first, then renamed into place (an existing one is replaced only with
    ``overwrite``, and only after the new one is complete)."""
    path = path.absolute()
    if path.exists() and not overwrite:
        raise AgentError(f"{path}: already exists; pass overwrite=True to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        for name, data in files.items():
            with open(staging / name, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        if path.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.replace(path, retired / path.name)
            os.replace(staging, path)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path
