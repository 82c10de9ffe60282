"""PyTree state: the offline Dataset with vectorized sampling, normalizers, and the
TrainState of offline runs."""

from neorl_industrial.functional.state_management.dataset import Dataset, split_episodes
from neorl_industrial.functional.state_management.normalizers import (
    REWARD_SCALINGS,
    ActionScaler,
    RewardScaling,
    with_action_scaling,
)
from neorl_industrial.functional.state_management.safety import (
    episodes_within_limits,
    relabel_costs,
    select_safe_episodes,
)
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
    donatable,
    init_train_state,
    init_train_states,
    uncommitted,
)

__all__ = [
    "REWARD_SCALINGS",
    "ActionScaler",
    "Batch",
    "Dataset",
    "RewardScaling",
    "TrainState",
    "Windows",
    "donatable",
    "episodes_within_limits",
    "gather_nstep",
    "gather_transitions",
    "gather_windows",
    "init_train_state",
    "init_train_states",
    "relabel_costs",
    "sample",
    "sample_indices",
    "sample_nstep",
    "sample_windows",
    "select_safe_episodes",
    "split_episodes",
    "uncommitted",
    "window_starts",
    "with_action_scaling",
]
