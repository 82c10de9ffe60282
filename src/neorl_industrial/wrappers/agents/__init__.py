"""The Agent facade: fit / predict / save / load / export.

Filled by the training-runs work; empty until then."""
