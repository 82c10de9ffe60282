"""TrainState, the Dataset PyTree with vectorized sampling, and normalizers.

Filled by the offline-data and algorithm work; empty until then."""
