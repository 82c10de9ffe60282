"""Scan-fused training loops over the core.

``train_online`` trains an off-policy agent on a functional environment: every chunk of
environment steps and gradient updates is one compiled ``lax.scan`` over a device-resident
replay buffer, and the host evaluates and snapshots the policy between chunks.
``generate_trajectories`` rolls out behaviour policies into offline data.
``normalized_actions`` drives a task in plant units with an agent's [-1, 1] actions.
``train_offline`` fuses N offline updates (sampling included) into one compiled chunk
and trains many seeds at once with ``vmap``; ``train_sweep`` trains a grid of traced
hyperparameters × seeds the same way, as one program (``plan_sweep`` checks it first).
``train_data_parallel`` trains one run on a dataset split into shards of episodes over the
devices (and processes) of a ``"data"`` mesh, averaging gradients across them.
"""

from neorl_industrial.functional.transformations.action_scaling import (
    ActionScaledEnv,
    action_scaler_for,
    normalized_actions,
)
from neorl_industrial.functional.transformations.data_parallel import (
    DataParallelError,
    ShardedDataset,
    ShardPlan,
    data_mesh,
    observation_moments,
    plan_shards,
    shard_dataset,
    split_dataset,
    train_data_parallel,
)
from neorl_industrial.functional.transformations.generation import (
    Trajectories,
    behaviour_policy,
    generate_trajectories,
)
from neorl_industrial.functional.transformations.offline import (
    Schedule,
    init_seeds,
    make_seeded_chunk,
    make_train_chunk,
    train_offline,
)
from neorl_industrial.functional.transformations.offline import make_chunk as make_offline_chunk
from neorl_industrial.functional.transformations.online import (
    Evaluation,
    OnlineCarry,
    OnlineConfig,
    OnlineHistory,
    ProgressFn,
    ReplayBuffer,
    RolloutStatistics,
    init_carry,
    make_chunk,
    random_rollout_statistics,
    replay_buffer_add,
    replay_buffer_init,
    replay_buffer_sample,
    train_online,
)
from neorl_industrial.functional.transformations.sweep import (
    SweepError,
    SweepPlan,
    SweepResult,
    plan_sweep,
    train_sweep,
)

__all__ = [
    "ActionScaledEnv",
    "DataParallelError",
    "Evaluation",
    "OnlineCarry",
    "OnlineConfig",
    "OnlineHistory",
    "ProgressFn",
    "ReplayBuffer",
    "RolloutStatistics",
    "Schedule",
    "ShardPlan",
    "ShardedDataset",
    "SweepError",
    "SweepPlan",
    "SweepResult",
    "Trajectories",
    "action_scaler_for",
    "behaviour_policy",
    "data_mesh",
    "generate_trajectories",
    "init_carry",
    "init_seeds",
    "make_chunk",
    "make_offline_chunk",
    "make_seeded_chunk",
    "make_train_chunk",
    "normalized_actions",
    "observation_moments",
    "plan_shards",
    "plan_sweep",
    "random_rollout_statistics",
    "replay_buffer_add",
    "replay_buffer_init",
    "replay_buffer_sample",
    "shard_dataset",
    "split_dataset",
    "train_data_parallel",
    "train_offline",
    "train_online",
    "train_sweep",
]
