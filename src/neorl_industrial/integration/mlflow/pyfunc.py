"""The exported, shielded policy as an MLflow pyfunc model.

The model holds the policy artifact (:mod:`neorl_industrial.wrappers.agents.artifact`):
the serialized policy and shield, the normalizer and the constraint spec. Served with
``mlflow models serve -m models:/ib-policy@champion --env-manager local`` it answers every
row with the *shielded* action and what the shield did::

    input  (one row per decision): one column per observation feature, by the feature's
           name ("velocity", "fatigue@t-1", ...), and optionally the previous actions
           ("prev_velocity", ...; left out: unknown, and rate limits cannot apply)
    output: the applied action ("velocity", ...), the proposed one ("proposed_velocity"),
           the shield's flags (overridden, projected, fallback, invalid, infeasible), its
           status bits, and the margin of every hard constraint ("margin_<name>")

The model's artifacts also hold the constraint spec (``constraints.yaml``), the dataset
card (``dataset.json``) and the saved agent (``agent/``, for ``Agent.load``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from neorl_industrial.extras import optional_imports

with optional_imports():  # the 'track' extra
    import mlflow

from neorl_industrial.wrappers.constraint_files import constraint_spec_yaml
from neorl_industrial.wrappers.hostio import write_json_atomic

__all__ = [
    "MODEL_NAME",
    "ShieldedPolicyModel",
    "log_policy_model",
    "policy_signature",
    "prev_action_columns",
]

#: The model's name inside its run (``runs:/<run_id>/policy``).
MODEL_NAME = "policy"
# The decision's flags (the artifact's STATUS_BITS; named here so that importing this
# module does not import JAX).
FLAGS = (
    "overridden",
    "projected",
    "fallback",
    "invalid",
    "infeasible",
    "invalid_observation",
    "out_of_distribution",
)


def prev_action_columns(action_names: tuple[str, ...] | list[str]) -> list[str]:
    return [f"prev_{name}" for name in action_names]


class ShieldedPolicyModel(mlflow.pyfunc.PythonModel):
    """Answers a DataFrame of observations with shielded actions (see the module)."""

    def load_context(self, context):
        from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

        self.artifact = PolicyArtifact.load(context.artifacts["policy"])
        self.artifact.warmup((1,))

    # No type hints on predict: MLflow would read them as a schema.
    def predict(self, context, model_input, params=None):
        import pandas as pd

        artifact = self.artifact
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        names = list(artifact.observation_names)
        missing = [name for name in names if name not in frame.columns]
        if missing:
            shown = ", ".join(repr(name) for name in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ValueError(
                f"model input: missing the observation column(s) {shown}{more}; expected one "
                f"column per feature: {', '.join(names[:6])}, ..."
            )
        if frame.empty:
            raise ValueError("model input: no rows; send at least one observation")
        observations = frame[names].to_numpy(np.float32)
        prev_names = prev_action_columns(artifact.action_names)
        given = [name for name in prev_names if name in frame.columns]
        if given and len(given) != len(prev_names):
            absent = [name for name in prev_names if name not in frame.columns]
            raise ValueError(
                f"model input: previous actions need every column {prev_names}; missing {absent}"
            )
        prev = frame[prev_names].to_numpy(np.float32) if given else None
        decision = artifact.predict(observations, prev)
        out: dict[str, Any] = {}
        for i, name in enumerate(artifact.action_names):
            out[name] = decision.action[:, i].astype(np.float64)
        for i, name in enumerate(artifact.action_names):
            out[f"proposed_{name}"] = decision.proposed[:, i].astype(np.float64)
        for flag in FLAGS:
            out[flag] = np.asarray(getattr(decision, flag), bool)
        out["status"] = decision.status.astype(np.int64)
        for i, name in enumerate(artifact.constraint_names):
            out[f"margin_{name}"] = decision.margin[:, i].astype(np.float64)
        return pd.DataFrame(out)


def policy_signature(artifact: Any) -> Any:
    """Input and output schema of the model: named float columns in, the decision out."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = [ColSpec("double", name) for name in artifact.observation_names]
    inputs += [
        ColSpec("double", name, required=False)
        for name in prev_action_columns(artifact.action_names)
    ]
    outputs = [ColSpec("double", name) for name in artifact.action_names]
    outputs += [ColSpec("double", f"proposed_{name}") for name in artifact.action_names]
    outputs += [ColSpec("boolean", flag) for flag in FLAGS]
    outputs += [ColSpec("long", "status")]
    outputs += [ColSpec("double", f"margin_{name}") for name in artifact.constraint_names]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema(outputs))


@contextlib.contextmanager
def tracking_uri_for(tracking_uri: str, registry_uri: str | None) -> Iterator[None]:
    """Points MLflow's fluent API at ``tracking_uri`` for the block, then puts back what
    was there: the module state and the environment variables MLflow sets with it."""
    from mlflow.tracking._model_registry import utils as registry_utils
    from mlflow.tracking._tracking_service import utils as tracking_utils

    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    environment = {name: os.environ.get(name) for name in names}
    previous = tracking_utils._tracking_uri
    previous_registry = registry_utils._registry_uri
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(registry_uri or tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        registry_utils._registry_uri = previous_registry
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _requirements() -> list[str]:
    from importlib import metadata

    packages = ["neorl-industrial", "jax", "jaxlib", "flax", "numpy", "pandas", "pyyaml"]
    pins = []
    for package in packages:
        try:
            pins.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pins.append(package)
    return [*pins, f"mlflow=={mlflow.__version__}"]


def log_policy_model(
    tracking_uri: str,
    run_id: str,
    *,
    policy_dir: str | Path,
    agent_dir: str | Path | None = None,
    dataset_card: dict[str, Any] | None = None,
    input_example: list[list[float]] | None = None,
    registered_model: str | None = None,
    registry_uri: str | None = None,
) -> dict[str, Any]:
    """Logs the exported policy at ``policy_dir`` as the pyfunc model ``policy`` of the run
    ``run_id`` (with a signature, an input example, the constraint spec, the dataset card
    and the saved agent) and registers it as a new version of ``registered_model``.

    Returns:
        ``model_uri`` and, when registered, ``name`` and ``version``.
    """
    from neorl_industrial.wrappers.agents.artifact import PolicyArtifact

    artifact = PolicyArtifact.load(policy_dir)
    with tempfile.TemporaryDirectory() as scratch:
        artifacts = {"policy": str(policy_dir)}
        spec_path = Path(scratch) / "constraints.yaml"
        spec_path.write_text(constraint_spec_yaml(artifact.constraint_spec))
        artifacts["constraints"] = str(spec_path)
        if dataset_card is not None:
            card_path = write_json_atomic(Path(scratch) / "dataset.json", dataset_card)
            artifacts["dataset_card"] = str(card_path)
        if agent_dir is not None:
            artifacts["agent"] = str(agent_dir)
        example = None
        if input_example:
            import pandas as pd

            example = pd.DataFrame(
                np.asarray(input_example, np.float32), columns=list(artifact.observation_names)
            )
        with (
            tracking_uri_for(tracking_uri, registry_uri),
            mlflow.start_run(run_id=run_id),
            warnings.catch_warnings(),
        ):
            # The model takes a DataFrame of named columns, described by its signature;
            # MLflow's hint about type-hinted predict methods does not apply.
            warnings.filterwarnings("ignore", message=".*type hints", category=UserWarning)
            info = mlflow.pyfunc.log_model(
                name=MODEL_NAME,
                python_model=str(Path(__file__).with_name("policy_model.py")),
                artifacts=artifacts,
                signature=policy_signature(artifact),
                input_example=example,
                pip_requirements=_requirements(),
                registered_model_name=registered_model,
                metadata={
                    "neorl_industrial": {
                        "format": "shielded-policy",
                        "constraints": list(artifact.constraint_names),
                        "algorithm": artifact.metadata.get("algorithm"),
                    }
                },
            )
    result: dict[str, Any] = {"model_uri": f"runs:/{run_id}/{MODEL_NAME}"}
    version = getattr(info, "registered_model_version", None)
    if registered_model is not None and version is not None:
        result.update(name=registered_model, version=str(version))
    return result
