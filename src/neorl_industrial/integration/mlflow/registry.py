"""Policies in the MLflow Model Registry: versions, aliases and a safety-aware promotion.

Every trained policy becomes a new version of a registered model (``ib-policy``) with
its evaluation on the version's tags (``return``, ``normalized_cost``, ...). The newest
version gets the alias ``challenger``; :func:`promote` decides whether it replaces the
``champion``:

0. an unsigned candidate (its ``signature`` tag is ``unsigned`` or missing) is never
   promoted, not even forced: a server that trusts signing keys would refuse it anyway;
1. a candidate whose evaluated cost exceeds its limit (``normalized_cost > 1``) or whose
   applied actions broke a hard constraint is never promoted (unless forced);
2. a safe candidate replaces a champion that is not safe, or no champion;
3. between two safe policies of the same environment, the higher evaluation return wins.

The decision and its reason are recorded on the versions' tags (``promotion.*``) and on
the registered model, so the registry shows why a champion is the champion.

A training run hands the registry's work to the sender as operations
(:data:`OPERATIONS`): ``log_model`` logs the policy model and registers it as a version,
``register`` puts the evaluation on it, gives it ``challenger`` and applies the rule.

Everywhere a policy or agent path is accepted, ``models:/<name>@<alias>``,
``models:/<name>/<version>`` and ``runs:/<run_id>/policy`` are accepted too
(:func:`resolve_policy_dir`, :func:`resolve_agent_dir`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import math
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from neorl_industrial.integration.mlflow.sender import Delivery, Handler, resolve_tracking_uri
from neorl_industrial.wrappers.hostio import read_yaml

__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "OPERATIONS",
    "SIGNATURE_TAG",
    "UNSIGNED",
    "PromotionDecision",
    "RegistryError",
    "VersionSummary",
    "decide_promotion",
    "describe_model_uri",
    "downloaded_policy_dir",
    "finish_registration",
    "is_model_uri",
    "list_versions",
    "load_agent",
    "load_policy",
    "policy_signature_tag",
    "promote",
    "register_policy",
    "registered_model_name",
    "resolve_agent_dir",
    "resolve_policy_dir",
]

CHAMPION = "champion"
CHALLENGER = "challenger"
#: Version tags that carry the evaluation of the version's policy.
METRIC_TAGS = (
    "return",
    "normalized_return",
    "normalized_cost",
    "violation_rate",
    "override_rate",
    "hard_violation_steps",
)
_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")
#: The version tag with the fingerprint of the key that signed the policy, or ``unsigned``.
SIGNATURE_TAG = "signature"
UNSIGNED = "unsigned"


class RegistryError(ValueError):
    """A registry request that cannot be done; the message names the model and version."""


@dataclasses.dataclass(frozen=True)
class VersionSummary:
    """One registered version as the promotion rule sees it."""

    name: str
    version: str
    aliases: tuple[str, ...]
    run_id: str | None
    env: str | None
    algorithm: str | None
    metrics: dict[str, float]
    created: int | None = None
    #: The key fingerprint of the policy's signature, ``unsigned``, or None (no tag).
    signature: str | None = None

    @property
    def signed(self) -> bool:
        return self.signature not in (None, "", UNSIGNED)

    @property
    def safe(self) -> bool:
        """Evaluated within every cost limit, with no hard violation applied."""
        cost = self.metrics.get("normalized_cost")
        hard = self.metrics.get("hard_violation_steps", 0.0)
        if cost is None or not math.isfinite(cost):
            # No cost limits: only the hard constraints count.
            return hard == 0
        return cost <= 1.0 and hard == 0

    @property
    def ret(self) -> float | None:
        return self.metrics.get("return")


@dataclasses.dataclass(frozen=True)
class PromotionDecision:
    promoted: bool
    reason: str
    candidate: VersionSummary
    champion: VersionSummary | None


def _summary(version: Any) -> VersionSummary:
    tags = dict(version.tags or {})
    metrics = {}
    for name in METRIC_TAGS:
        if name in tags:
            with contextlib.suppress(ValueError):
                metrics[name] = float(tags[name])
    return VersionSummary(
        name=version.name,
        version=str(version.version),
        aliases=tuple(getattr(version, "aliases", ()) or ()),
        run_id=version.run_id,
        env=tags.get("env"),
        algorithm=tags.get("algorithm"),
        metrics=metrics,
        created=getattr(version, "creation_timestamp", None),
        signature=tags.get(SIGNATURE_TAG),
    )


def _version(client: Any, name: str, version: str | None = None, alias: str | None = None) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        if alias is not None:
            return client.get_model_version_by_alias(name, alias)
        return client.get_model_version(name, str(version))
    except MlflowException as error:
        what = f"alias {alias!r}" if alias is not None else f"version {version}"
        raise RegistryError(f"registered model {name!r}: no {what} ({error.message})") from None


def list_versions(client: Any, name: str) -> list[VersionSummary]:
    """Every version of ``name``, newest first, with its aliases and metrics."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException:
        names = [model.name for model in client.search_registered_models()]
        known = ", ".join(sorted(names)) or "none"
        raise RegistryError(f"no registered model {name!r} (registered: {known})") from None
    versions = client.search_model_versions(f"name = '{name}'")
    # search_model_versions may leave out aliases; read them from the model.
    aliases: dict[str, list[str]] = {}
    for alias, version in (client.get_registered_model(name).aliases or {}).items():
        aliases.setdefault(str(version), []).append(alias)
    summaries = []
    for version in versions:
        summary = _summary(version)
        summaries.append(
            dataclasses.replace(summary, aliases=tuple(sorted(aliases.get(summary.version, []))))
        )
    return sorted(summaries, key=lambda s: -int(s.version))


def decide_promotion(
    candidate: VersionSummary, champion: VersionSummary | None, *, force: bool = False
) -> PromotionDecision:
    """The safety-aware rule (see the module): signed, cost within the limit first, then
    return."""

    def describe(v: VersionSummary) -> str:
        cost = v.metrics.get("normalized_cost")
        shown = "no cost limits" if cost is None else f"normalized cost {cost:.3g}"
        ret = "unknown" if v.ret is None else f"{v.ret:.4g}"
        return f"version {v.version} (return {ret}, {shown})"

    if not candidate.signed:
        return PromotionDecision(
            False,
            f"{describe(candidate)} is unsigned ({SIGNATURE_TAG} tag: "
            f"{candidate.signature or 'none'}); export it with a signing key "
            "(neorl-industrial keys generate; export --sign-key) and register it again",
            candidate,
            champion,
        )
    if force:
        return PromotionDecision(True, f"forced: {describe(candidate)}", candidate, champion)
    if candidate.ret is None:
        return PromotionDecision(
            False,
            f"{describe(candidate)} has no evaluation on its tags; evaluate it first",
            candidate,
            champion,
        )
    if champion is not None and champion.version == candidate.version:
        return PromotionDecision(
            False, f"{describe(candidate)} is the champion", candidate, champion
        )
    if not candidate.safe:
        return PromotionDecision(
            False,
            f"{describe(candidate)} is not within its cost limits; a policy must be safe "
            "before it is compared by return",
            candidate,
            champion,
        )
    if champion is None:
        return PromotionDecision(
            True,
            f"no champion yet; {describe(candidate)} is within its cost limits",
            candidate,
            None,
        )
    if champion.env and candidate.env and champion.env != candidate.env:
        return PromotionDecision(
            False,
            f"{describe(candidate)} was evaluated on {candidate.env}, the champion on "
            f"{champion.env}; their returns do not compare (promote with force)",
            candidate,
            champion,
        )
    if not champion.safe:
        return PromotionDecision(
            True,
            f"{describe(candidate)} is within its cost limits and the champion, "
            f"{describe(champion)}, is not",
            candidate,
            champion,
        )
    if champion.ret is None or candidate.ret > champion.ret:
        return PromotionDecision(
            True,
            f"both within their cost limits; {describe(candidate)} has a higher return than "
            f"the champion, {describe(champion)}",
            candidate,
            champion,
        )
    return PromotionDecision(
        False,
        f"both within their cost limits; {describe(candidate)} does not beat the champion's "
        f"return ({describe(champion)})",
        candidate,
        champion,
    )


def promote(
    client: Any, name: str, version: str | None = None, *, force: bool = False
) -> PromotionDecision:
    """Applies the promotion rule to ``version`` (default: the ``challenger``, else the
    newest version) against the ``champion`` and records the decision."""
    from mlflow.exceptions import MlflowException

    if version is None:
        try:
            candidate_version = client.get_model_version_by_alias(name, CHALLENGER)
        except MlflowException:
            versions = list_versions(client, name)
            if not versions:
                raise RegistryError(f"registered model {name!r} has no versions") from None
            candidate_version = _version(client, name, versions[0].version)
    else:
        candidate_version = _version(client, name, version)
    candidate = _summary(candidate_version)
    try:
        champion: VersionSummary | None = _summary(
            client.get_model_version_by_alias(name, CHAMPION)
        )
    except MlflowException:
        champion = None
    decision = decide_promotion(candidate, champion, force=force)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    v = candidate.version
    client.set_model_version_tag(name, v, "promotion.decision", str(decision.promoted).lower())
    client.set_model_version_tag(name, v, "promotion.reason", decision.reason)
    client.set_model_version_tag(name, v, "promotion.time", stamp)
    if decision.promoted:
        client.set_registered_model_alias(name, CHAMPION, v)
        if champion is not None:
            client.set_model_version_tag(name, champion.version, "promotion.replaced_by", v)
            client.set_model_version_tag(name, v, "promotion.previous_champion", champion.version)
        try:
            if str(client.get_model_version_by_alias(name, CHALLENGER).version) == v:
                client.delete_registered_model_alias(name, CHALLENGER)
        except MlflowException:
            pass
        client.set_registered_model_tag(name, "champion.version", v)
        client.set_registered_model_tag(name, "champion.reason", decision.reason)
        client.set_registered_model_tag(name, "champion.since", stamp)
    return decision


def finish_registration(
    client: Any,
    *,
    name: str,
    version: str,
    metrics: dict[str, Any],
    tags: dict[str, Any],
    promote_now: bool = False,
) -> dict[str, Any]:
    """Puts a new version's evaluation and facts on its tags, gives it the ``challenger``
    alias and, with ``promote_now``, applies the promotion rule."""
    for key, value in metrics.items():
        if value is not None:
            client.set_model_version_tag(name, version, key, str(value))
    for key, value in tags.items():
        if value is not None:
            client.set_model_version_tag(name, version, key, str(value))
    client.set_registered_model_alias(name, CHALLENGER, version)
    result: dict[str, Any] = {"name": name, "version": version}
    if promote_now:
        decision = promote(client, name, version)
        result.update(promoted=decision.promoted, reason=decision.reason)
    return result


def register_policy(
    policy_dir: str | Path,
    name: str,
    tracking_uri: str | None = None,
    *,
    trusted_keys: list[str | Path] | None = None,
    allow_unsigned: bool = False,
    metrics: dict[str, float] | None = None,
    experiment: str = "neorl-industrial",
    promote_now: bool = False,
) -> dict[str, Any]:
    """Registers an exported policy directory as a new version of ``name``: the artifact
    is verified first, logged as the pyfunc model of a run of its own, tagged with the
    fingerprint of its signature (the promotion rule's first condition), its ``metrics``
    (``return``, ``normalized_cost``, ...) put on its tags, and given ``challenger``.

    Args:
        trusted_keys: public keys the signature must verify against; ``None``: the
            signature is read and recorded, and servers verify it against their keys.
        allow_unsigned: register an unsigned policy too (it can never be promoted).

    Raises:
        PolicyArtifactError: for an artifact that is corrupt, unsigned (unless allowed),
            or not signed by one of ``trusted_keys``.
        RegistryError: for a metric name the promotion rule does not read.
    """
    from mlflow import MlflowClient

    from neorl_industrial.integration.mlflow.pyfunc import log_policy_model
    from neorl_industrial.integration.mlflow.runs import _experiment_id
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact, PolicyArtifactError
    from neorl_industrial.wrappers.agents.signing import SIGNATURE

    unknown = sorted(set(metrics or {}) - set(METRIC_TAGS))
    if unknown:
        raise RegistryError(f"metrics: unknown {unknown}; the registry reads {list(METRIC_TAGS)}")
    policy_dir = Path(policy_dir)
    artifact = PolicyArtifact.load(
        policy_dir, trusted_keys=trusted_keys or None, require_signature=bool(trusted_keys)
    )
    if artifact.signature is None and not allow_unsigned:
        raise PolicyArtifactError(
            f"{policy_dir}: unsigned (no {SIGNATURE}); an unsigned policy can never be "
            "promoted and no server that requires signatures serves it. Export it with a "
            "signing key (neorl-industrial export --sign-key, or a run with export.signing_keys)"
            ", or pass --allow-unsigned to register it anyway"
        )
    store = resolve_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    run = client.create_run(
        _experiment_id(client, experiment),
        run_name=f"register {name}",
        tags={"neorl.registered_from": str(policy_dir.absolute())},
    )
    run_id = run.info.run_id
    status = "FAILED"
    try:
        logged = log_policy_model(
            store, run_id, policy_dir=policy_dir, registered_model=name, registry_uri=store
        )
        version = str(logged["version"])
        signature = policy_signature_tag(policy_dir)
        client.set_model_version_tag(name, version, SIGNATURE_TAG, signature)
        result = finish_registration(
            client,
            name=name,
            version=version,
            metrics=dict(metrics or {}),
            tags={"algorithm": artifact.metadata.get("algorithm")},
            promote_now=promote_now,
        )
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status=status)
    return {**result, "signature": signature, "run_id": run_id, "uri": f"models:/{name}/{version}"}


def registered_model_name(task_name: str, explicit: str | None = None) -> str:
    """The registered model a task's policies become versions of: ``explicit`` if given,
    else a name from the task's:

    * a registered simulator's id names its family's model, which the family's variants
      share: ``IB-v0`` and ``IB-classic-v0`` → ``ib-policy``;
    * any other task name (a plant's dataset) names its own, lower case, with every run
      of characters other than letters, digits and ``_`` as one ``-`` (MLflow refuses
      ``/`` and ``:``, and ``@`` would read as an alias in ``models:/``):
      ``heat-exchanger`` → ``heat-exchanger-policy``, ``Boiler 3`` → ``boiler-3-policy``.

    Raises:
        ValueError: for a task name with no letter or digit to name a model after.
    """
    from neorl_industrial.core.environments import registered_envs

    if explicit:
        return explicit
    name = task_name.strip()
    if name in registered_envs():
        name = name.split("-")[0]
    slug = re.sub(r"[^a-z0-9_]+", "-", name.lower()).strip("-_")
    if not slug:
        raise ValueError(
            f"cannot name a registered model after the task {task_name!r}; set "
            "tracking.registered_model"
        )
    return f"{slug}-policy"


# ----- operations for the sender -------------------------------------------------------
def log_model(delivery: Delivery, key: str | None, args: dict[str, Any]) -> dict[str, Any]:
    """Logs the exported policy at ``args["policy_dir"]`` as the pyfunc model of the run
    ``key`` and registers it as a new version of ``registered_model`` in the delivery's
    registry (a replay into another store registers it there)."""
    from neorl_industrial.integration.mlflow.pyfunc import log_policy_model

    client = delivery.client
    if key not in delivery.ids:
        raise KeyError(f"log_model: the run {key!r} was never created")
    result = log_policy_model(
        client.tracking_uri,
        delivery.ids[key],
        policy_dir=args["policy_dir"],
        agent_dir=args.get("agent_dir"),
        dataset_card=args.get("dataset_card"),
        input_example=args.get("input_example"),
        registered_model=args.get("registered_model"),
        registry_uri=getattr(client, "_registry_uri", None) or client.tracking_uri,
    )
    if result.get("version") is not None:
        signature = policy_signature_tag(args["policy_dir"])
        client.set_model_version_tag(result["name"], result["version"], SIGNATURE_TAG, signature)
        result["signature"] = signature
    return result


def policy_signature_tag(policy_dir: str | Path) -> str:
    """The fingerprint of the key that signed the artifact at ``policy_dir``, or
    ``unsigned``. Read, not verified: the server verifies against the keys it trusts."""
    from neorl_industrial.wrappers.agents.signing import SIGNATURE

    file = Path(policy_dir) / SIGNATURE
    if not file.is_file():
        return UNSIGNED
    try:
        fingerprint = json.loads(file.read_text()).get("key_fingerprint")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return UNSIGNED
    return str(fingerprint) if fingerprint else UNSIGNED


def register(delivery: Delivery, key: str | None, args: dict[str, Any]) -> dict[str, Any]:
    """:func:`finish_registration` of ``args["version"]``, by default the version that
    the last ``log_model`` registered."""
    args = dict(args)
    if args.get("version") is None:
        logged = delivery.results.get("log_model") or {}
        if logged.get("version") is None:
            raise KeyError("register: the policy model was not logged and registered")
        args["version"] = logged["version"]
    return finish_registration(delivery.client, **args)


#: The registry's operations by name, registered with the sender by the package.
OPERATIONS: dict[str, Handler] = {
    "log_model": log_model,
    "register": register,
}


# ----- resolving URIs ------------------------------------------------------------------
def is_model_uri(value: str | Path) -> bool:
    return isinstance(value, str) and value.startswith(_SCHEMES)


def _download(uri: str, tracking_uri: str | None, target: Path) -> Path:
    import mlflow
    from mlflow.exceptions import MlflowException

    if uri.startswith("runs:/") and uri.rstrip("/").count("/") == 1:
        uri = uri.rstrip("/") + "/policy"
    from neorl_industrial.integration.mlflow.pyfunc import tracking_uri_for

    try:
        with tracking_uri_for(tracking_uri or mlflow.get_tracking_uri(), None):
            local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(target))
    except MlflowException as error:
        raise RegistryError(f"{uri}: cannot be loaded from MLflow: {error.message}") from None
    return Path(local)


@contextlib.contextmanager
def downloaded_policy_dir(value: str | Path, tracking_uri: str | None = None) -> Iterator[Path]:
    """:func:`resolve_policy_dir` whose download (for a URI) is removed when the block
    ends, on error too; a local path is yielded as it is."""
    with _resolved(value, "policy", tracking_uri) as path:
        yield path


@contextlib.contextmanager
def _resolved(value: str | Path, part: str, tracking_uri: str | None) -> Iterator[Path]:
    if not is_model_uri(value):
        yield Path(value)
        return
    with tempfile.TemporaryDirectory(prefix="neorl-model-") as scratch:
        yield _located(value, part, _download(str(value), tracking_uri, Path(scratch)))


def _resolve(value: str | Path, part: str, tracking_uri: str | None) -> Path:
    if not is_model_uri(value):
        return Path(value)
    # The caller reads the files after this returns: they are removed when the process
    # ends (a long-lived caller uses downloaded_policy_dir, which removes them at once).
    target = Path(tempfile.mkdtemp(prefix="neorl-model-"))
    atexit.register(shutil.rmtree, target, ignore_errors=True)
    try:
        return _located(value, part, _download(str(value), tracking_uri, target))
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _located(value: str | Path, part: str, model_dir: Path) -> Path:
    found = model_dir / "artifacts" / part
    mlmodel = model_dir / "MLmodel"
    if mlmodel.exists():
        flavor = (read_yaml(mlmodel, what="MLmodel file") or {}).get("flavors", {})
        entry = (flavor.get("python_function", {}).get("artifacts") or {}).get(part)
        if entry and entry.get("path"):
            found = model_dir / entry["path"]
    if not found.exists():
        raise RegistryError(
            f"{value}: the model holds no {part!r} artifact; is it a policy logged by "
            "neorl_industrial?"
        )
    return found


def describe_model_uri(uri: str, tracking_uri: str | None = None) -> dict[str, Any]:
    """Name, version, training run and aliases of ``models:/name@alias`` or
    ``models:/name/version`` (just the URI for other schemes)."""
    if not uri.startswith("models:/"):
        return {"uri": uri}
    from mlflow import MlflowClient

    store = resolve_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri=store, registry_uri=store)
    rest = uri[len("models:/") :]
    if "@" in rest:
        name, alias = rest.split("@", 1)
        version = _version(client, name, alias=alias)
    else:
        name, number = rest.rsplit("/", 1)
        version = _version(client, name, number)
    return {
        "uri": uri,
        "name": name,
        "version": str(version.version),
        "run_id": version.run_id,
        "aliases": list(getattr(version, "aliases", []) or []),
    }


def resolve_policy_dir(value: str | Path, tracking_uri: str | None = None) -> Path:
    """A local directory of the exported policy: ``value`` itself when it is a path, or
    the policy inside the model at a ``models:/`` or ``runs:/`` URI (downloaded into a
    temporary directory removed when the process ends; see :func:`downloaded_policy_dir`
    to remove it sooner)."""
    return _resolve(value, "policy", tracking_uri)


def resolve_agent_dir(value: str | Path, tracking_uri: str | None = None) -> Path:
    """A local directory of a saved agent: ``value`` itself when it is a path, or the
    agent inside the model at a ``models:/`` or ``runs:/`` URI (downloaded)."""
    return _resolve(value, "agent", tracking_uri)


def load_policy(value: str | Path, tracking_uri: str | None = None, **options: Any) -> Any:
    """The :class:`~neorl_industrial.wrappers.agents.artifact.PolicyArtifact` at a path or
    a ``models:/`` / ``runs:/`` URI (``models:/ib-policy@champion``); a download is
    removed once the artifact is loaded (it holds what it serves in memory). ``options``
    go to ``PolicyArtifact.load`` (``trusted_keys``, ``require_signature``)."""
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

    with downloaded_policy_dir(value, tracking_uri) as path:
        return PolicyArtifact.load(path, **options)


def load_agent(value: str | Path, tracking_uri: str | None = None) -> Any:
    """The saved :class:`~neorl_industrial.wrappers.agents.Agent` at a path or a
    ``models:/`` / ``runs:/`` URI, ready to predict, evaluate or export."""
    from neorl_industrial.wrappers.agents import Agent

    with _resolved(value, "agent", tracking_uri) as path:
        return Agent.load(path)
