"""Layer 1, the pure JAX core: environments, agents, safety and utilities.

Nothing here performs I/O or has Python side effects; every function is jit- and
vmap-safe. The core imports nothing from the layers above, nor MLflow, FastAPI or
Gymnasium.
"""
