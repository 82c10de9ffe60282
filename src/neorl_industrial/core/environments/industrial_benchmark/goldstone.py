"""The goldstone mis-calibration sub-dynamics of the Industrial Benchmark.

The effective shift of the plant moves a hidden angle ``phi`` around a normalized,
linearly biased goldstone potential. The angle lives on a grid of ``NUMBER_STEPS``
positions; only ``2 * STRONGEST_PENALTY_IDX + 1`` of them are reachable after the
symmetry step, so each has one penalty function whose constants are tabulated once,
in float64, at import. At run time a penalty is a table lookup and a few
arithmetic operations.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from flax import struct

NUMBER_STEPS = 24
STRONGEST_PENALTY_IDX = NUMBER_STEPS // 4
N_PENALTY_FUNCTIONS = 2 * STRONGEST_PENALTY_IDX + 1
MAX_REQUIRED_STEP = math.sin(15.0 / 180.0 * math.pi)
SAFE_ZONE = MAX_REQUIRED_STEP / 2.0

# Normalization of the linearly biased goldstone potential (NLGP).
_U0 = np.cbrt(1.0 + math.sqrt(2.0)) / math.sqrt(3.0)
_R0 = _U0 + 1.0 / (3.0 * _U0)
_LAMBDA = 2.0 * _R0**2 - _R0**4 + 8.0 * math.sqrt(2.0 / 27.0) * _R0
NLGP_ALPHA = 2.0 / _LAMBDA
NLGP_BETA = 1.0 / _LAMBDA
NLGP_KAPPA = -8.0 * math.sqrt(2.0 / 27.0) / _LAMBDA
_QH_B = -math.sqrt(1.0 / 27.0)


def _global_minimum_radius(phi: float) -> float:
    """Radius along the ``phi`` axis at which the NLGP is minimal."""
    qh = NLGP_KAPPA * abs(math.sin(phi)) / (8.0 * NLGP_BETA)
    signum_phi = float(np.sign(math.sin(phi))) or 1.0
    if qh <= _QH_B:
        u = np.cbrt(-signum_phi * qh + math.sqrt(qh * qh - 1.0 / 27.0))
        return float(u + 1.0 / (3.0 * u))
    return signum_phi * math.sqrt(4.0 / 3.0) * math.cos(math.acos(-qh * math.sqrt(27.0)) / 3.0)


def _optimal_radius(phi: float) -> float:
    """Radius at which the penalty for angle ``phi`` (in [0, 2π)) is optimal."""
    radius = max(abs(math.sin(phi)), MAX_REQUIRED_STEP)
    return -radius if phi >= math.pi else radius


@struct.dataclass
class PenaltyTable:
    """Constants of the 13 penalty functions, indexed by ``phi_idx + STRONGEST_PENALTY_IDX``."""

    optimal_radius: jnp.ndarray  # |r_opt|: the radius the warping moves the minimum to
    minimum_radius: jnp.ndarray  # |r_min|: the NLGP's own minimum along phi
    exponent: jnp.ndarray  # outer warping exponent
    scaling: jnp.ndarray  # outer warping scale
    sin_phi: jnp.ndarray  # sin(phi), the linear bias direction


def _build_penalty_table() -> dict[str, np.ndarray]:
    columns: dict[str, list[float]] = {name: [] for name in PenaltyTable.__dataclass_fields__}
    for idx in range(-STRONGEST_PENALTY_IDX, STRONGEST_PENALTY_IDX + 1):
        phi = np.mod(idx * 2.0 * math.pi / NUMBER_STEPS, 2.0 * math.pi)
        opt_abs = abs(_optimal_radius(phi))
        min_abs = abs(_global_minimum_radius(phi))
        exponent = (2.0 - opt_abs) / (2.0 - min_abs)
        columns["optimal_radius"].append(opt_abs)
        columns["minimum_radius"].append(min_abs)
        columns["exponent"].append(exponent)
        columns["scaling"].append((2.0 - min_abs) / (2.0 - opt_abs) ** exponent)
        columns["sin_phi"].append(math.sin(phi))
    return {name: np.asarray(values, dtype=np.float64) for name, values in columns.items()}


PENALTY_TABLE_F64 = _build_penalty_table()


def penalty(phi_idx: jnp.ndarray, position: jnp.ndarray) -> jnp.ndarray:
    """Value of the goldstone penalty function ``phi_idx`` at the effective shift ``position``.

    The radius is warped so that the potential's minimum sits at the optimal radius:
    linearly inside it and by a power law outside, then the NLGP is evaluated.
    """
    dtype = position.dtype
    index = phi_idx + STRONGEST_PENALTY_IDX

    def column(name: str) -> jnp.ndarray:
        return jnp.asarray(PENALTY_TABLE_F64[name], dtype=dtype)[index]

    opt_abs = column("optimal_radius")
    min_abs = column("minimum_radius")
    abs_position = jnp.abs(position)
    inner = position * (min_abs / opt_abs)
    # The power is only taken where it is used; clamping keeps its argument positive.
    excess = jnp.maximum(abs_position - opt_abs, jnp.asarray(1e-30, dtype))
    outer = jnp.sign(position) * (min_abs + column("scaling") * excess ** column("exponent"))
    radius = jnp.where(abs_position <= opt_abs, inner, outer)
    radius_sq = radius * radius
    return (
        -NLGP_ALPHA * radius_sq
        + NLGP_BETA * radius_sq * radius_sq
        + NLGP_KAPPA * column("sin_phi") * radius
    )


def transition(
    domain: jnp.ndarray,
    phi_idx: jnp.ndarray,
    system_response: jnp.ndarray,
    position: jnp.ndarray,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """One step of the mis-calibration state machine.

    Args:
        domain: -1 (negative) or +1 (positive) side the shift last left the safe zone on.
        phi_idx: integer angle index in ``[-STRONGEST_PENALTY_IDX, STRONGEST_PENALTY_IDX]``.
        system_response: +1 (advantageous) or -1 (disadvantageous).
        position: the effective shift.

    Returns:
        The new ``(domain, phi_idx, system_response)``.
    """
    k = STRONGEST_PENALTY_IDX
    in_safe_zone = jnp.abs(position) <= SAFE_ZONE
    position_sign = jnp.sign(position).astype(domain.dtype)

    new_domain = jnp.where(in_safe_zone, domain, position_sign)
    system_response = jnp.where(
        new_domain != domain, jnp.ones_like(system_response), system_response
    )

    at_turning_point = phi_idx == -new_domain * k
    angular_step = jnp.where(
        in_safe_zone,
        -jnp.sign(phi_idx),
        jnp.where(at_turning_point, 0, system_response * position_sign),
    )
    phi_idx = phi_idx + angular_step.astype(phi_idx.dtype)

    beyond_strongest = jnp.abs(phi_idx) >= k
    system_response = jnp.where(beyond_strongest, -jnp.ones_like(system_response), system_response)
    mirrored = 2 * k - jnp.mod(phi_idx + 4 * k, 4 * k)
    phi_idx = jnp.where(beyond_strongest, mirrored, phi_idx)

    back_home = (phi_idx == 0) & in_safe_zone
    new_domain = jnp.where(back_home, jnp.ones_like(new_domain), new_domain)
    system_response = jnp.where(back_home, jnp.ones_like(system_response), system_response)
    return new_domain, phi_idx, system_response
