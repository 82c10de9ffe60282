"""Study plants the product was not written for: simulators of other physics than the
suite's tasks, their operators' controllers, the historian logs they write and the
truth about any policy run on them (``benchmarks.plants.truth``).

These are test and study plants (``benchmarks.verdict_study``, the tests), not product
tasks: the product never imports them. Each plant writes what a plant's historian and
engineers would hand over (a CSV, ``schema.yaml``, ``constraints.yaml``, ``run.yaml``),
so that ``neorl-industrial datasets import`` builds a dataset with no simulator behind it.

=================  ==========================================================  ============
plant              physics                                                     operators
=================  ==========================================================  ============
fired-heater       fuel heat with a 3 min transport delay, feed flow steps      beatable
ph-neutraliser     titration curve of a buffered effluent, acid load changes    near-optimal
gas-compressor     compressor map, surge line, header pressure; alarm flag      anti-surge
=================  ==========================================================  ============
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.plants.base import Plant, write_log

__all__ = ["PLANTS", "Plant", "make_plant", "write_plant"]


def _plants() -> dict[str, type[Plant]]:
    from benchmarks.plants.compressor import GasCompressor
    from benchmarks.plants.heater import FiredHeater
    from benchmarks.plants.ph import PhNeutraliser

    return {cls.name: cls for cls in (FiredHeater, PhNeutraliser, GasCompressor)}


PLANTS = ("fired-heater", "ph-neutraliser", "gas-compressor")


def make_plant(name: str) -> Plant:
    """The plant called ``name`` (one of :data:`PLANTS`).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    plants = _plants()
    if name not in plants:
        raise ValueError(f"plant: unknown {name!r}; the study plants are {list(PLANTS)}")
    return plants[name]()


def write_plant(
    name: str, folder: str | Path, *, seed: int = 0, episodes: int = 16, history: int = 1
) -> Path:
    """Writes plant ``name``'s log (``episodes`` episodes of its operators, ``seed``) and
    its schema (observations of ``history`` rows), constraints and run files into
    ``folder``; returns the CSV's path."""
    return write_log(make_plant(name), folder, seed=seed, episodes=episodes, history=history)
