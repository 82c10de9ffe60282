"""The installed distribution's version, read from its metadata (no import of the layers)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("neorl-industrial")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
