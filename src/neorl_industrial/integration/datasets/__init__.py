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

_EXPORTS = {
    "ArraySpec": ".card",
    "BehaviourPolicy": ".card",
    "ColumnInfo": ".card",
    "DatasetCard": ".card",
    "DatasetSizes": ".card",
    "normalized_score": ".card",
    "DatasetFormatError": ".errors",
    "Expression": ".expressions",
    "QUALITIES": ".factory",
    "SIZES": ".factory",
    "BehaviourPolicies": ".factory",
    "generate_dataset": ".factory",
    "train_behaviour_policies": ".factory",
    "DatasetFormat": ".inspection",
    "detect_format": ".inspection",
    "inspect_dataset": ".inspection",
    "load_any": ".inspection",
    "MemmapSampler": ".memmap",
    "load_minari": ".minari",
    "load_native": ".native",
    "load_native_shards": ".native",
    "save_native": ".native",
    "load_neorl_npz": ".neorl",
    "save_neorl_npz": ".neorl",
    "load_plant_log": ".plant_log",
    "ActionColumnSpec": ".plant_schema",
    "ColumnSpec": ".plant_schema",
    "CostSpec": ".plant_schema",
    "PlantLogSchema": ".plant_schema",
    "load_plant_schema": ".plant_schema",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
