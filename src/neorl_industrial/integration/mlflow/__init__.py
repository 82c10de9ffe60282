"""MLflow tracking callback, pyfunc policy model and registry helpers.

Filled by the MLflow work; empty until then."""
