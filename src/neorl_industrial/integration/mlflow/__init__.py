"""MLflow: every training run tracked, every policy registered.

* :class:`MlflowTracker`: a Trainer callback that logs params, metrics, tags, nested runs
  per seed and artifacts through a background :class:`BufferedSender` (a server that is
  down or slow never stops training; unsent calls go to a spool file for :func:`replay`).
* :mod:`.pyfunc`: the exported, shielded policy as a pyfunc model
  (``mlflow models serve`` returns shielded actions).
* :mod:`.registry`: versions, the ``champion``/``challenger`` aliases, the safety-aware
  promotion rule, and ``models:/`` URIs wherever a path is accepted.

MLflow itself is imported lazily: ``import neorl_industrial.integration.mlflow`` is cheap.
"""

from __future__ import annotations

from neorl_industrial.core.utils.lazy import lazy_exports

_EXPORTS = {
    "BufferedSender": ".sender",
    "MlflowUnavailableWarning": ".sender",
    "SendSummary": ".sender",
    "SpoolError": ".sender",
    "read_spool": ".sender",
    "replay": ".sender",
    "DEFAULT_TRACKING_URI": ".tracking",
    "MlflowTracker": ".tracking",
    "flatten": ".tracking",
    "registered_model_name": ".tracking",
    "resolve_tracking_uri": ".tracking",
    "system_tags": ".tracking",
    "ui_command": ".tracking",
    "learning_curves": ".plots",
    "safety_plot": ".plots",
    "ShieldedPolicyModel": ".pyfunc",
    "log_policy_model": ".pyfunc",
    "policy_signature": ".pyfunc",
    "CHALLENGER": ".registry",
    "CHAMPION": ".registry",
    "PromotionDecision": ".registry",
    "RegistryError": ".registry",
    "VersionSummary": ".registry",
    "decide_promotion": ".registry",
    "describe_model_uri": ".registry",
    "is_model_uri": ".registry",
    "list_versions": ".registry",
    "load_agent": ".registry",
    "load_policy": ".registry",
    "promote": ".registry",
    "resolve_agent_dir": ".registry",
    "resolve_policy_dir": ".registry",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
