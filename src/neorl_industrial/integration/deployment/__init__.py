"""The policy server: a FastAPI app (:func:`create_app`) with the shield in every
response, API keys, Prometheus metrics, micro-batching and hot reload; settings from the
environment (:class:`ServerSettings`). ``neorl-industrial serve`` runs it with uvicorn.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_app": "app",
    "LoadedPolicy": "app",
    "load_policy_source": "app",
    "MicroBatcher": "batcher",
    "ServerMetrics": "metrics",
    "ServerSettings": "settings",
    "SettingsError": "settings",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return __all__
