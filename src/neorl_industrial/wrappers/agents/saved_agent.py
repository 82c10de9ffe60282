"""An agent's files: the exported policy (:func:`export`), and the saved agent:
``agent.json`` (the manifest: task, algorithm and hyperparameters, constraint spec, the
safety contract as resolved, versions, the run's record) and the policies' msgpack files
(every run's policy; a sweep's every configuration × seed, one file per program).
``Agent.export``, ``Agent.save`` and ``Agent.load`` call these."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from neorl_industrial.core.environments import Task, TaskError
from neorl_industrial.core.safety import ConstraintSpecError
from neorl_industrial.functional.state_management import init_train_states
from neorl_industrial.version import __version__
from neorl_industrial.wrappers.constraint_files import (
    constraint_spec_from_text,
    constraint_spec_yaml,
)
from neorl_industrial.wrappers.hostio import (
    read_saved_json,
    read_saved_tree,
    to_json_data,
    write_directory_atomic,
)
from neorl_industrial.wrappers.training.context import PolicyContext, RunError, algorithm_of
from neorl_industrial.wrappers.training.plan import (
    CONTRACT_FIELDS,
    contract_record,
    saved_contract,
)
from neorl_industrial.wrappers.training.run import CANDIDATE_FILE, RunResult, SweepCandidates

__all__ = [
    "FORMAT",
    "MANIFEST",
    "POLICIES",
    "export",
    "manifest",
    "read_manifest",
    "restore",
    "save",
]

FORMAT = "neorl-industrial-agent/1"
MANIFEST = "agent.json"
POLICIES = "policies.msgpack"


def manifest(agent: Any) -> dict[str, Any]:
    """What a save of ``agent`` writes next to the parameters."""
    task = agent.task
    return {
        "format": FORMAT,
        "neorl_industrial": __version__,
        "jax": jax.__version__,
        "algorithm": agent.entry.name,
        "hyperparameters": to_json_data(agent.hyperparameters),
        "task": task.to_dict(limits=False),
        "env": {"id": task.env_id, "params": dict(task.env_params)},
        "observation_size": task.observation_size,
        "action_size": task.action_size,
        "observation_names": list(task.observation_names),
        "action_names": list(task.action_names),
        "constraints": constraint_spec_yaml(agent.constraint_spec),
        # The safety contract as resolved (``load`` takes it back as it is).
        **dict(zip(CONTRACT_FIELDS, contract_record(agent.safety), strict=True)),
        "seeds": agent.seeds,
        "selected_run": agent.selected,
        "training": agent.record,
        "sweep_candidates": None
        if agent.sweep_candidates is None
        else agent.sweep_candidates.record(),
    }


def save(agent: Any, path: str | Path, *, overwrite: bool = False) -> Path:
    """Writes fitted ``agent`` to the directory ``path`` atomically.

    Raises:
        RunError: when ``path`` exists and ``overwrite`` is False (nothing is written).
    """
    text = json.dumps(manifest(agent), indent=2, allow_nan=False)
    policies = serialization.to_bytes(jax.device_get(agent.policies))
    files = {MANIFEST: text.encode(), POLICIES: policies}
    sweep = agent.sweep_candidates
    if sweep is not None:
        for number in range(len(sweep.configurations)):
            stack = jax.device_get(sweep.program(number, agent.context))
            files[CANDIDATE_FILE.format(number)] = serialization.to_bytes(stack)
    return write_directory_atomic(
        path, files, marker=MANIFEST, what="a saved agent", overwrite=overwrite, refused=RunError
    )


def read_manifest(path: Path) -> tuple[dict[str, Any], PolicyContext, dict[str, Any]]:
    """``(manifest, context, hyperparameters)`` of the agent saved at ``path``: its
    algorithm, task and contract as saved.

    Raises:
        RunError: naming the file that is missing, unreadable or of another format.
    """
    manifest_path = path / MANIFEST
    saved = read_saved_json(
        path, MANIFEST, what="a saved agent", expected_format=FORMAT, refused=RunError
    )
    # Agents saved before the contract was saved on its own kept the limits among the
    # hyperparameters too; the contract below is their one holder.
    hyperparameters = {
        key: value for key, value in saved["hyperparameters"].items() if key != "cost_limits"
    }
    entry = algorithm_of(saved["algorithm"])
    try:
        if saved.get("task") is not None:
            task = Task.from_dict(saved["task"], f"{manifest_path}: task")
        else:
            task = Task.from_env(saved["env"]["id"], saved["env"]["params"])
        spec = constraint_spec_from_text(saved["constraints"], str(manifest_path))
        contract = saved_contract(saved, task, spec)
    except (TaskError, ConstraintSpecError) as error:
        raise RunError(str(error)) from None
    except ValueError as error:
        raise RunError(f"{manifest_path}: {error}") from None
    return saved, PolicyContext.create(entry, task, spec, contract), hyperparameters


def restore(agent: Any, path: Path, saved: dict[str, Any]) -> None:
    """Gives ``agent`` (of the saved context) the policies, selection and record saved at
    ``path``.

    Raises:
        RunError: naming a policies file that is missing or does not match.
    """
    agent.seeds = [int(seed) for seed in saved["seeds"]]
    # The policies' structure, shapes and dtypes only: traced, neither compiled nor run.
    template = jax.eval_shape(
        lambda: init_train_states(agent.policy_algorithm, agent.seeds).agent.policy
    )
    policies = read_saved_tree(
        path / POLICIES, lambda data: serialization.from_bytes(template, data), RunError
    )
    agent.policies = jax.tree.map(jnp.asarray, policies)
    agent.selected = int(saved["selected_run"])
    record = saved.get("training")
    agent.result = None if not record else RunResult.from_record(record)
    candidates = saved.get("sweep_candidates")
    if candidates:
        programs = candidates["programs"]
        agent.sweep_candidates = SweepCandidates(
            fields=list(candidates["fields"]),
            points=[dict(point) for point in candidates["points"]],
            seeds=[int(seed) for seed in candidates["seeds"]],
            hyperparameters=dict(candidates["hyperparameters"]),
            programs=[None] * len(programs),
            files=[path / program["file"] for program in programs],
            configurations=[tuple(program["configurations"]) for program in programs],
        )


def export(
    agent: Any,
    path: str | Path,
    *,
    overwrite: bool = False,
    signing_key: Any = None,
    format: str = "jax",
) -> Path:
    """The exported policy of fitted ``agent`` (``Agent.export``): its selected run's
    policy with the task's names, units and bounds, the constraint spec, and the run's
    record as metadata.

    Raises:
        RunError: for an agent that acts on discrete actions.
    """
    if agent.entry.discrete:
        raise RunError(
            "export: exported artifacts serve continuous actions through the shield; "
            f"{agent.entry.name} acts on discrete ones"
        )
    from neorl_industrial.wrappers.agents.export import (
        ExportOptions,
        PolicyExport,
        PolicyInterface,
        PolicyProgram,
        export_policy,
    )

    act = agent.algorithm.act
    task = agent.task
    interface = PolicyInterface(
        observation_size=task.observation_size,
        action_size=task.action_size,
        action_low=np.asarray(task.action_low, np.float32),
        action_high=np.asarray(task.action_high, np.float32),
        observation_names=list(task.observation_names),
        action_names=list(task.action_names),
        observation_bounds=(task.observation_low, task.observation_high),
        observation_units=task.observation_units,
        action_units=task.action_units,
        # The data's range (a plant log's observed columns): flagged, not enforced.
        data_bounds=None if task.data_low is None else (task.data_low, task.data_high),
    )
    metadata = {
        "algorithm": agent.entry.name,
        "env": task.env_id,
        "task": task.to_dict(limits=False),
        "seed": agent.seeds[agent.selected],
        "candidate": agent.selected_candidate,
        **dict(zip(CONTRACT_FIELDS[:2], contract_record(agent.safety)[:2], strict=True)),
        "training": agent.record,
    }
    policy = PolicyProgram(
        act=lambda policy, observation: act(policy, observation, None, deterministic=True),
        policy_params=agent.policy(),
    )
    options = ExportOptions(overwrite=overwrite, signing_key=signing_key, format=format)
    return export_policy(
        path,
        PolicyExport(policy, interface, agent.constraint_spec, metadata, options),
    )
