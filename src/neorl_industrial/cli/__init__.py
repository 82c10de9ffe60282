"""The ``neorl-industrial`` command line.

``run`` is the main job: it generates a small Industrial Benchmark dataset, trains a safe
agent (TD3BC-Lag, three seeds at once), evaluates it with the shield, saves and exports
the policy and prints what happened and where the results are. ``train`` runs any
configuration (``configs/``), ``evaluate`` and ``export`` work on saved agents,
``models`` and ``mlflow`` work with MLflow's registry and tracking, ``serve`` serves a
policy and ``audit verify`` checks its audit log, ``datasets`` generates, inspects and
imports data, ``envs`` and ``rollout`` show the environments, ``bench`` runs a benchmark
of ``benchmarks/``.

One module per command group (``training``, ``models``, ``serving``, ``audit``,
``datasets``, ``environments``, ``bench``, ``keys``), each adding its commands with
``add_parsers``; ``entry`` assembles them.
"""

from neorl_industrial.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
