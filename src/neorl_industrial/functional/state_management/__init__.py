"""PyTree state: the offline Dataset with vectorized sampling, normalizers, and (with the
algorithms) TrainState."""

from neorl_industrial.functional.state_management.dataset import Dataset, split_episodes
from neorl_industrial.functional.state_management.normalizers import Normalizer
from neorl_industrial.functional.state_management.sampling import (
    Batch,
    Windows,
    gather_nstep,
    gather_transitions,
    gather_windows,
    sample,
    sample_indices,
    sample_nstep,
    sample_windows,
    window_starts,
)

__all__ = [
    "Batch",
    "Dataset",
    "Normalizer",
    "Windows",
    "gather_nstep",
    "gather_transitions",
    "gather_windows",
    "sample",
    "sample_indices",
    "sample_nstep",
    "sample_windows",
    "split_episodes",
    "window_starts",
]
