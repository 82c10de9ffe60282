"""The ONNX graph of the exact shield: several linear rules on three priority levels, so
the projection's while loops (an ONNX ``Loop`` each) and the prioritized fallback run, make
the decisions the JAX shield makes."""

from __future__ import annotations

import jax
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")

from neorl_industrial.core.safety import shield  # noqa: E402
from neorl_industrial.core.safety.shield import FALLBACK, INFEASIBLE, PROJECTED  # noqa: E402
from neorl_industrial.wrappers.agents.onnx_graph import lower_to_onnx  # noqa: E402
from tests.core.safety.random_shield import _compile, _spec  # noqa: E402
from tests.core.safety.test_exact_shield import RICH  # noqa: E402


@pytest.mark.slow  # (lowering and compiling three levels of loops takes seconds)
def test_the_onnx_loop_decides_as_the_jax_shield():
    rng = np.random.default_rng(5)
    constraints = _compile(_spec(RICH, rng), RICH.n_actions)

    def decide(observations, actions, previous):
        safe, report = jax.vmap(lambda o, a, p: shield(constraints, o, a, p))(
            observations, actions, previous
        )
        return safe, report.status

    model = lower_to_onnx(
        decide,
        [("o", (2,), np.float32), ("a", (3,), np.float32), ("p", (3,), np.float32)],
        ["action", "status"],
    )
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    rows = 1_000
    low, high = np.asarray(constraints.bound_low), np.asarray(constraints.bound_high)
    span = high - low
    observations = rng.uniform(-2.0, 2.0, (rows, 2)).astype(np.float32)
    previous = rng.uniform(low - 0.3 * span, high + 0.3 * span, (rows, 3)).astype(np.float32)
    actions = rng.uniform(low - span, high + span, (rows, 3)).astype(np.float32)
    actions[rng.random(rows) < 0.15] = np.nan
    action, status = session.run(None, {"o": observations, "a": actions, "p": previous})
    expected_action, expected_status = (
        np.asarray(x) for x in jax.jit(decide)(observations, actions, previous)
    )
    np.testing.assert_array_equal(status, expected_status)
    # float32 rounding of the loop's arithmetic, relative to the actions' ranges.
    assert np.max(np.abs(action - expected_action) / span) < 1e-5
    # Every path ran: projections, fallbacks, contradicting rules.
    for bit in (PROJECTED, FALLBACK, INFEASIBLE):
        assert np.any(status & bit)
