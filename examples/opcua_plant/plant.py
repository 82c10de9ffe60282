"""A demo plant behind a real OPC UA server: the mixing tank of ``examples/mixing-tank``
(a 4 m² tank fed through an inlet valve from a header whose supply drifts, emptied by a
variable-speed pump) under its operators' PI level control, simulated step by step.

    python examples/opcua_plant/plant.py --endpoint opc.tcp://127.0.0.1:4840/plant
    python examples/opcua_plant/plant.py --speed 10          # ten simulated seconds a second
    python examples/opcua_plant/plant.py --remote            # accept the bridge's setpoints

Nodes (namespace ``urn:neorl-industrial:mixing-tank``, index 2), each sensor and
actuator with its EngineeringUnits:

* ``Tank.Level`` (m), ``Tank.Temperature`` (degC), ``Tank.Inflow`` (m3/h): sensors;
* ``Tank.ValvePosition``, ``Tank.PumpSpeed`` (%): what the actuators actually apply;
* ``Tank.ValveSetpoint``, ``Tank.PumpSetpoint`` (%): written by a remote controller;
* ``Tank.RemoteEnabled``: the operators' switch (writable); ``Tank.ControlSource``:
  ``operators`` or ``remote``.

The operators' PI controller runs the actuators unless the remote switch is on *and* a
setpoint was written within the watchdog (two sampling periods): a remote controller
that stops writing hands the plant back to the PI controller by itself (its integral
restarts; the actuators' own travel rates keep the change smooth).

Only asyncua and numpy are needed (no neorl_industrial): the plant is not ours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
from pathlib import Path

import numpy as np
from asyncua import Server, ua
from asyncua.common.callback import CallbackType
from asyncua.crypto.permission_rules import User, UserRole

NAMESPACE = "urn:neorl-industrial:mixing-tank"
#: The server's application URI (its certificate's subject alternative name).
APPLICATION_URI = "urn:neorl-industrial:demo-plant"
SAMPLING_PERIOD = 10.0  # simulated seconds per step
AREA = 4.0  # m²
SUPPLY_MAX = 40.0  # m³/h through a fully open valve at nominal header pressure
PUMP_MAX = 36.0  # m³/h at full speed and 1.5 m of level
#: The nodes: name -> (unit, initial value, writable by clients).
NODES = {
    "Level": ("m", 1.6, False),
    "Temperature": ("degC", 48.0, False),
    "Inflow": ("m3/h", 18.0, False),
    "ValvePosition": ("%", 45.0, False),
    "PumpSpeed": ("%", 50.0, False),
    "ValveSetpoint": ("%", 45.0, True),
    "PumpSetpoint": ("%", 50.0, True),
}
SENSORS = ("Level", "Temperature", "Inflow", "ValvePosition", "PumpSpeed")

log = logging.getLogger("opcua_plant")


@dataclasses.dataclass
class MixingTank:
    """The process and the operators' PI controller (the same model as the historian
    log of ``examples/mixing-tank/generate.py``)."""

    level: float = 1.6
    temperature: float = 48.0
    valve: float = 45.0
    pump: float = 50.0
    inflow: float = 18.0
    setpoint: float = 1.8
    integral: float = 0.0
    supply: float = 1.0
    step_count: int = 0
    rng: np.random.Generator = dataclasses.field(default_factory=lambda: np.random.default_rng(7))

    def operators(self) -> tuple[float, float]:
        """The operators' PI controller on the level (pump), the valve following demand."""
        error = self.level - self.setpoint
        self.integral = float(np.clip(self.integral + error * SAMPLING_PERIOD / 300.0, -6, 6))
        pump = 45.0 + 25.0 * error + 8.0 * self.integral + self.rng.normal(0.0, 2.0)
        valve = 45.0 - 10.0 * error + self.rng.normal(0.0, 3.0)
        return valve, pump

    def step(self, valve_target: float, pump_target: float) -> None:
        """One sampling period with the actuators moving towards the targets at their
        own travel rates and within their travel."""
        rng = self.rng
        self.pump = float(np.clip(self.pump + np.clip(pump_target - self.pump, -8, 8), 10, 100))
        self.valve = float(
            np.clip(self.valve + np.clip(valve_target - self.valve, -12, 12), 0, 100)
        )
        self.supply = float(
            np.clip(self.supply + rng.normal(0.0, 0.03) + 0.002 * (1.0 - self.supply), 0.6, 1.4)
        )
        feed_temperature = 52.0 + 6.0 * np.sin(self.step_count / 500.0) + rng.normal(0.0, 0.3)
        self.inflow = self.valve / 100.0 * SUPPLY_MAX * self.supply
        outflow = self.pump / 100.0 * PUMP_MAX * np.sqrt(max(self.level, 0.0) / 1.5)
        hours = SAMPLING_PERIOD / 3600.0
        volume = AREA * self.level
        mixed = (volume * self.temperature + self.inflow * hours * feed_temperature) / max(
            volume + self.inflow * hours, 1e-6
        )
        self.temperature = float(mixed - 0.02 * (mixed - 20.0) * hours * 10.0)
        self.level = float(np.clip(self.level + (self.inflow - outflow) * hours / AREA, 0.05, 3.2))
        self.step_count += 1
        if self.step_count % 700 == 0:
            self.setpoint = float(rng.choice([1.6, 2.0, 2.3]))

    def readings(self) -> dict[str, float]:
        rng = self.rng
        return {
            "Level": self.level + rng.normal(0.0, 0.005),
            "Temperature": self.temperature + rng.normal(0.0, 0.05),
            "Inflow": self.inflow + rng.normal(0.0, 0.2),
            "ValvePosition": self.valve,
            "PumpSpeed": self.pump,
        }


class PasswordUsers:
    """Clients that sign in with a user name and password (no anonymous client)."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = dict(users)

    def get_user(self, iserver, username=None, password=None, certificate=None):
        if username is not None and self.users.get(username) == password:
            return User(role=UserRole.User, name=username)
        return None


@dataclasses.dataclass
class Fault:
    """A fault the plant's server shows on a sensor until cleared: a status code (e.g.
    ``BadSensorFailure``), a source timestamp ``age`` seconds old, or a frozen value."""

    status: str | None = None
    age: float | None = None


class PlantServer:
    """The tank behind an asyncua server.

    Args:
        endpoint: where the server listens.
        period: wall-clock seconds per simulated sampling period (10 s simulated).
        remote: the operators' remote switch at start.
        certificate, private_key: serve with Basic256Sha256 Sign and SignAndEncrypt only
            (no unsecured endpoint), the certificate naming :data:`APPLICATION_URI`;
            ``None``: no security.
        users: user names and their passwords; only they may sign in (``None``: anyone,
            anonymously).
        seed: of the process noise.
    """

    def __init__(
        self,
        endpoint: str = "opc.tcp://127.0.0.1:4840/plant",
        *,
        period: float = SAMPLING_PERIOD,
        remote: bool = False,
        certificate: Path | None = None,
        private_key: Path | None = None,
        users: dict[str, str] | None = None,
        seed: int = 7,
    ) -> None:
        self.endpoint = endpoint
        self.period = period
        self.tank = MixingTank(rng=np.random.default_rng(seed))
        self.remote_at_start = remote
        self.certificate, self.private_key = certificate, private_key
        self.users = users
        self.faults: dict[str, Fault] = {}
        #: Every client write: (node name, value, wall-clock time).
        self.writes: list[tuple[str, float, float]] = []
        self.source = "operators"
        #: Steps run on the remote controller's setpoints.
        self.remote_steps = 0
        self.server: Server | None = None
        self.nodes: dict[str, object] = {}
        self._task: asyncio.Task | None = None
        self._last_remote = -float("inf")

    async def start(self) -> None:
        server = Server(user_manager=None if self.users is None else PasswordUsers(self.users))
        await server.init()
        if self.users is not None:
            server.set_identity_tokens([ua.UserNameIdentityToken])
        server.set_endpoint(self.endpoint)
        server.set_server_name("neorl-industrial demo plant: mixing tank")
        await server.set_application_uri(APPLICATION_URI)
        if self.certificate is not None:
            server.set_security_policy(
                [
                    ua.SecurityPolicyType.Basic256Sha256_Sign,
                    ua.SecurityPolicyType.Basic256Sha256_SignAndEncrypt,
                ]
            )
            await server.load_certificate(str(self.certificate))
            await server.load_private_key(str(self.private_key))
        else:
            server.set_security_policy([ua.SecurityPolicyType.NoSecurity])
        index = await server.register_namespace(NAMESPACE)
        tank = await server.nodes.objects.add_object(ua.NodeId("Tank", index), f"{index}:Tank")
        for name, (unit, value, writable) in NODES.items():
            node = await tank.add_variable(
                ua.NodeId(f"Tank.{name}", index),
                f"{index}:{name}",
                ua.Variant(float(value), ua.VariantType.Double),
            )
            await node.add_property(
                0,
                "EngineeringUnits",
                ua.EUInformation(
                    DisplayName=ua.LocalizedText(unit), Description=ua.LocalizedText(unit)
                ),
            )
            if writable:
                await node.set_writable()
            self.nodes[name] = node
        remote = await tank.add_variable(
            ua.NodeId("Tank.RemoteEnabled", index), f"{index}:RemoteEnabled", self.remote_at_start
        )
        await remote.set_writable()
        self.nodes["RemoteEnabled"] = remote
        self.nodes["ControlSource"] = await tank.add_variable(
            ua.NodeId("Tank.ControlSource", index), f"{index}:ControlSource", "operators"
        )
        server.subscribe_server_callback(CallbackType.PostWrite, self._written)
        await server.start()
        self.server = server
        await self.publish()

    def _written(self, event, _dispatcher) -> None:
        now = asyncio.get_running_loop().time()
        for write, status in zip(
            event.request_params.NodesToWrite, event.response_params, strict=False
        ):
            name = str(write.NodeId.Identifier).removeprefix("Tank.")
            if status.is_good() and name in ("ValveSetpoint", "PumpSetpoint"):
                self.writes.append((name, float(write.Value.Value.Value), now))
                self._last_remote = now

    async def refuse_writes(self, refuse: bool = True) -> None:
        """Makes the setpoints read-only (the server refuses every write) or writable."""
        for name in ("ValveSetpoint", "PumpSetpoint"):
            level = ua.AccessLevel.CurrentRead.mask | (
                0 if refuse else ua.AccessLevel.CurrentWrite.mask
            )
            for attribute in (ua.AttributeIds.AccessLevel, ua.AttributeIds.UserAccessLevel):
                await self.nodes[name].write_attribute(
                    attribute, ua.DataValue(ua.Variant(level, ua.VariantType.Byte))
                )

    async def publish(self) -> None:
        now = dt.datetime.now(dt.UTC)
        for name, value in self.tank.readings().items():
            fault = self.faults.get(name)
            status = (
                ua.StatusCode(getattr(ua.StatusCodes, fault.status))
                if fault and fault.status
                else ua.StatusCode()
            )
            stamp = now - dt.timedelta(seconds=fault.age) if fault and fault.age else now
            await self.server.write_attribute_value(
                self.nodes[name].nodeid,
                ua.DataValue(
                    ua.Variant(float(value), ua.VariantType.Double),
                    StatusCode=status,
                    SourceTimestamp=stamp,
                    ServerTimestamp=now,
                ),
            )
        await self.nodes["ControlSource"].write_value(self.source)

    async def step(self) -> None:
        """One sampling period: whose targets apply, the process, the new readings."""
        loop = asyncio.get_running_loop()
        remote = bool(await self.nodes["RemoteEnabled"].read_value())
        fresh = loop.time() - self._last_remote <= 2.0 * self.period
        if remote and fresh:
            valve = float(await self.nodes["ValveSetpoint"].read_value())
            pump = float(await self.nodes["PumpSetpoint"].read_value())
            self.source = "remote"
            self.remote_steps += 1
        else:
            if self.source == "remote":
                log.warning("the remote controller stopped writing: the operators take over")
                self.tank.integral = 0.0  # the PI starts afresh; the actuators' travel
                # rates keep the change smooth
            valve, pump = self.tank.operators()
            self.source = "operators"
        self.tank.step(valve, pump)
        await self.publish()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        next_time = loop.time()
        while not stop.is_set():
            await self.step()
            next_time += self.period
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(next_time - loop.time(), 0.0))

    async def __aenter__(self) -> PlantServer:
        await self.start()
        self._task = asyncio.create_task(self.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.server is not None:
            await self.server.stop()
            self.server = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="opc.tcp://127.0.0.1:4840/plant")
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="simulated seconds per wall-clock second (1: real time)",
    )
    parser.add_argument(
        "--remote",
        action="store_true",
        help="the operators' remote switch on: fresh setpoints are applied",
    )
    parser.add_argument("--certificate", type=Path, help="serve with Basic256Sha256 only")
    parser.add_argument("--private-key", type=Path)
    parser.add_argument(
        "--users-file",
        type=Path,
        help="lines of user:password; only they may sign in (default: anyone, anonymously)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(name)s: %(message)s")
    logging.getLogger("asyncua").setLevel(logging.WARNING)
    users = None
    if args.users_file is not None:
        lines = args.users_file.read_text().splitlines()
        users = dict(line.split(":", 1) for line in lines if line.strip())
    plant = PlantServer(
        args.endpoint,
        period=SAMPLING_PERIOD / args.speed,
        remote=args.remote,
        certificate=args.certificate,
        private_key=args.private_key,
        users=users,
    )

    async def serve() -> None:
        await plant.start()
        log.info("mixing tank on %s (%.3g s per 10 s step)", args.endpoint, plant.period)
        try:
            await plant.run()
        finally:
            await plant.stop()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
