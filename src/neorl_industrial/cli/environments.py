"""``envs`` lists the registered environments; ``rollout`` runs and measures one."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from rich.table import Table

from neorl_industrial.cli.common import make_console, positive_int
from neorl_industrial.core.environments import (
    constant_policy,
    make,
    registered_envs,
    rollout,
    uniform_random_batch_policy,
)

POLICIES = ("random", "hold")


@dataclass
class RolloutReport:
    env_id: str
    policy: str
    n_envs: int
    n_steps: int
    episodes: int
    mean_return: float
    mean_episode_cost: np.ndarray
    invalid_actions: int
    compile_seconds: float
    run_seconds: float

    @property
    def steps_per_second(self) -> float:
        return self.n_envs * self.n_steps / self.run_seconds


def _policy(env, name: str):
    if name == "random":
        return uniform_random_batch_policy(env)
    if name == "hold":
        hold = jnp.asarray(13) if env.discrete else jnp.zeros(env.action_size)
        return constant_policy(hold)
    raise ValueError(f"policy: unknown policy {name!r}; expected one of {POLICIES}")


def run_rollouts(
    env_id: str, policy_name: str, n_envs: int, n_steps: int, seed: int, **overrides
) -> RolloutReport:
    """Runs a batched rollout and measures it (compile and run separately)."""
    env, params = make(env_id, **overrides)
    policy = _policy(env, policy_name)
    run = jax.jit(
        lambda key: rollout(key, env, params, policy, n_envs, n_steps),
        compiler_options=env.compiler_options or None,
    )
    key = jax.random.PRNGKey(seed)
    started = time.perf_counter()
    compiled = run.lower(key).compile()
    compiled_at = time.perf_counter()
    result = jax.block_until_ready(compiled(key))
    finished = time.perf_counter()
    return RolloutReport(
        env_id=env_id,
        policy=policy_name,
        n_envs=n_envs,
        n_steps=n_steps,
        episodes=int(result.episodes.sum()),
        mean_return=float(result.mean_episode_return()),
        mean_episode_cost=np.asarray(result.mean_episode_cost()),
        invalid_actions=int(result.invalid_actions.sum()),
        compile_seconds=compiled_at - started,
        run_seconds=finished - compiled_at,
    )


def _report_table(reports: Sequence[RolloutReport], cost_names: Sequence[str]) -> Table:
    table = Table(title="Batched rollouts")
    for column in ("environment", "policy", "episodes", "mean return"):
        table.add_column(column, justify="left" if column in ("environment", "policy") else "right")
    for name in cost_names:
        table.add_column(f"{name} cost / episode", justify="right")
    table.add_column("steps/s", justify="right")
    table.add_column("compile s", justify="right")
    for r in reports:
        table.add_row(
            r.env_id,
            r.policy,
            str(r.episodes),
            f"{r.mean_return:,.0f}",
            *(f"{c:.1f}" for c in r.mean_episode_cost),
            f"{r.steps_per_second:,.0f}",
            f"{r.compile_seconds:.2f}",
        )
    return table


def command_envs(_args: argparse.Namespace) -> int:
    table = Table(title="Registered environments")
    for column in ("id", "observation", "action", "costs", "description"):
        table.add_column(column)
    for env_id, spec in registered_envs().items():
        env, _ = make(env_id)
        action = f"discrete({env.num_actions})" if env.discrete else f"box({env.action_size})"
        table.add_row(
            env_id, str(env.observation_size), action, ", ".join(env.cost_names), spec.description
        )
    make_console().print(table)
    return 0


def command_rollout(args: argparse.Namespace) -> int:
    overrides = {}
    if args.setpoint is not None:
        overrides["setpoint"] = args.setpoint
    report = run_rollouts(args.env, args.policy, args.n_envs, args.n_steps, args.seed, **overrides)
    env, _ = make(args.env)
    make_console().print(_report_table([report], env.cost_names))
    return 0


def add_parsers(commands: argparse._SubParsersAction) -> None:
    """Adds ``envs`` and ``rollout`` to the command line."""
    envs = commands.add_parser("envs", help="list the registered environments")
    envs.set_defaults(handler=command_envs)

    roll = commands.add_parser("rollout", help="batched rollouts of one environment")
    roll.add_argument("--env", default="IB-v0", choices=sorted(registered_envs()))
    roll.add_argument("--policy", default="random", choices=POLICIES)
    roll.add_argument("--n-envs", type=positive_int, default=1024)
    roll.add_argument("--n-steps", type=positive_int, default=1000)
    roll.add_argument("--setpoint", type=float, default=None)
    roll.add_argument("--seed", type=int, default=0)
    roll.set_defaults(handler=command_rollout)
