"""Dataset file formats: the native directory format with its card, NeoRL ``.npz``, Minari
HDF5, and plant logs (CSV / Parquet) described by a YAML schema; plus a memory-mapped
sampler for datasets larger than memory.

Every reader returns the on-device :class:`~neorl_industrial.functional.state_management.Dataset`
and raises :class:`DatasetFormatError` (a ``ValueError``) naming the file, column and row
of bad input. Every writer is atomic. The factory makes NeoRL-style datasets of graded
quality from versioned behaviour policies.

Names are imported on first use: reading native or NeoRL data needs only the core install;
plant logs and Minari datasets need the ``plant`` extra (:mod:`neorl_industrial.extras`).
"""

from __future__ import annotations

from neorl_industrial.core.utils.lazy import lazy_exports

# Each module and the names it defines for the package.
_MODULES = {
    ".card": (
        "ArraySpec",
        "BehaviourPolicy",
        "ColumnInfo",
        "DatasetCard",
        "DatasetSizes",
        "normalized_score",
    ),
    ".errors": ("DatasetFormatError",),
    ".expressions": ("Expression",),
    ".factory": (
        "QUALITIES",
        "SIZES",
        "BehaviourPolicies",
        "generate_dataset",
        "train_behaviour_policies",
    ),
    ".inspection": ("DatasetFormat", "detect_format", "inspect_dataset", "load_any"),
    ".memmap": ("MemmapSampler",),
    ".minari": ("load_minari",),
    ".native": ("load_native", "load_native_shards", "save_native"),
    ".neorl": ("load_neorl_npz", "save_neorl_npz"),
    ".plant_log": ("load_plant_log",),
    ".plant_schema": (
        "ActionColumnSpec",
        "ColumnSpec",
        "CostSpec",
        "PlantLogSchema",
        "load_plant_schema",
    ),
}


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
