"""Layer 3: thin stateful shells over the functional layers, for people and for Gymnasium."""
