"""Gymnasium shells over the functional environments (filled below)."""


def register_gymnasium_envs() -> None:
    pass
