"""Layer 4: the outside world (MLflow, runtime safety monitoring, deployment)."""
