"""Scan-fused training loops and vmap over seeds.

Filled by the algorithm work; empty until then."""
