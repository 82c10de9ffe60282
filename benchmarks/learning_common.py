"""The learning study's names shared by its modules: the algorithms it trains, their
labels on the page, the registered algorithm each variant shares defaults with, the
dataset qualities, and how a study's configuration names per-algorithm reward scaling."""

from __future__ import annotations

ALGORITHMS = ("bc", "td3bc", "iql", "cql", "cql_alpha", "cql_bc", "cql_d3rlpy", "mopo", "mopo_bc")
LABELS = {
    "bc": "BC",
    "td3bc": "TD3+BC",
    "iql": "IQL",
    "cql": "CQL",
    "cql_alpha": "CQL-α",
    "cql_bc": "CQL (BC warm start)",
    "cql_d3rlpy": "CQL (d3rlpy defaults)",
    "mopo": "MOPO",
    "mopo_bc": "MOPO-BC",
}
#: The study's algorithms that train on a plant model fitted to each dataset.
MODEL_BASED = ("mopo", "mopo_bc")
#: The registered algorithm whose defaults (reward scaling) a variant of the study shares.
REGISTRY_NAMES = {"cql_alpha": "cql", "cql_bc": "cql", "cql_d3rlpy": "cql", "mopo_bc": "mopo-bc"}
QUALITIES = ("low", "medium", "high")
#: ``config["reward_scaling"]`` of a study that scales as the algorithm registry says.
PER_ALGORITHM = "per_algorithm"
