"""One control interval of an ODE.

The process tasks hold the control input and the disturbances constant over a control
interval (zero-order hold) and integrate the plant's vector field across it: with diffrax
at a fixed step (:func:`integrate_interval`), or with an L-stable implicit Runge-Kutta
method on a grid graded towards the interval's start (:func:`integrate_graded_sdirk`) for a
plant whose equation is stiff in part of its range and whose stage equations the task
solves in closed form.

A fixed number of sub-steps keeps the work of every batched copy the same, so a ``vmap`` of
thousands of plants runs one loop of ``substeps`` iterations; a task chooses ``substeps`` so
its fixed-step solution stays within its fidelity tolerance of the reference's adaptive
solver. A plant whose equation turns stiff in part of its range (the four-tank near an empty
tank) needs an implicit method there: an adaptive explicit step would make every plant of a
``vmap`` batch run the step count of the one that needs the most, while the graded SDIRK
grid has the same steps for every plant of a given ``dt``.
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


#: Hairer and Wanner's SDIRK4 (Solving Ordinary Differential Equations II, section IV.6,
#: table 6.5 with gamma = 1/4): 5 stages, order 4, L-stable and stiffly accurate (the last
#: stage is the solution), so a stiff component relaxes to its equilibrium within a step
#: instead of oscillating. Row ``i`` holds stage ``i``'s coefficients; the last of each row
#: is the diagonal ``gamma``.
SDIRK4_TABLEAU: tuple[tuple[float, ...], ...] = (
    (1 / 4,),
    (1 / 2, 1 / 4),
    (17 / 50, -1 / 25, 1 / 4),
    (371 / 1360, -137 / 2720, 15 / 544, 1 / 4),
    (25 / 24, -49 / 48, 125 / 16, -85 / 12, 1 / 4),
)

#: ``stage_solve(base, h_gamma, args) -> k``: the derivative ``k = f(Y)`` at the solution
#: ``Y`` of one implicit stage, ``Y = base + h_gamma f(Y)`` (one plant).
StageSolver = Callable[[jax.Array, jax.Array, Any], jax.Array]


def graded_steps(dt: jax.Array | float, *, step_scale: float, min_steps: int) -> jax.Array:
    """The number of steps :func:`integrate_graded_sdirk` takes across an interval of
    length ``dt``: ``max(min_steps, ceil(dt / step_scale))`` (int32, traced with ``dt``),
    where a quotient within 1e-6 above a whole number counts as that number (float32's
    rounding of ``dt / step_scale``)."""
    dt = jnp.asarray(dt, jnp.float32)
    quotient = dt / step_scale * (1.0 - 1e-6)
    return jnp.maximum(min_steps, jnp.ceil(quotient)).astype(jnp.int32)


def integrate_graded_sdirk(
    stage_solve: StageSolver,
    state: jax.Array,
    args: Any,
    dt: jax.Array | float,
    *,
    step_scale: float,
    min_steps: int,
    grading: float,
    max_steps: int,
) -> jax.Array:
    """The state after one control interval of length ``dt``, by :data:`SDIRK4_TABLEAU` on
    the graded grid ``t_i = dt (i / n)^grading``, ``i = 0..n`` (``n`` from
    :func:`graded_steps`).

    The grid is fine where the control has just changed, where a state at a bound (an
    empty tank refilled) varies like the square root of time, and coarse where the solution
    is smooth; L-stability keeps the coarse steps stable where the equation is stiff. The
    solution is carried as increments: the last stage's ``base + h gamma k`` rather than
    its solved value, so float32 rounds the small increment, not the state, at every step.

    Args:
        stage_solve: solves one implicit stage (see :data:`StageSolver`).
        state: the state at the start of the interval.
        args: passed through to ``stage_solve`` (the held control, the constants).
        dt: the interval's length (may be traced).
        step_scale: the interval length per step (the grid's average step at most).
        min_steps: the fewest steps per interval.
        grading: the grid's exponent (1: uniform; 2: the first step ``dt / n^2``).
        max_steps: the most steps per interval (static); an interval that needs more
            returns NaN, which the caller reports as diverged.

    Returns:
        The state at ``t = dt``; NaN when ``dt`` needs more than ``max_steps`` steps.
    """
    dt = jnp.asarray(dt, state.dtype)
    n_steps = graded_steps(dt, step_scale=step_scale, min_steps=min_steps)
    n_float = n_steps.astype(state.dtype)

    def step(index: jax.Array, y: jax.Array) -> jax.Array:
        position = index.astype(state.dtype)
        start = dt * (position / n_float) ** grading
        length = dt * ((position + 1.0) / n_float) ** grading - start
        derivatives: list[jax.Array] = []
        base = y
        for row in SDIRK4_TABLEAU:
            # The explicit part of each stage, summed apart from ``y`` so that the large,
            # cancelling coefficients of the last row act on rates, not on levels.
            increment = sum(
                (coefficient * k for coefficient, k in zip(row[:-1], derivatives, strict=True)),
                jnp.zeros_like(y),
            )
            base = y + length * increment
            h_gamma = length * row[-1]
            derivatives.append(stage_solve(base, h_gamma, args))
        return base + h_gamma * derivatives[-1]

    solution = jax.lax.fori_loop(0, jnp.minimum(n_steps, max_steps), step, state)
    return jnp.where(n_steps <= max_steps, solution, jnp.nan)
