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

from benchmarks.harness import free_port

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33.0"  # a release kubernetes-validate bundles the schemas of


def _documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _manifests() -> dict[str, dict]:
    found = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in _documents(path):
            found[doc["kind"]] = doc
    return found


def test_kubernetes_manifests_validate_against_the_schemas():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    manifests = _manifests()
    assert set(manifests) >= {
        "Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap", "Secret",
    }  # fmt: skip
    for kind, manifest in manifests.items():
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True), kind


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
    assert set(services) == {"postgres", "mlflow", "policy"}
    assert services["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["policy"]["environment"]["NEORL_SERVE_MODEL"].startswith("models:/")
    for name in ("mlflow", "policy"):
        dockerfile = ROOT / services[name]["build"]["dockerfile"]
        assert dockerfile.is_file(), dockerfile


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


@pytest.mark.parametrize("name", ["Dockerfile", "mlflow.Dockerfile"])
def test_dockerfiles_are_multi_stage_non_root_with_healthchecks(name):
    instructions = _instructions(ROOT / "docker" / name)
    stages = [args for op, args in instructions if op == "FROM"]
    assert len(stages) >= 2  # a build stage and a runtime stage
    assert re.search(
        r"python:\d+\.\d+\.\d+-slim", " ".join(a for op, a in instructions if op == "ARG")
    )
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(op == "HEALTHCHECK" for op, _ in instructions)
    assert any("constraints.txt" in args for op, args in instructions if op in ("COPY", "RUN"))


def test_the_image_entrypoint_and_healthcheck_run_the_server_here(tmp_path):
    from tests.wrappers.agents.test_export import Policy

    instructions = dict(_instructions(ROOT / "docker" / "Dockerfile"))
    entrypoint = json.loads(instructions["ENTRYPOINT"])
    assert entrypoint[:2] == ["neorl-industrial", "serve"]
    port = free_port()
    command = [
        str(Path(sys.executable).parent / entrypoint[0]),
        *[str(port) if arg == "8000" else arg for arg in entrypoint[1:]],
    ]
    command[command.index("0.0.0.0")] = "127.0.0.1"
    policy = Policy().export(tmp_path / "policy")
    (tmp_path / "keys.yaml").write_text("act: [entrypoint-key-123]\n")
    environment = {
        **os.environ,
        "NEORL_SERVE_MODEL": str(policy),
        "NEORL_SERVE_API_KEYS_FILE": str(tmp_path / "keys.yaml"),
        "NEORL_SERVE_AUDIT_LOG": str(tmp_path / "audit.jsonl"),
    }
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
            {"Content-Type": "application/json", "X-API-Key": "entrypoint-key-123"},
        )
        assert "report" in json.loads(urllib.request.urlopen(request, timeout=10).read())
    finally:
        server.terminate()
        server.wait(30)
    # The healthcheck's Python is valid code (it runs in the image with no other tools).
    ast.parse(healthcheck[-1])
