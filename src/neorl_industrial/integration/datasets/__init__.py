"""Dataset file formats: the native directory format with its card, NeoRL ``.npz``, Minari
HDF5, and plant logs (CSV / Parquet) described by a YAML schema; plus a memory-mapped
sampler for datasets larger than memory.

Every reader returns the on-device :class:`~neorl_industrial.functional.state_management.Dataset`
and raises :class:`DatasetFormatError` (a ``ValueError``) naming the file, column and row
of bad input. Every writer is atomic. The factory makes NeoRL-style datasets of graded
quality from versioned behaviour policies.
"""

from neorl_industrial.integration.datasets.card import (
    ArraySpec,
    BehaviourPolicy,
    ColumnInfo,
    DatasetCard,
    DatasetSizes,
    normalized_score,
)
from neorl_industrial.integration.datasets.errors import DatasetFormatError
from neorl_industrial.integration.datasets.expressions import Expression
from neorl_industrial.integration.datasets.factory import (
    QUALITIES,
    SIZES,
    BehaviourPolicies,
    generate_dataset,
    train_behaviour_policies,
)
from neorl_industrial.integration.datasets.inspection import (
    DatasetFormat,
    detect_format,
    inspect_dataset,
    load_any,
)
from neorl_industrial.integration.datasets.memmap import MemmapSampler
from neorl_industrial.integration.datasets.minari import load_minari
from neorl_industrial.integration.datasets.native import (
    load_native,
    load_native_shards,
    save_native,
)
from neorl_industrial.integration.datasets.neorl import load_neorl_npz, save_neorl_npz
from neorl_industrial.integration.datasets.plant_log import load_plant_log
from neorl_industrial.integration.datasets.plant_schema import (
    ActionColumnSpec,
    ColumnSpec,
    CostSpec,
    PlantLogSchema,
    load_plant_schema,
)

__all__ = [
    "QUALITIES",
    "SIZES",
    "ActionColumnSpec",
    "ArraySpec",
    "BehaviourPolicies",
    "BehaviourPolicy",
    "ColumnInfo",
    "ColumnSpec",
    "CostSpec",
    "DatasetCard",
    "DatasetFormat",
    "DatasetFormatError",
    "DatasetSizes",
    "Expression",
    "MemmapSampler",
    "PlantLogSchema",
    "detect_format",
    "generate_dataset",
    "inspect_dataset",
    "load_any",
    "load_minari",
    "load_native",
    "load_native_shards",
    "load_neorl_npz",
    "load_plant_log",
    "load_plant_schema",
    "normalized_score",
    "save_native",
    "save_neorl_npz",
    "train_behaviour_policies",
]
