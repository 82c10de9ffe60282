"""Deployment material: the Kubernetes manifests validate against the Kubernetes schemas,
the compose file and Dockerfiles say what they must, and the image's entrypoint command
runs the server here (no Docker engine on these machines)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks.harness import free_port
from tests.test_extras import FINDER, NAME, OPTIONAL, PROJECT, closure, modules_outside

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33.0"  # a release kubernetes-validate bundles the schemas of
ENTRYPOINT_KEY = "JxV1nq0S6t2m8ZkQhR4wYc7uLp3aE9dGf5bNs-Ho_Ti"
SCRIPT = ROOT / "deploy" / "mlflow" / "mlflow-server.sh"
# user:password@ in a URI, or a shell default for a password (${X:-secret}).
PASSWORD_IN_URI = re.compile(r"://[^/\s\"'@]*:[^/\s\"'@]*@")
DEFAULT_PASSWORD = re.compile(r"\$\{[A-Z_]*(PASSWORD|SECRET|TOKEN)[A-Z_]*:-[^}]+\}")


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _all_manifests() -> list[dict]:
    return [doc for path in sorted(K8S.rglob("*.yaml")) for doc in _documents(path)]


def _manifests() -> dict[str, dict]:
    """The first manifest of each kind (the policy server's own ConfigMap and Secret)."""
    found: dict[str, dict] = {}
    for doc in _all_manifests():
        found.setdefault(doc["kind"], doc)
    return found


def test_kubernetes_manifests_validate_against_the_schemas():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    manifests = _manifests()
    assert set(manifests) >= {
        "Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "Secret",
    }  # fmt: skip
    for manifest in _all_manifests():
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_a_broken_manifest_is_caught_by_the_validation():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    broken = json.loads(json.dumps(_manifests()["Deployment"]))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["port"] = [1]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_deployment_probes_limits_and_secret_wiring():
    manifests = _manifests()
    deployment = manifests["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert pod["securityContext"]["runAsNonRoot"] is True
    secret = manifests["Secret"]["metadata"]["name"]
    assert any(v.get("secret", {}).get("secretName") == secret for v in pod["volumes"])
    config = manifests["ConfigMap"]["metadata"]["name"]
    assert container["envFrom"][0]["configMapRef"]["name"] == config
    hpa = manifests["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert hpa["name"] == deployment["metadata"]["name"]
    service = manifests["Service"]["spec"]
    assert service["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # Every setting the ConfigMap gives is one the server reads.
    from neorl_industrial.integration.deployment import ServerSettings

    fields = {f"NEORL_SERVE_{name.upper()}" for name in ServerSettings.model_fields}
    assert set(manifests["ConfigMap"]["data"]) <= fields


def test_compose_runs_postgres_mlflow_and_the_policy_server():
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) >= {"postgres", "mlflow", "policy"}
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["policy"]["environment"]["NEORL_SERVE_MODEL"].startswith("models:/")
    for service in services.values():
        if "build" in service:
            dockerfile = ROOT / service["build"]["dockerfile"]
            assert dockerfile.is_file(), dockerfile


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


DOCKERFILES = sorted(path.name for path in (ROOT / "docker").glob("*Dockerfile"))


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfiles_are_multi_stage_non_root_with_healthchecks(name):
    instructions = _instructions(ROOT / "docker" / name)
    stages = [args for op, args in instructions if op == "FROM"]
    assert len(stages) >= 2  # a build stage and a runtime stage
    assert re.search(
        r"python:\d+\.\d+\.\d+-slim", " ".join(a for op, a in instructions if op == "ARG")
    )
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    healthchecks = [args for op, args in instructions if op == "HEALTHCHECK"]
    assert healthchecks  # a service checks its health; a batch job says it has none
    if any(op == "EXPOSE" for op, _ in instructions):
        assert "CMD" in healthchecks[-1]
    else:
        assert healthchecks[-1] == "NONE"
    assert any("constraints.txt" in args for op, args in instructions if op in ("COPY", "RUN"))


def _installs(dockerfile: Path, args: dict[str, str] | None = None) -> list[str]:
    """The requirements the image's ``pip install`` names (``.`` is this project), its
    build arguments (``ARG``) given their defaults or ``args``."""
    instructions = _instructions(dockerfile)
    values = dict(arg.split("=", 1) for op, arg in instructions if op == "ARG" and "=" in arg)
    values.update(args or {})
    (command,) = [args for op, args in instructions if op == "RUN" and "pip install" in args]
    command = re.sub(r"\$\{(\w+)\}", lambda match: values[match[1]], command)
    words = command.split("pip install", 1)[1].split()
    specs = [w.strip("\"'") for w in words if not w.startswith("-") and "constraints" not in w]
    return [PROJECT["name"] + spec[1:] if spec.startswith(".") else spec for spec in specs]


def _image_extras(dockerfile: Path, args: dict[str, str] | None = None) -> set[str] | None:
    """The extras of this project the image installs; None when it installs not this
    project."""
    for spec in _installs(dockerfile, args):
        requirement = Requirement(spec)
        if canonicalize_name(requirement.name) == NAME:
            return set(requirement.extras)
    return None


def _built_images() -> dict[str, Path]:
    """Image name (without tag) -> the Dockerfile that builds it, from the ``docker build``
    line each Dockerfile gives."""
    images = {}
    for name in DOCKERFILES:
        (match,) = re.findall(
            r"docker build -f (\S+) -t ([^:\s]+)", (ROOT / "docker" / name).read_text()
        )
        assert (ROOT / match[0]).resolve() == ROOT / "docker" / name
        images[match[1]] = ROOT / "docker" / name
    return images


def test_each_image_installs_the_extras_of_what_it_runs_and_no_more():
    images = _built_images()
    # The policy server: the core and the 'serve' extra only.
    assert _image_extras(images["neorl-industrial-serve"]) == {"serve"}
    # The trainer: tracking (and plant logs), no server.
    trainer = _image_extras(images["neorl-industrial-train"])
    assert "track" in trainer and not trainer & {"serve", "team", "all", "dev"}
    # The team's MLflow server: exactly the 'team' extra's packages, without this project.
    assert _image_extras(images["neorl-mlflow"]) is None
    team = {spec for spec in OPTIONAL["team"] if canonicalize_name(Requirement(spec).name) != NAME}
    installed = {
        (r.name, frozenset(r.extras)) for r in map(Requirement, _installs(images["neorl-mlflow"]))
    }
    assert installed == {(r.name, frozenset(r.extras)) for r in map(Requirement, team)}


def test_the_constraints_pin_every_package_each_image_installs():
    pinned = {}
    for line in (ROOT / "docker" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pinned[canonicalize_name(name)] = version
    for name in DOCKERFILES:
        for distribution in closure(_installs(ROOT / "docker" / name)):
            assert distribution in pinned, f"{name}: {distribution} is not in constraints.txt"


def test_each_image_the_deployments_run_has_the_extras_of_its_command():
    """The manifests and the compose file run each image of this project with a command
    its extras serve: the server image serves, the bridge's bridges, tracking runs
    (train, sweep) need 'track'."""
    images = _built_images()
    needs = {"serve": "serve", "bridge": "bridge", "train": "track", "sweep": "track"}
    runs = []  # (what, Dockerfile, build args, command)
    for document in _all_manifests():
        pod = document.get("spec", {}).get("template", {}).get("spec", {})
        for container in pod.get("containers", []):
            image = container["image"].split(":")[0]
            if image in images:
                runs.append((image, images[image], None, container.get("command")))
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]
    for name, service in compose.items():
        if "build" in service:
            build = service["build"]
            runs.append((name, ROOT / build["dockerfile"], build.get("args"), None))
            if service.get("entrypoint"):
                runs[-1] = (*runs[-1][:3], service["entrypoint"])
    assert len(runs) >= 4
    checked = set()
    for what, dockerfile, args, command in runs:
        extras = _image_extras(dockerfile, args)
        if extras is None:
            continue  # not this project (MLflow's server, the demo plant)
        command = command or json.loads(dict(_instructions(dockerfile))["ENTRYPOINT"])
        assert command[0] == "neorl-industrial", what
        subcommand = next(word for word in command[1:] if not word.startswith("-"))
        assert needs.get(subcommand, "core") in extras | {"core"}, (what, subcommand, extras)
        checked.add(subcommand)
    assert {"serve", "sweep"} <= checked


def test_the_image_entrypoint_and_healthcheck_run_the_server_here(tmp_path):
    from tests.wrappers.agents.test_export import exported_policy

    instructions = dict(_instructions(ROOT / "docker" / "Dockerfile"))
    entrypoint = json.loads(instructions["ENTRYPOINT"])
    assert entrypoint[:2] == ["neorl-industrial", "serve"]
    port = free_port()
    command = [
        str(Path(sys.executable).parent / entrypoint[0]),
        *[str(port) if arg == "8000" else arg for arg in entrypoint[1:]],
    ]
    command[command.index("0.0.0.0")] = "127.0.0.1"
    from neorl_industrial.wrappers.agents.signing import PUBLIC_KEY, generate_key_pair

    signing_key = generate_key_pair(tmp_path / "release")
    policy = exported_policy(tmp_path / "policy", signing_key=signing_key)
    (tmp_path / "keys.yaml").write_text(f"act: [{ENTRYPOINT_KEY}]\n")
    # The server runs as in the image: what its install lacks cannot be imported.
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(FINDER)
    dockerfile = _built_images()["neorl-industrial-serve"]
    lacks = modules_outside(_installs(dockerfile))
    assert {"pyarrow", "h5py", "matplotlib", "sqlalchemy", "psycopg"} <= set(lacks)
    environment = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "site"),
        "BLOCKED": json.dumps(lacks),
        "NEORL_SERVE_MODEL": str(policy),
        "NEORL_SERVE_TRUSTED_KEYS": json.dumps([str(signing_key.parent / PUBLIC_KEY)]),
        "NEORL_SERVE_API_KEYS_FILE": str(tmp_path / "keys.yaml"),
        "NEORL_SERVE_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
        # A request needs no more than these (the plant journey's server compiles the
        # default nine, tests/test_plant_journey.py).
        "NEORL_SERVE_BATCH_SIZES": "[1, 2]",
        "NEORL_SERVE_MAX_BATCH": "2",
    }
    refused = subprocess.run(
        [sys.executable, "-c", "import pyarrow"], env=environment, capture_output=True
    )
    assert b"No module named 'pyarrow'" in refused.stderr  # the image's install, simulated
    server = subprocess.Popen(command, env=environment, cwd=tmp_path)
    healthcheck = json.loads(instructions["HEALTHCHECK"].split("CMD", 1)[1])
    probe = [sys.executable, *healthcheck[1:]]
    probe[-1] = probe[-1].replace("8000", str(port))
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(probe, capture_output=True).returncode != 0:
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail("the entrypoint did not start a healthy server")
            time.sleep(0.5)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/act",
            json.dumps({"observation": [50.0] * 6}).encode(),
            {"Content-Type": "application/json", "X-API-Key": ENTRYPOINT_KEY},
        )
        assert "report" in json.loads(urllib.request.urlopen(request, timeout=10).read())
    finally:
        server.terminate()
        server.wait(30)
    # The healthcheck's Python is valid code (it runs in the image with no other tools).
    ast.parse(healthcheck[-1])


def _deployment_texts() -> dict[str, str]:
    paths = [SCRIPT, ROOT / "deploy" / "compose.yaml", *sorted(K8S.glob("*.yaml"))]
    paths += [ROOT / "docker" / "Dockerfile", ROOT / "docker" / "mlflow.Dockerfile"]
    return {path.name: path.read_text() for path in paths}


def test_no_password_in_a_uri_on_a_command_line_or_with_a_default():
    for name, text in _deployment_texts().items():
        assert not PASSWORD_IN_URI.search(text), name
        assert not DEFAULT_PASSWORD.search(text), name
        assert "change-me" not in text, name
    script = SCRIPT.read_text()
    # The backend store URI names no password: libpq reads it from a pgpass file.
    (uri,) = re.findall(r'--backend-store-uri "([^"]+)"', script)
    assert "PASSWORD" not in uri.upper() and "PGPASSFILE" in script
    assert "--app-name basic-auth" in script and "MLFLOW_AUTH_CONFIG_PATH" in script


def _is_secret_name(name: str) -> bool:
    return bool(re.search(r"PASSWORD|SECRET|TOKEN|API_KEYS$|CREDENTIALS", name))


def test_compose_and_kubernetes_read_secrets_from_files():
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    for name, service in services.items():
        for variable in service.get("environment", {}):
            if _is_secret_name(variable):
                assert variable.endswith("_FILE"), (name, variable)
    mlflow = services["mlflow"]["environment"]
    assert {"POSTGRES_PASSWORD_FILE", "MLFLOW_ADMIN_PASSWORD_FILE"} <= set(mlflow)
    assert {"postgres-password", "mlflow-admin-password"} <= set(services["mlflow"]["secrets"])
    policy = services["policy"]["environment"]
    assert policy["NEORL_SERVE_API_KEYS_FILE"].startswith("/run/secrets/")
    assert (
        json.loads(policy["NEORL_SERVE_TRUSTED_KEYS"]) and policy["NEORL_SERVE_PINNED_CONSTRAINTS"]
    )
    assert policy["NEORL_SERVE_PINNED_TASK"] in {
        entry["target"] for entry in services["policy"]["secrets"] if isinstance(entry, dict)
    }
    for secret in compose["secrets"].values():
        assert set(secret) == {"file"}  # never an inline value or an environment variable

    manifests = _manifests()
    container = manifests["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    variables = {entry["name"] for entry in container.get("env", [])}
    variables |= set(manifests["ConfigMap"]["data"])
    assert not [v for v in variables if _is_secret_name(v) and not v.endswith("_FILE")]
    assert "NEORL_SERVE_TRUSTED_KEYS" in manifests["ConfigMap"]["data"]
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert {"/run/secrets/api-keys.yaml", "/etc/neorl/trust"} <= mounts


def test_the_secret_placeholders_are_refused_by_the_server():
    from neorl_industrial.integration.deployment.settings import SettingsError, check_api_key

    keys = yaml.safe_load(_manifests()["Secret"]["stringData"]["api-keys.yaml"])
    for role, values in keys.items():
        for key in values:
            with pytest.raises(SettingsError, match="placeholder"):
                check_api_key(key, role)


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"PGPASSWORD": "hunter2hunter2"}, "PGPASSWORD is set"),
        ({}, "MLFLOW_ADMIN_PASSWORD_FILE must name a readable file"),
        ({"MLFLOW_ADMIN_PASSWORD_FILE": "/no/such/file"}, "must name a readable file"),
        ({"MLFLOW_AUTH": "maybe"}, "expected on or off"),
    ],
)
def test_the_mlflow_script_refuses_passwords_in_the_environment_and_no_auth(
    tmp_path, environment, message
):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "MLFLOW_"))}
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**clean, "PYTHON": "false", **environment},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_the_mlflow_script_writes_the_database_password_to_a_private_pgpass(tmp_path):
    # PYTHON stands in for the interpreter: it prints the pgpass file libpq would read.
    (tmp_path / "password").write_text("s3cr:et\\pw\n")
    (tmp_path / "admin").write_text("an-admin-password-long-enough\n")
    spy = tmp_path / "spy.sh"
    spy.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "${1:-}" == "-c" ]]; then echo key; exit 0; fi\n'
        'stat -c %a "$PGPASSFILE"; cat "$PGPASSFILE"; stat -c %a "$MLFLOW_AUTH_CONFIG_PATH"\n'
        'echo "ARGS $*"; exit 3\n'
    )
    spy.chmod(0o755)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "MLFLOW_"))}
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        env={
            **clean,
            "PYTHON": str(spy),
            "POSTGRES_PASSWORD_FILE": str(tmp_path / "password"),
            "MLFLOW_ADMIN_PASSWORD_FILE": str(tmp_path / "admin"),
            "PGUSER": "mlflow",
        },
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = result.stdout.splitlines()
    assert lines[:3] == ["600", "127.0.0.1:5432:*:mlflow:s3cr\\:et\\\\pw", "600"], result
    assert "s3cr" not in result.stdout.split("ARGS", 1)[-1]


def test_the_sweep_job_is_indexed_and_its_processes_find_the_coordinator():
    """The Indexed Job's pods are the distributed sweep's processes: as many as the
    environment says, pod 0's DNS name through the headless Service as the coordinator,
    and a run configuration whose grid the command line accepts."""
    from neorl_industrial.wrappers.training import RunConfig

    documents = {doc["kind"]: doc for doc in _documents(K8S / "sweep" / "job.yaml")}
    job, service, config = documents["Job"], documents["Service"], documents["ConfigMap"]
    spec = job["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert spec["completionMode"] == "Indexed" and spec["backoffLimit"] == 0
    assert spec["completions"] == spec["parallelism"] == int(env["NEORL_INDUSTRIAL_NUM_PROCESSES"])
    assert (
        service["spec"]["clusterIP"] == "None" and pod["subdomain"] == service["metadata"]["name"]
    )
    host, port = env["NEORL_INDUSTRIAL_COORDINATOR"].split(":")
    assert host == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert int(port) in [p["port"] for p in service["spec"]["ports"]]
    assert service["spec"]["selector"].items() <= spec["template"]["metadata"]["labels"].items()
    assert container["command"][:3] == ["neorl-industrial", "sweep", "--distributed"]
    run = RunConfig.from_dict(yaml.safe_load(config["data"]["run.yaml"]))
    runs = len(run.sweep.hyperparameter_grid()["alpha"]) * len(run.training.seeds)
    assert runs % spec["completions"] == 0  # the runs divide over the processes
