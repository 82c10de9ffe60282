"""The Trainer: scan-fused chunks, host callbacks, evaluation and checkpoints.

Filled by the training-runs work; empty until then."""
