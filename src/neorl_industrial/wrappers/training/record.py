"""What a trained agent's record says of the data it was trained on."""

from __future__ import annotations

from typing import Any

from neorl_industrial.functional.state_management import Dataset
from neorl_industrial.wrappers.training.verdict import episode_digests

__all__ = ["dataset_record"]


def dataset_record(
    dataset: Dataset, card: Any, used: Dataset, heldout: Dataset | None
) -> dict[str, Any]:
    """The ``training["dataset"]`` entry of ``Agent.fit`` and ``Agent.sweep``: the data's
    name (its ``card``'s) and sizes, the episodes trained on (``used``: after the
    held-out ones and, for BC-Safe, the unsafe ones are set apart) and held out, and the
    digests of the episodes of ``dataset`` that are not held out, by which a later
    evaluation recognises (and leaves out) what the agent was trained on."""
    held = set() if heldout is None else set(episode_digests(heldout))
    return {
        "name": None if card is None else card.name,
        "transitions": dataset.n_transitions,
        "episodes": dataset.n_episodes,
        "used_episodes": used.n_episodes,
        "heldout_episodes": None if heldout is None else heldout.n_episodes,
        "trained_episodes": [d for d in episode_digests(dataset) if d not in held],
    }
