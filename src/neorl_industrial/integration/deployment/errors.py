"""The server's start-up error, shared by its settings and the policy trust they build."""

__all__ = ["SettingsError"]


class SettingsError(ValueError):
    """Settings the server cannot start with; the message names the setting."""
