"""One control interval of an ODE, integrated with diffrax.

The process tasks hold the control input and the disturbances constant over a control
interval (zero-order hold) and integrate the plant's vector field across it, at a fixed
step (:func:`integrate_interval`) or an adaptive one (:func:`integrate_adaptive`).

A fixed number of sub-steps keeps the work of every batched copy the same, so a ``vmap`` of
thousands of plants runs one loop of ``substeps`` iterations; a task chooses ``substeps`` so
its fixed-step solution stays within its fidelity tolerance of the reference's adaptive
solver. A plant whose equation turns stiff in part of its range (the four-tank near an empty
tank) takes the adaptive step instead: under ``vmap`` every plant of a batch runs the step
count of the one that needs the most.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import diffrax
import jax
import jax.numpy as jnp

#: ``vector_field(state, control, disturbance, params) -> d state / dt``
VectorField = Callable[[jax.Array, jax.Array, jax.Array, Any], jax.Array]

SOLVERS: dict[str, Callable[[], diffrax.AbstractSolver]] = {
    "tsit5": diffrax.Tsit5,
    "dopri5": diffrax.Dopri5,
    "heun": diffrax.Heun,
    "euler": diffrax.Euler,
}


def solver_named(name: str) -> diffrax.AbstractSolver:
    """The diffrax solver called ``name`` (one of :data:`SOLVERS`).

    Raises:
        ValueError: for an unknown name, naming the known ones.
    """
    if name not in SOLVERS:
        raise ValueError(f"solver: unknown ODE solver {name!r}; expected one of {sorted(SOLVERS)}")
    return SOLVERS[name]()


def integrate_interval(
    vector_field: VectorField,
    state: jax.Array,
    control: jax.Array,
    disturbance: jax.Array,
    params: Any,
    dt: jax.Array | float,
    *,
    substeps: int,
    solver: diffrax.AbstractSolver | None = None,
) -> jax.Array:
    """The state after one control interval of length ``dt``.

    Args:
        vector_field: the plant's right-hand side (pure, one plant).
        state: the state at the start of the interval.
        control, disturbance: held constant over the interval.
        params: the plant's traced parameters, passed through to ``vector_field``.
        dt: the interval's length (may be traced).
        substeps: fixed number of solver steps across the interval (static).
        solver: a diffrax solver (default: Tsit5, the 5th-order Runge-Kutta pc-gym uses).

    Returns:
        The state at ``t = dt``. A solution that turns non-finite stays non-finite: the
        caller decides what a diverged interval means for its episode.
    """
    term = diffrax.ODETerm(
        lambda _t, y, args: vector_field(y, args[0], args[1], args[2]).astype(y.dtype)
    )
    dt = jnp.asarray(dt, state.dtype)
    solution = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5() if solver is None else solver,
        t0=jnp.zeros((), state.dtype),
        t1=dt,
        dt0=dt / substeps,
        y0=state,
        args=(control, disturbance, params),
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=diffrax.ConstantStepSize(),
        # One more than ``substeps``: rounding can leave a sliver of the interval.
        max_steps=substeps + 1,
        # A fixed step cannot fail to converge; non-finite states are the caller's to flag.
        throw=False,
    )
    return solution.ys[-1]


def integrate_adaptive(
    vector_field: VectorField,
    state: jax.Array,
    control: jax.Array,
    disturbance: jax.Array,
    params: Any,
    dt: jax.Array | float,
    *,
    rtol: float,
    atol: float,
    max_steps: int,
    solver: diffrax.AbstractSolver | None = None,
) -> jax.Array:
    """The state after one control interval of length ``dt``, with the step size controlled
    to ``rtol`` and ``atol`` (diffrax's PID controller; the solver picks its first step).

    Args:
        vector_field, state, control, disturbance, params, dt: as :func:`integrate_interval`.
        rtol, atol: the step controller's relative and absolute tolerances.
        max_steps: the most solver steps one interval may take (static).
        solver: a diffrax solver (default: Tsit5).

    Returns:
        The state at ``t = dt``; NaN where the solver could not finish the interval within
        ``max_steps`` (a solve stopped early would otherwise return an intermediate state),
        so the caller flags the interval as diverged.
    """
    term = diffrax.ODETerm(
        lambda _t, y, args: vector_field(y, args[0], args[1], args[2]).astype(y.dtype)
    )
    solution = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5() if solver is None else solver,
        t0=jnp.zeros((), state.dtype),
        t1=jnp.asarray(dt, state.dtype),
        dt0=None,
        y0=state,
        args=(control, disturbance, params),
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
        throw=False,
    )
    solved = solution.result == diffrax.RESULTS.successful
    return jnp.where(solved, solution.ys[-1], jnp.nan)
