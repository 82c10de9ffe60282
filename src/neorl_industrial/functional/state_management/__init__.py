"""PyTree state: the offline Dataset with vectorized sampling, normalizers, and the
TrainState of offline runs."""

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
from neorl_industrial.functional.state_management.train_state import (
    TrainState,
    init_train_state,
    init_train_states,
)

__all__ = [
    "Batch",
    "Dataset",
    "Normalizer",
    "TrainState",
    "Windows",
    "gather_nstep",
    "gather_transitions",
    "gather_windows",
    "init_train_state",
    "init_train_states",
    "sample",
    "sample_indices",
    "sample_nstep",
    "sample_windows",
    "split_episodes",
    "window_starts",
]
