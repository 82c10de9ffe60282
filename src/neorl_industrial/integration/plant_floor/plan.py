"""What the bridge decides with, checked before anything connects: the map, the task it
is for, the policy (loaded, verified, checked and compiled by the policy server's own
loader, :func:`~neorl_industrial.integration.deployment.policy.load_policy_source`, under
the same trust rules as ``serve``), the shield's fallback and the sampling period.

Every refusal is a named error (:mod:`.errors`): a map naming a feature the task lacks, a
node id that is not one, units that disagree, a policy exported for another task, and
closed loop asked of a policy without a verified signature by a trusted key, whatever
``allow_unsigned`` says.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.core.environments.history import frame_of
from neorl_industrial.core.units import Conversion
from neorl_industrial.integration.plant_floor.errors import (
    BridgeError,
    ClosedLoopRefused,
    MapError,
    PolicyTaskError,
    UnitMismatchError,
)
from neorl_industrial.integration.plant_floor.mapping import PlantMap, check_map, load_map

__all__ = ["MODES", "BridgePlan", "prepare"]

log = logging.getLogger("neorl_industrial.bridge")

MODES = ("shadow", "closed-loop")


@dataclasses.dataclass
class BridgePlan:
    """A checked map, task and policy: what :class:`~.bridge.PlantBridge` runs."""

    mode: str
    plant_map: PlantMap
    map_path: Path
    loaded: Any  # a LoadedPolicy
    task: Any  # the ServedTask the policy is served for
    check: Any  # the server's ServerCheck: the fallback's shield
    period: float
    stale_after: float
    task_file: str | None = None
    #: Node unit into task unit, of each binding that converts (``observations.<name>``,
    #: ``actions.<name>``).
    conversions: dict[str, Conversion] = dataclasses.field(default_factory=dict)

    @property
    def closed_loop(self) -> bool:
        return self.mode == "closed-loop"

    @property
    def observation_names(self) -> tuple[str, ...]:
        """The policy's observation (earlier rows included, where it stacks them)."""
        return tuple(self.task.observation_names)

    @property
    def read_names(self) -> tuple[str, ...]:
        """The features read every tick: the newest row of the observation."""
        return frame_of(self.observation_names)[0]

    @property
    def history(self) -> int:
        """Rows per observation: the bridge keeps the last ``history - 1`` rows read."""
        return frame_of(self.observation_names)[1]

    @property
    def action_names(self) -> tuple[str, ...]:
        return tuple(self.task.action_names)

    @property
    def action_low(self) -> np.ndarray:
        return np.asarray(self.task.action_low, np.float64)

    @property
    def action_high(self) -> np.ndarray:
        return np.asarray(self.task.action_high, np.float64)

    @property
    def rate_limits(self) -> np.ndarray:
        """Per action, the largest change per decision its rate limits allow, in the
        task's unit (``inf``: none)."""
        compiled = self.check.compiled
        limits = np.full(len(self.action_names), np.inf)
        for k, j in enumerate(compiled.rate_index):
            limits[j] = min(limits[j], float(np.asarray(compiled.rate_limit)[k]))
        return limits

    def converter(self, binding: str) -> Conversion | None:
        """The conversion of ``binding`` (``observations.<name>`` or ``actions.<name>``),
        node unit into task unit; ``None``: the same unit."""
        return self.conversions.get(binding)

    def fallback(self, observation: np.ndarray, prev_action: np.ndarray) -> np.ndarray:
        """The task's fallback for a tick whose readings cannot be trusted: the server's
        shield given no usable proposal (the fallback, projected onto every constraint
        that the usable readings allow to check)."""
        proposal = np.full((1, len(self.action_names)), np.nan, np.float32)
        action, _ = self.check.repair(
            np.asarray(observation, np.float32)[None],
            np.asarray(prev_action, np.float32)[None],
            proposal,
        )
        return np.asarray(action[0], np.float64)

    def header(self) -> dict[str, Any]:
        """What the tick log's header says about the plan."""
        loaded = self.loaded
        artifact = loaded.artifact
        return {
            "mode": self.mode,
            "policy": {
                "version": loaded.version,
                "source": loaded.source,
                "registry": loaded.registry or None,
                "signature": artifact.signature,
                "manifest_sha256": artifact.manifest.get("manifest_sha256"),
            },
            "task": {
                "file": self.task_file,
                "observation_names": list(self.observation_names),
                "history": self.history,
                "action_names": list(self.action_names),
                "observation_units": list(self.task.observation_units),
                "action_units": list(self.task.action_units),
                "action_low": self.action_low.tolist(),
                "action_high": self.action_high.tolist(),
            },
            "constraints": list(loaded.names),
            "fallback": artifact.manifest["constraints"].get("fallback"),
            "map": {"file": str(self.map_path), "sha256": self.plant_map.digest()},
            "sampling_period": self.period,
            "stale_after": self.stale_after,
            "on_fault": self.plant_map.on_fault,
            "conversions": {
                binding: {
                    "from": found.source,
                    "to": found.target,
                    "scale": found.scale,
                    "offset": found.offset,
                }
                for binding, found in self.conversions.items()
            },
            "rate_limits": {
                name: float(limit)
                for name, limit in zip(self.action_names, self.rate_limits.tolist(), strict=True)
                if np.isfinite(limit)
            },
        }


def _task_of(path: Path, where: str) -> Any:
    from neorl_industrial.integration.deployment.pin import load_pinned_task

    try:
        task, _ = load_pinned_task(path)
    except ValueError as error:
        raise MapError(f"{where}: task: {error}") from None
    return task


def _map_and_task(map_path: Path, task_file: str | Path | None) -> tuple[PlantMap, Any, Any]:
    """The map, the task file (default: the map's ``task``) and the task read from it
    (``None`` without one), checked against the map."""
    from neorl_industrial.integration.deployment.pin import ServedTask

    plant_map = load_map(map_path)
    where = str(map_path)
    if task_file is None and plant_map.task is not None:
        task_file = map_path.parent / plant_map.task
    task = None
    if task_file is not None:
        task = _task_of(Path(task_file), where)
        check_map(plant_map, ServedTask.of_task(task), f"{where} (task {task_file})")
    return plant_map, task_file, task


def _refuse_unsigned(model: str) -> None:
    """Refuses closed loop for a local policy directory without a signature, before it is
    loaded."""
    from neorl_industrial.wrappers.agents.signing import SIGNATURE

    local = Path(model)
    if (
        not model.startswith(("models:/", "runs:/"))
        and local.is_dir()
        and not (local / SIGNATURE).is_file()
    ):
        raise ClosedLoopRefused(
            f"{model}: unsigned (no {SIGNATURE}); closed loop writes to the plant and "
            "runs only a policy signed by a trusted key (export it with --sign-key), "
            "whatever --allow-unsigned says; shadow mode can run it"
        )


def _trust(
    trusted_keys: list[Path] | None,
    pinned_constraints: str | Path | None,
    task_file: Any,
    *,
    allow_unsigned: bool,
    closed_loop: bool,
) -> Any:
    """The ``PolicyTrust`` the policy is loaded under: the keys named, else ``serve``'s
    default key; closed loop needs one."""
    from neorl_industrial.integration.deployment.policy import PolicyTrust
    from neorl_industrial.integration.deployment.settings import (
        DEFAULT_TRUSTED_KEY,
        SettingsError,
    )

    keys = list(trusted_keys or [])
    if not keys and DEFAULT_TRUSTED_KEY.is_file():
        keys = [DEFAULT_TRUSTED_KEY]
    if closed_loop and not keys:
        raise ClosedLoopRefused(
            "closed loop: no trusted key to verify the policy's signature with (--trusted-key, "
            "or keys/policy-signing.pub in the working directory)"
        )
    try:
        # The task pinned as ``serve`` pins it: a policy for another task is refused
        # right after its files are verified, before its function is probed or compiled.
        return PolicyTrust.from_files(
            keys, pinned_constraints, task_file, allow_unsigned=allow_unsigned
        )
    except SettingsError as error:
        raise BridgeError(str(error).replace("NEORL_SERVE_TRUSTED_KEYS", "--trusted-key")) from None


def _load(model: str, tracking_uri: str | None, trust: Any, *, closed_loop: bool) -> Any:
    """The policy, loaded by the server's loader under ``trust``; in closed loop only one
    whose signature a trusted key verifies."""
    from neorl_industrial.integration.deployment.policy import load_policy_source
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifactError

    try:
        loaded = load_policy_source(model, tracking_uri, [1], trust=trust)
    except PolicyArtifactError as error:
        if "pinned task" in str(error):
            raise PolicyTaskError(
                f"{model}: exported for another task than the map's: {error}"
            ) from None
        if closed_loop and "unsigned" in str(error):
            raise ClosedLoopRefused(f"closed loop: {error}") from None
        raise
    signature = loaded.artifact.signature or {}
    if closed_loop and not signature.get("verified"):
        raise ClosedLoopRefused(
            f"{model}: closed loop runs only a policy whose signature a trusted key verifies; "
            f"this one's: {signature or 'none'}"
        )
    return loaded


def _conversions(
    plant_map: PlantMap, served: Any, where: str, model: str, task: Any
) -> dict[str, Conversion]:
    """The map checked against the task the policy is served for, and its conversions;
    without a task file, a misfit is the policy's."""
    try:
        return check_map(plant_map, served, where)
    except MapError as error:
        if task is not None:
            raise
        if isinstance(error, UnitMismatchError):
            raise UnitMismatchError(f"{error} (the units of the policy's task)") from None
        raise PolicyTaskError(
            f"{model}: the policy's task does not fit the map {where}: {error}"
        ) from None


def prepare(
    model: str,
    map_path: str | Path,
    *,
    mode: str = "shadow",
    trusted_keys: list[Path] | None = None,
    allow_unsigned: bool = False,
    task_file: str | Path | None = None,
    pinned_constraints: str | Path | None = None,
    tracking_uri: str | None = None,
) -> BridgePlan:
    """Reads the map, the task and the policy and checks them against each other.

    Args:
        model: an exported policy directory or a ``models:/`` URI.
        map_path: the map file.
        mode: ``shadow`` or ``closed-loop``.
        trusted_keys: public keys whose signatures are trusted (``serve``'s rule: none
            named means ``keys/policy-signing.pub`` if it exists).
        allow_unsigned: shadow mode may run an unsigned policy (development only);
            ignored in closed loop.
        task_file: the dataset card or task file (default: the map's ``task``).
        pinned_constraints: the safety engineer's constraint spec the policy must enforce
            (needs the task).
        tracking_uri: the MLflow store of ``models:/`` URIs.

    Raises:
        MapError, UnknownFeatureError, UnitMismatchError, NodeIdError: the map.
        PolicyTaskError: the policy was exported for another task.
        ClosedLoopRefused: closed loop without a verified signature by a trusted key.
        PolicyArtifactError, SettingsError: the policy or the trust settings, as ``serve``.
    """
    from neorl_industrial.integration.deployment.pin import ServerCheck

    if mode not in MODES:
        raise BridgeError(f"mode {mode!r}: expected one of {list(MODES)}")
    closed_loop = mode == "closed-loop"
    map_path = Path(map_path)
    where = str(map_path)
    plant_map, task_file, task = _map_and_task(map_path, task_file)
    if closed_loop:
        if allow_unsigned:
            log.warning("--allow-unsigned is ignored in closed loop: a signed policy is required")
        allow_unsigned = False
        _refuse_unsigned(model)
    trust = _trust(
        trusted_keys,
        pinned_constraints,
        task_file,
        allow_unsigned=allow_unsigned,
        closed_loop=closed_loop,
    )
    loaded = _load(model, tracking_uri, trust, closed_loop=closed_loop)
    artifact = loaded.artifact
    enforced, served = trust.check(artifact)
    conversions = _conversions(plant_map, served, where, model, task)
    task_period = None if task is None else task.sampling_period
    if task_period is None:
        task_period = (artifact.metadata.get("task") or {}).get("sampling_period")
    period = plant_map.period(task_period, where)
    check = ServerCheck(enforced)
    check.warmup()
    return BridgePlan(
        mode=mode,
        plant_map=plant_map,
        map_path=map_path,
        loaded=loaded,
        task=served,
        check=check,
        period=period,
        stale_after=plant_map.stale_limit(period),
        task_file=None if task_file is None else str(task_file),
        conversions=conversions,
    )
