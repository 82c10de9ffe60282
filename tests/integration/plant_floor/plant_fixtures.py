"""What the plant-floor tests share: the mixing tank's task, a small signed policy for it,
map files, and the demo plant server running in a thread of its own (one asyncua server
per module: its address space takes seconds to build)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import shutil
import socket
import sys
import threading
from pathlib import Path

import yaml

from benchmarks.harness import free_port
from neorl_industrial.core.environments import Task
from neorl_industrial.wrappers.agents.signing import PUBLIC_KEY, SIGNATURE, generate_key_pair
from neorl_industrial.wrappers.constraint_files import load_constraint_spec
from tests.wrappers.agents.test_export_report import EXAMPLE, export_plant_policy
from tests.wrappers.agents.test_signing import rewrite_with_digests

ROOT = Path(__file__).resolve().parents[3]
PLANT_EXAMPLE = ROOT / "examples" / "opcua_plant"

#: The mixing tank's task as its dataset card states it (examples/mixing-tank/schema.yaml).
TASK = {
    "name": "mixing-tank",
    "observation_names": ["level_m", "temperature_c", "inflow_m3h"],
    "action_names": ["valve_pct", "pump_pct"],
    "action_low": [0.0, 0.0],
    "action_high": [100.0, 100.0],
    "observation_low": [0.0, 0.0, 0.0],
    "observation_high": [3.2, 100.0, 80.0],
    "observation_units": ["m", "degC", "m3/h"],
    "action_units": ["%", "%"],
    "sampling_period": 10.0,
    "data_low": [0.05, 40.0, 0.0],
    "data_high": [3.2, 60.0, 80.0],
}


def plant_module():
    """examples/opcua_plant/plant.py, imported from its file."""
    name = "opcua_plant_example"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PLANT_EXAMPLE / "plant.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def map_data(period: float = 0.1, **changes) -> dict:
    data = {
        "task": "task.json",
        "sampling_period": period,
        # Generous: a busy test machine may publish late (the stale test ages by 60 s).
        "stale_after": 2.0,
        "observations": {
            "level_m": {"node": "ns=2;s=Tank.Level", "unit": "m"},
            "temperature_c": {"node": "ns=2;s=Tank.Temperature", "unit": "degC"},
            "inflow_m3h": {"node": "ns=2;s=Tank.Inflow", "unit": "m3/h"},
        },
        "actions": {
            "valve_pct": {
                "write": "ns=2;s=Tank.ValveSetpoint",
                "applied": "ns=2;s=Tank.ValvePosition",
                "unit": "%",
            },
            "pump_pct": {
                "write": "ns=2;s=Tank.PumpSetpoint",
                "applied": "ns=2;s=Tank.PumpSpeed",
                "unit": "%",
            },
        },
    }
    data.update(changes)
    return data


def write_map(root: Path, name: str, data: dict) -> Path:
    path = root / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def make_policies(root: Path) -> dict[str, Path]:
    """A signed mixing-tank policy, an unsigned copy, a copy that says it is for another
    task, the trusted key and the task file."""
    task = Task.from_dict(TASK)
    (root / "task.json").write_text(json.dumps(TASK))
    key = generate_key_pair(root / "keys")
    spec = load_constraint_spec(EXAMPLE / "constraints.yaml")
    signed = export_plant_policy(
        root / "policy",
        task,
        spec,
        signing_key=key,
        observation_units=task.observation_units,
        action_units=task.action_units,
    )
    unsigned = root / "unsigned"
    shutil.copytree(signed, unsigned)
    (unsigned / SIGNATURE).unlink()
    other = root / "other-task"
    shutil.copytree(unsigned, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["observation_names"] = ["level_ft", "temperature_f", "inflow_gpm"]
    (other / "manifest.json").write_text(json.dumps(manifest))
    rewrite_with_digests(other)
    return {
        "signed": signed,
        "unsigned": unsigned,
        "other": other,
        "key": key.parent / PUBLIC_KEY,
        "task": root / "task.json",
    }


def make_certificates(root: Path) -> dict[str, Path]:
    """Self-signed certificates and keys of the demo plant's server and of the bridge."""
    from asyncua.crypto.cert_gen import setup_self_signed_certificate
    from cryptography.x509.oid import ExtendedKeyUsageOID

    paths = {}
    for who, uri, use in (
        ("server", plant_module().APPLICATION_URI, ExtendedKeyUsageOID.SERVER_AUTH),
        ("bridge", "urn:neorl-industrial:bridge", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        key, certificate = root / f"{who}-key.pem", root / f"{who}-certificate.der"
        asyncio.run(
            setup_self_signed_certificate(
                key, certificate, uri, socket.gethostname(), [use], {"commonName": f"neorl {who}"}
            )
        )
        paths[f"{who}_key"], paths[f"{who}_certificate"] = key, certificate
    return paths


class PlantThread:
    """The demo plant's server on an event loop in a thread of its own, so that each test
    runs its bridge with ``asyncio.run`` against a server that outlives it."""

    def __init__(
        self,
        period: float = 0.1,
        certificates: dict[str, Path] | None = None,
        users: dict[str, str] | None = None,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"opc.tcp://127.0.0.1:{free_port()}/plant"
        module = plant_module()
        self.module = module
        certificates = certificates or {}
        self.plant = module.PlantServer(
            self.endpoint,
            period=period,
            remote=True,
            certificate=certificates.get("server_certificate"),
            private_key=certificates.get("server_key"),
            users=users,
        )
        self.call(self.plant.start())
        self._run = self.call(self._start_running())

    async def _start_running(self):
        return asyncio.get_running_loop().create_task(self.plant.run())

    def call(self, coroutine, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def later(self, coroutine):
        """Schedules ``coroutine`` on the plant's loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    async def _outage(self, seconds: float) -> None:
        """The server goes down (every session with it) and comes back ``seconds`` later."""
        await self.plant.server.stop()
        await asyncio.sleep(seconds)
        await self.plant.server.start()

    def outage(self, seconds: float, after: float):
        async def later():
            await asyncio.sleep(after)
            await self._outage(seconds)

        return self.later(later())

    def fault(self, sensor: str, **fault) -> None:
        """Shows a fault on ``sensor`` from now on (published at once)."""
        self.plant.faults[sensor] = self.module.Fault(**fault)
        self.call(self.plant.publish())

    def clear(self) -> None:
        self.plant.faults.clear()
        self.call(self.plant.publish())

    async def _close(self) -> None:
        self._run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._run
        await self.plant.stop()

    def close(self) -> None:
        self.call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
