"""Packages whose names are imported on first use (``__getattr__`` of PEP 562)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, modules: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``: ``modules`` maps each module
    (absolute, or relative to the package when it starts with ``.``) to the names it
    defines for the package; a module is imported when one of its names is first used."""
    exports: dict[str, str] = {}
    for module, names in modules.items():
        for name in names:
            if name in exports:
                raise ValueError(f"{package}: {name!r} is exported by two modules")
            exports[name] = module

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(exports[name], package), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__, sorted(exports)
