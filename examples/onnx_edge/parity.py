"""How far ONNX Runtime's actions are from the JAX artifact's, on a plant's own log.

Both runtimes decide the same rows: the dataset's readings with the previous logged
action, and edge rows (:func:`edge_case_inputs`: bounds, thresholds, NaN, ±inf, extreme
and subnormal readings). Differences are given in plant units and as a share of each
action's range, the scale-free figure::

    python examples/onnx_edge/parity.py policy datasets/mixing-tank

``policy`` is an artifact exported with ``--format onnx``; the dataset is a native one
(``neorl-industrial datasets import``). Needs this project and its ``onnx`` extra.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import numpy as np
import onnxruntime

from neorl_industrial.integration.datasets import load_native
from neorl_industrial.wrappers.agents import PolicyArtifact
from neorl_industrial.wrappers.agents.onnx_export import (
    compare_decisions,
    edge_case_inputs,
    subnormal_rows,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", type=Path, help="an artifact exported with --format onnx")
    parser.add_argument("dataset", type=Path, help="a native dataset of the plant's log")
    parser.add_argument("--edge-rows", type=int, default=10_000)
    args = parser.parse_args()
    artifact = PolicyArtifact.load(args.policy)
    session = onnxruntime.InferenceSession(
        str(args.policy / artifact.manifest["onnx"]["file"]), providers=["CPUExecutionProvider"]
    )
    width = np.asarray(artifact.action_high, np.float64) - artifact.action_low

    def report(what: str, observations: np.ndarray, previous: np.ndarray, classes) -> None:
        jax_side = artifact.decide_rows(observations, previous)
        onnx_side = session.run(
            ["action", "proposed", "status"],
            {"observations": observations, "prev_actions": previous},
        )
        reference = (jax_side.action, jax_side.proposed, jax_side.status)
        parity = compare_decisions(reference, onnx_side, classes, observations)
        difference = np.abs(np.asarray(reference[0], np.float64) - onnx_side[0])
        relative = np.where(width > 0, difference / np.where(width > 0, width, 1.0), 0.0)
        # Rows with a subnormal reading are counted apart, as the export's check does.
        counted = ~subnormal_rows(observations)
        print(
            f"{what}: {parity.rows} rows, largest action difference "
            f"{parity.max_action_difference:.2g} (plant units), "
            f"{np.nanmax(relative[counted]):.2g} of the action range; statuses differing "
            f"{parity.status_mismatches}; rows with a subnormal reading apart: "
            f"{parity.subnormal_rows}"
        )

    dataset, _ = load_native(args.dataset)
    host = jax.device_get(dataset)
    rows = min(len(host.observations), len(host.actions))
    observations = np.asarray(host.observations[:rows], np.float32)
    actions = np.asarray(host.actions[:rows], np.float32)
    previous = np.concatenate([actions[:1], actions[:-1]])  # the action logged before
    report("the log", observations, previous, np.full(rows, "log", dtype=object))
    edges = edge_case_inputs(artifact.compiled_constraints, args.edge_rows, seed=1)
    report("edge rows", edges.observations, edges.prev_actions, edges.classes)


if __name__ == "__main__":
    main()
