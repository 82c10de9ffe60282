"""Benchmarks of neorl_industrial: one result format, a runner and a compare tool.

Run ``python -m benchmarks.run --list`` from the repository root to see what is available.
"""
