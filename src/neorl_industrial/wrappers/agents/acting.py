"""An agent's policies acting: the shielded decision in plant units (``Agent.decide``)
and every run's policy in the task's simulator (``Agent.evaluate``)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from neorl_industrial.core.safety import shield
from neorl_industrial.core.safety.shield import SafetyReport
from neorl_industrial.wrappers.agents.readings import decision_inputs
from neorl_industrial.wrappers.training import summarize_runs
from neorl_industrial.wrappers.training.context import RunError

__all__ = ["decide", "evaluate_in_simulator"]


def decide(
    agent: Any, observation: Any, prev_action: Any, run: int | None, shield_actions: bool
) -> tuple[np.ndarray, SafetyReport | None]:
    """``Agent.decide`` of fitted ``agent`` (see it): the action(s) of run ``run``'s
    policy and the shield's report (None unshielded or for discrete actions).

    Raises:
        RunError: for a shape that does not fit or a reading that is refused.
    """
    task = agent.task
    # Read as the server and the bridge read them (wrappers.agents.readings):
    # subnormals as zero, a reading that is not finite refused by name, a NaN previous
    # action unknown (the shield leaves its rate limit out).
    batch, prev, single = decision_inputs(
        observation,
        None if agent.entry.discrete else prev_action,
        task.observation_names,
        ("action",) if agent.entry.discrete else task.action_names,
        error=RunError,
    )
    if agent.entry.discrete or not shield_actions:
        actions = np.asarray(agent._act_batch(agent.policy(run), batch))
        return (actions[0] if single else actions), None
    if agent._decide is None:
        agent._decide = shielded_decision(agent.algorithm.act, agent.constraints)
    safe, report = jax.device_get(agent._decide(agent.policy(run), batch, prev))
    if single:
        return np.asarray(safe[0]), jax.tree.map(lambda leaf: leaf[0], report)
    return np.asarray(safe), report


def shielded_decision(act: Any, constraints: Any) -> Any:
    """``decide(policy, observations, previous) -> (safe, report)``, jitted: ``act``'s
    deterministic actions for a batch behind the shield of ``constraints``."""

    def decide(policy: Any, observations: jax.Array, previous: jax.Array) -> Any:
        proposed = jax.vmap(lambda o: act(policy, o, None, deterministic=True))(observations)
        return shield(constraints, observations, proposed, previous)

    return jax.jit(decide)


def evaluate_in_simulator(
    agent: Any, episodes: int, horizon: int | None, shield_actions: bool, seed: int
) -> dict[str, Any]:
    """``Agent.evaluate`` of fitted ``agent`` (see it).

    Raises:
        RunError: when the task has no simulator.
    """
    if not agent.task.has_simulator:
        raise RunError(
            f"evaluate: task {agent.task.name!r} has no simulator; use "
            "evaluate_offline(dataset) for FQE estimates from logged data"
        )
    evaluator = agent.context.simulator_evaluator(
        agent.algorithm, episodes, horizon, shield_actions, seed
    )
    runs = evaluator(agent.policies, 0)
    return {"runs": runs, "summary": summarize_runs(runs), "selected_run": agent.selected}
