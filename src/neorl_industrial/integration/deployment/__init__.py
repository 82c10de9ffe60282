"""The policy server: a FastAPI app (:func:`create_app`) with the shield in every
response, API keys, Prometheus metrics, micro-batching and hot reload; settings from the
environment (:class:`ServerSettings`). ``neorl-industrial serve`` runs it with uvicorn.

It needs the ``serve`` extra: without it, importing this package raises
:class:`~neorl_industrial.extras.MissingExtraError` naming the extra to install.
"""

from __future__ import annotations

from neorl_industrial.core.utils.lazy import lazy_exports
from neorl_industrial.extras import require

require("serve")

# Each module and the names it defines for the package.
_MODULES = {
    ".app": ("create_app",),
    ".policy": ("LoadedPolicy", "load_policy_source"),
    ".batcher": ("MicroBatcher",),
    ".metrics": ("ServerMetrics",),
    ".settings": ("ServerSettings", "SettingsError"),
}


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
