"""Constraints as data, per-step costs and the ``lax.cond`` safety shield.

``ConstraintSpec`` (pydantic, YAML) is what a safety engineer writes; ``compile`` turns it
into :class:`CompiledConstraints`, a PyTree the pure functions here evaluate under ``jit``
and ``vmap``; :func:`shield` is the one shield used by rollouts, evaluation, the Gymnasium
wrappers and the policy server.
"""

from neorl_industrial.core.safety.constraints import (
    DEFAULT_PRIORITY,
    TOLERANCE,
    CompiledConstraints,
    action_box,
    cost_limits,
    costs,
    describe,
    in_data_range,
    margins,
    satisfies,
    violations,
)
from neorl_industrial.core.safety.contract import (
    SafetyContract,
    check_cost_limits,
    resolve_safety,
)
from neorl_industrial.core.safety.controllers import (
    get_safe_controller,
    register_safe_controller,
    safe_controllers,
)
from neorl_industrial.core.safety.shield import SafetyReport, fallback_action, project, shield
from neorl_industrial.core.safety.spec import (
    ActionBound,
    ConstraintSpec,
    ConstraintSpecError,
    CostSpec,
    FallbackSpec,
    LinearConstraint,
    RateLimit,
    StateCondition,
    StateLimit,
)

__all__ = [
    "DEFAULT_PRIORITY",
    "TOLERANCE",
    "ActionBound",
    "CompiledConstraints",
    "ConstraintSpec",
    "ConstraintSpecError",
    "CostSpec",
    "FallbackSpec",
    "LinearConstraint",
    "RateLimit",
    "SafetyContract",
    "SafetyReport",
    "StateCondition",
    "StateLimit",
    "action_box",
    "check_cost_limits",
    "cost_limits",
    "costs",
    "describe",
    "fallback_action",
    "get_safe_controller",
    "in_data_range",
    "margins",
    "project",
    "register_safe_controller",
    "resolve_safety",
    "safe_controllers",
    "satisfies",
    "shield",
    "violations",
]
