"""MLflow: every training run tracked, every policy registered.

* :class:`MlflowTracker`: a Trainer callback that logs params, metrics, tags, nested runs
  per seed and artifacts through a background :class:`BufferedSender` (a server that is
  down or slow never stops training; unsent calls go to a spool file for :func:`replay`).
* :mod:`.sender`: the transport. It delivers operations by name, in order, with retries,
  the spool and its replay, and imports no other module of this package; :mod:`.runs`
  (runs, params, metrics, artifacts) and :mod:`.registry` (the policy model and its
  registration) define the operations, and this module registers them with it.
* :mod:`.pyfunc`: the exported, shielded policy as a pyfunc model
  (``mlflow models serve`` returns shielded actions).
* :mod:`.registry`: versions, the ``champion``/``challenger`` aliases, the safety-aware
  promotion rule, and ``models:/`` URIs wherever a path is accepted.

MLflow itself is imported lazily: ``import neorl_industrial.integration.mlflow`` is cheap.
The names that track, plot or read the registry need the ``track`` extra: without it, using
one raises :class:`~neorl_industrial.extras.MissingExtraError` naming the extra, before any
run starts.
"""

from __future__ import annotations

from typing import Any

from neorl_industrial.core.utils.lazy import lazy_exports
from neorl_industrial.extras import require
from neorl_industrial.integration.mlflow import registry as _registry
from neorl_industrial.integration.mlflow import runs as _runs
from neorl_industrial.integration.mlflow.sender import register_operations as _register

# Here rather than in the tracker: a spool replayed by a process that imported only the
# sender (``neorl-industrial mlflow replay``) holds run and registry operations too.
_register(_runs.OPERATIONS)
_register(_registry.OPERATIONS)

# Each module and the names it defines for the package.
_MODULES = {
    ".sender": (
        "BufferedSender",
        "DEFAULT_TRACKING_URI",
        "MlflowUnavailableWarning",
        "SendSummary",
        "SpoolError",
        "read_spool",
        "replay",
        "resolve_tracking_uri",
    ),
    ".tracking": ("MlflowTracker", "RunMetadata", "flatten", "system_tags", "ui_command"),
    ".plots": ("learning_curves", "safety_plot", "sweep_plot"),
    ".pyfunc": ("ShieldedPolicyModel", "log_policy_model", "policy_signature"),
    ".registry": (
        "CHALLENGER",
        "CHAMPION",
        "PromotionDecision",
        "RegistryError",
        "VersionSummary",
        "decide_promotion",
        "describe_model_uri",
        "is_model_uri",
        "list_versions",
        "load_agent",
        "load_policy",
        "promote",
        "registered_model_name",
        "resolve_agent_dir",
        "resolve_policy_dir",
    ),
}


#: The names that need the 'track' extra (MLflow, matplotlib) to be of any use.
_TRACK = frozenset(
    {
        "BufferedSender",
        "replay",
        "MlflowTracker",
        "RunMetadata",
        "learning_curves",
        "safety_plot",
        "sweep_plot",
        "ShieldedPolicyModel",
        "log_policy_model",
        "policy_signature",
        "list_versions",
        "load_agent",
        "load_policy",
        "promote",
    }
)

_getattr, __dir__, __all__ = lazy_exports(__name__, _MODULES)


def __getattr__(name: str) -> Any:
    if name in _TRACK:
        require("track")
    return _getattr(name)
