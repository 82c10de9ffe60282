"""Layer 2: functional PyTree state management and transformations over the core."""
