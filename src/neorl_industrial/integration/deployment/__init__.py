"""The FastAPI policy server: settings, auth, metrics.

Filled by the serving work; empty until then."""
