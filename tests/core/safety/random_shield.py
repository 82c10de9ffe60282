"""Random constraint specs, decisions of the shield on them, and an independent float64
oracle (scipy's HiGHS linear programs and SLSQP) of what the shield must do.

A *structure* fixes what is static in compiled constraints (how many actions, which have
rate limits, the state limits, how many linear rules and what they read, every
priority, the fallback's kind); its *variants* draw every number (bounds, limits,
thresholds, coefficients at scales from 0.01 to 100, the plant's scale from 1 to 100)
and are stacked, so one compiled program decides for all of them (``vmap`` over the
constraints' leaves). Decisions draw observations, previous actions (some outside every
rule) and proposals (some NaN).

The oracle: a rule is *keepable* when it, and every rule of its level and above, can be
kept together with the action bounds by some action (an LP). A decision *breaks a
keepable rule* when its applied action breaks, by more than the shield's tolerance in
exact arithmetic, a rule that is keepable with a margin of ``ROBUST`` (in the actions'
ranges); rules keepable only more narrowly than that are counted apart (``thin``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import linprog, minimize

from neorl_industrial.core.safety import ConstraintSpec, shield
from neorl_industrial.core.safety.constraints import TOLERANCE

# The margin (in the actions' ranges) a rule set must be keepable by to count.
ROBUST = 1e-4
LEVELS = (100, 200, 300)
FALLBACKS = ("hold_previous", "constant", "controller")


@dataclass
class Structure:
    n_actions: int
    rated: tuple[int, ...]
    rate_priority: tuple[int, ...]
    states: tuple[tuple[int, int, bool, bool, int], ...]  # feature, action, above, has_min, prio
    linear_priority: tuple[int, ...]
    linear_reads: tuple[bool, ...]
    fallback: str


@dataclass
class Batch:
    """Decisions of one structure: inputs, the shield's outputs, and each row's rules."""

    structure: Structure
    specs: list[dict]
    variant: np.ndarray  # [D] which spec
    observations: np.ndarray
    proposals: np.ndarray
    previous: np.ndarray
    applied: np.ndarray = field(default_factory=lambda: np.zeros(0))
    status: np.ndarray = field(default_factory=lambda: np.zeros(0))
    compiled: list = field(default_factory=list)


def random_structure(rng: np.random.Generator) -> Structure:
    n = int(rng.integers(2, 5))
    rated = tuple(int(j) for j in np.flatnonzero(rng.random(n) < 0.5))
    states = tuple(
        (
            int(rng.integers(0, 2)),
            int(rng.integers(0, n)),
            bool(rng.random() < 0.5),
            bool(rng.random() < 0.5),
            int(rng.choice(LEVELS)),
        )
        for _ in range(int(rng.integers(0, 3)))
    )
    n_linear = int(rng.integers(1, 4))
    return Structure(
        n_actions=n,
        rated=rated,
        rate_priority=tuple(int(rng.choice(LEVELS)) for _ in rated),
        states=states,
        linear_priority=tuple(int(rng.choice(LEVELS)) for _ in range(n_linear)),
        linear_reads=tuple(bool(rng.random() < 0.5) for _ in range(n_linear)),
        fallback=FALLBACKS[int(rng.integers(0, len(FALLBACKS)))],
    )


def _spec(structure: Structure, rng: np.random.Generator) -> dict:
    n = structure.n_actions
    names = [f"a{j}" for j in range(n)]
    scale = float(rng.choice([1.0, 10.0, 100.0]))
    low = -rng.uniform(0.0, 1.0, n) * scale
    high = rng.uniform(0.2, 1.0, n) * scale
    spec: dict = {
        "action_bounds": {
            name: [float(lo), float(hi)] for name, lo, hi in zip(names, low, high, strict=True)
        },
        "rate_limits": {
            names[j]: {"max_change": float(rng.uniform(0.1, 0.6) * scale), "priority": p}
            for j, p in zip(structure.rated, structure.rate_priority, strict=True)
        },
        "state_limits": [],
        "linear": [],
    }
    for k, (feature, j, above, has_min, priority) in enumerate(structure.states):
        limit = float(rng.uniform(low[j], high[j]))
        spec["state_limits"].append(
            {
                "name": f"state{k}",
                "when": {"feature": f"o{feature}", "above" if above else "below": 0.0},
                "action": names[j],
                "min" if has_min else "max": limit,
                "priority": priority,
            }
        )
    for k, (priority, reads) in enumerate(
        zip(structure.linear_priority, structure.linear_reads, strict=True)
    ):
        row_scale = float(rng.choice([0.01, 1.0, 100.0]))
        coefficients = rng.normal(size=n)
        coefficients[np.abs(coefficients) < 0.05] = 0.3
        coefficients *= row_scale
        # Bounds from well inside to outside the box's reach.
        centre = coefficients @ ((low + high) / 2)
        reach = np.abs(coefficients) @ ((high - low) / 2)
        rule = {
            "name": f"linear{k}",
            "action": {name: float(c) for name, c in zip(names, coefficients, strict=True)},
            "bound": float(centre + rng.uniform(-0.9, 1.0) * reach),
            "priority": priority,
        }
        if reads:
            rule["observation"] = {"o0": float(rng.uniform(-0.5, 0.5) * row_scale * scale)}
        spec["linear"].append(rule)
    if structure.fallback == "constant":
        spec["fallback"] = {
            "kind": "constant",
            "value": {
                name: float(rng.uniform(lo, hi))
                for name, lo, hi in zip(names, low, high, strict=True)
            },
        }
    elif structure.fallback == "controller":
        spec["fallback"] = {"kind": "controller", "controller": "zero"}
    else:
        spec["fallback"] = {"kind": "hold_previous"}
    spec["_scale"] = scale
    return spec


def _compile(spec: dict, n: int):
    body = {key: value for key, value in spec.items() if not key.startswith("_")}
    return ConstraintSpec.from_dict(body).compile(2, n, ("o0", "o1"), [f"a{j}" for j in range(n)])


_DECIDE = jax.jit(jax.vmap(shield))


def decide(structure: Structure, rng: np.random.Generator, variants: int, per: int) -> Batch:
    """``variants`` specs of ``structure``, ``per`` decisions each, decided in one call."""
    n = structure.n_actions
    specs = [_spec(structure, rng) for _ in range(variants)]
    compiled = [_compile(spec, n) for spec in specs]
    variant = np.repeat(np.arange(variants), per)
    stacked = jax.tree_util.tree_map(
        lambda *leaves: jnp.asarray(np.stack([np.asarray(x) for x in leaves])[variant]),
        *compiled,
    )
    low = np.stack([np.asarray(c.bound_low) for c in compiled])[variant]
    high = np.stack([np.asarray(c.bound_high) for c in compiled])[variant]
    rows = len(variant)
    observations = rng.uniform(-2.0, 2.0, (rows, 2)).astype(np.float32)
    span = high - low
    previous = rng.uniform(low - 0.3 * span, high + 0.3 * span).astype(np.float32)
    # Previous actions inside the box too (a plant that kept its rules).
    inside = rng.random(rows) < 0.7
    previous[inside] = rng.uniform(low, high)[inside].astype(np.float32)
    proposals = rng.uniform(low - span, high + span).astype(np.float32)
    proposals[rng.random(rows) < 0.15] = np.nan
    applied, report = _DECIDE(stacked, observations, proposals, previous)
    batch = Batch(structure, specs, variant, observations, proposals, previous)
    batch.applied = np.asarray(applied)
    batch.status = np.asarray(report.status)
    batch.compiled = compiled
    return batch


# ----- the oracle ---------------------------------------------------------------------------


def _rules(spec: dict, n: int, observation: np.ndarray, previous: np.ndarray, compiled):
    """Every hard rule but the bounds as ``(level, coefficients [n], bound)`` rows of
    ``coefficients · x <= bound`` in float64, from the compiled (float32) numbers."""
    rows = []
    for k, j in enumerate(compiled.rate_index):
        if not np.isfinite(previous[j]):
            continue
        limit = float(compiled.rate_limit[k])
        unit = np.eye(n)[j]
        level = compiled.rate_priority[k]
        rows.append((level, unit, float(previous[j]) + limit, f"rate{j}"))
        rows.append((level, -unit, limit - float(previous[j]), f"rate{j}"))
    for k, j in enumerate(compiled.state_action):
        value = float(observation[compiled.state_feature[k]])
        threshold = float(compiled.state_threshold[k])
        on = value > threshold if bool(compiled.state_above[k]) else value < threshold
        if not on:
            continue
        unit = np.eye(n)[j]
        level = compiled.state_priority[k]
        if np.isfinite(float(compiled.state_low[k])):
            rows.append((level, -unit, -float(compiled.state_low[k]), f"state{k}"))
        if np.isfinite(float(compiled.state_high[k])):
            rows.append((level, unit, float(compiled.state_high[k]), f"state{k}"))
    act = np.asarray(compiled.linear_act, np.float64)
    obs = np.asarray(compiled.linear_obs, np.float64)
    bound = np.asarray(compiled.linear_bound, np.float64)
    for r in range(act.shape[0]):
        rhs = bound[r] - math.fsum(obs[r] * observation.astype(np.float64))
        rows.append((compiled.linear_priority[r], act[r], rhs, f"linear{r}"))
    return rows


def _max_margin(rows, low, high, width):
    """The largest margin (in the actions' ranges) by which some action in the bounds
    keeps every row; -inf when the LP fails."""
    n = len(low)
    if not rows:
        return np.inf
    a = np.asarray([row[1] for row in rows]) * width[None, :]
    norms = np.linalg.norm(a, axis=1)
    keep = norms > 0
    b = np.asarray([row[2] for row in rows])
    if np.any(~keep & (b < 0)):
        return -np.inf
    a, b, norms = a[keep], b[keep], norms[keep]
    if not len(a):
        return np.inf
    cost = np.zeros(n + 1)
    cost[-1] = -1.0
    result = linprog(
        cost,
        A_ub=np.hstack([a / norms[:, None], np.ones((len(a), 1))]),
        b_ub=b / norms,
        bounds=[(lo / w, hi / w) for lo, hi, w in zip(low, high, width, strict=True)]
        + [(None, 10.0)],
        method="highs",
    )
    return -result.fun if result.status == 0 else -np.inf


@dataclass
class Verdict:
    decisions: int = 0
    breaks: int = 0  # a robustly keepable rule broken
    thin: int = 0  # a rule keepable only by less than ROBUST broken
    false_infeasible: int = 0  # flagged infeasible while every rule is robustly keepable
    examples: list = field(default_factory=list)


def judge(batch: Batch, verdict: Verdict) -> Verdict:
    """Counts the decisions of ``batch`` that break a keepable rule (module docstring)."""
    n = batch.structure.n_actions
    for i in range(len(batch.variant)):
        verdict.decisions += 1
        compiled = batch.compiled[batch.variant[i]]
        x = batch.applied[i].astype(np.float64)
        low = np.asarray(compiled.bound_low, np.float64)
        high = np.asarray(compiled.bound_high, np.float64)
        width = high - low
        rows = _rules(
            batch.specs[batch.variant[i]],
            n,
            batch.observations[i],
            batch.previous[i].astype(np.float64),
            compiled,
        )
        broken = {name for _, a, b, name in rows if not (b - math.fsum(a * x) >= -TOLERANCE)}
        out_of_bounds = not (np.all(x >= low) and np.all(x <= high))
        infeasible = bool(batch.status[i] & 16)
        if not broken and not out_of_bounds and not infeasible:
            continue
        # Keepability is monotone in the level (fewer rules above a higher one), so the
        # highest level among the broken rules decides whether any of them was keepable.
        level_of = {row[3]: row[0] for row in rows}
        if out_of_bounds:
            verdict.breaks += 1
        elif broken:
            top = max(level_of[name] for name in broken)
            margin = _max_margin([row for row in rows if row[0] >= top], low, high, width)
            if margin >= ROBUST:
                verdict.breaks += 1
                if len(verdict.examples) < 5:
                    verdict.examples.append(
                        (
                            batch.specs[batch.variant[i]],
                            batch.observations[i],
                            batch.proposals[i],
                            batch.previous[i],
                            batch.applied[i],
                            sorted(broken),
                        )
                    )
            elif margin >= 0.0:
                verdict.thin += 1
        if infeasible and _max_margin(rows, low, high, width) >= ROBUST:
            verdict.false_infeasible += 1
    return verdict


def nearest_reference(start, low, high, rows, width):
    """SLSQP's nearest point to ``start`` (in the actions' ranges) keeping ``rows``."""
    weights = 1.0 / np.square(width)
    a = np.asarray([row[1] for row in rows]) if rows else np.zeros((0, len(start)))
    b = np.asarray([row[2] for row in rows]) if rows else np.zeros(0)
    constraints = [{"type": "ineq", "fun": lambda z: b - a @ z, "jac": lambda z: -a}]
    result = minimize(
        lambda z: 0.5 * np.sum(weights * np.square(z - start)),
        np.clip(start, low, high),
        jac=lambda z: weights * (z - start),
        bounds=list(zip(low, high, strict=True)),
        constraints=constraints if rows else (),
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 1000},
    )
    return result.x, result.success


def nearest_excess(batch: Batch, limit: int) -> tuple[int, float]:
    """Over up to ``limit`` projected decisions (every rule robustly keepable, a finite
    proposal), the largest excess of the applied action's distance from the proposal
    over SLSQP's, relative to the distance (in the actions' ranges); and how many."""
    n = batch.structure.n_actions
    checked, worst = 0, 0.0
    for i in np.flatnonzero(batch.status & 2):  # PROJECTED
        if checked >= limit:
            break
        compiled = batch.compiled[batch.variant[i]]
        low = np.asarray(compiled.bound_low, np.float64)
        high = np.asarray(compiled.bound_high, np.float64)
        width = high - low
        rows = _rules(
            batch.specs[batch.variant[i]],
            n,
            batch.observations[i],
            batch.previous[i].astype(np.float64),
            compiled,
        )
        if _max_margin(rows, low, high, width) < ROBUST:
            continue
        start = batch.proposals[i].astype(np.float64)
        reference, ok = nearest_reference(start, low, high, rows, width)
        if not ok:
            continue
        checked += 1
        ours = np.linalg.norm((batch.applied[i] - start) / width)
        theirs = np.linalg.norm((reference - start) / width)
        worst = max(worst, (ours - theirs) / max(theirs, 1e-3))
    return checked, worst
