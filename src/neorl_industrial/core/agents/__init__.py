"""Offline RL algorithms as NamedTuples of pure functions (BC, TD3+BC, IQL, CQL).

Filled by the offline-algorithms work; empty until then."""
