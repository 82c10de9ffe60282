"""The OPC UA side of the bridge (asyncua): connecting with the security the server
requires, credentials read from files, checking the bound nodes once connected, reading
values with their quality and writing actions.

A value is usable when its status code is Good, its source timestamp (the server's
timestamp when the source gives none) is no older than the map's ``stale_after`` and not
ahead of the bridge's clock by more than ``clock_skew``, it is of the data type its node
declares (an Int32 on a node declared Double is not a reading of that node), and it is a
finite number. :func:`judge` says why one is not. A node's ``EngineeringUnits`` are
checked against its binding's unit when the bridge connects and again with every read
(:func:`judge_units`), by :mod:`neorl_industrial.core.units`: ``°C`` (or the UNECE code
``CEL`` in ``UnitId``) is ``degC``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neorl_industrial.core.units import (
    UNECE_NAMESPACE,
    UnitError,
    parse_unit,
    same_unit,
    unece_code,
    unece_unit,
)
from neorl_industrial.core.utils.messages import quote
from neorl_industrial.integration.plant_floor.errors import (
    NodeIdError,
    PlantConnectionError,
    SecurityError,
    UnitMismatchError,
)

__all__ = ["NodeType", "PlantConnection", "Security", "judge", "judge_units"]

#: Status codes of a server that refuses the bridge's identity or certificate.
REFUSALS = frozenset(
    {
        "BadUserAccessDenied",
        "BadIdentityTokenInvalid",
        "BadIdentityTokenRejected",
        "BadUserSignatureInvalid",
        "BadSecurityChecksFailed",
        "BadSecurityPolicyRejected",
        "BadCertificateInvalid",
        "BadCertificateUntrusted",
        "BadCertificateUriInvalid",
        "BadCertificateRevoked",
        "BadCertificateTimeInvalid",
        "BadCertificateUseNotAllowed",
    }
)
#: The security policies a server may require (asyncua's names).
POLICIES = ("Basic256Sha256", "Aes128Sha256RsaOaep", "Aes256Sha256RsaPss")
MODES = ("Sign", "SignAndEncrypt")


@dataclasses.dataclass(frozen=True)
class Security:
    """How the bridge authenticates: a security policy with its certificate and private
    key, and a user name and password, each read from a file (never the command line)."""

    policy: str | None = None
    mode: str = "SignAndEncrypt"
    certificate: Path | None = None
    private_key: Path | None = None
    private_key_password_file: Path | None = None
    server_certificate: Path | None = None
    username_file: Path | None = None
    password_file: Path | None = None

    def check(self) -> None:
        """Refuses an incomplete or unreadable configuration before anything connects.

        Raises:
            SecurityError: naming the option or file.
        """
        if self.policy is not None and self.policy not in POLICIES:
            raise SecurityError(
                f"security policy {quote(self.policy)}: expected one of {list(POLICIES)}"
            )
        if self.mode not in MODES:
            raise SecurityError(f"security mode {quote(self.mode)}: expected one of {list(MODES)}")
        if self.policy is not None and (self.certificate is None or self.private_key is None):
            raise SecurityError(
                f"security policy {self.policy}: give the bridge's certificate and private "
                "key (--certificate, --private-key)"
            )
        if self.policy is None and (self.certificate or self.private_key):
            raise SecurityError(
                "a certificate or private key without a security policy: name the policy "
                f"the server requires (--security-policy, one of {list(POLICIES)})"
            )
        if (self.username_file is None) != (self.password_file is None):
            raise SecurityError(
                "user authentication needs both --username-file and --password-file"
            )
        for path in (
            self.certificate,
            self.private_key,
            self.private_key_password_file,
            self.server_certificate,
            self.username_file,
            self.password_file,
        ):
            if path is not None and not Path(path).is_file():
                raise SecurityError(f"{path}: no such file")
        for path in (self.username_file, self.password_file, self.private_key_password_file):
            self._secret(path)
        for path in (self.certificate, self.server_certificate):
            if path is not None:
                self._application_uri(path)
        if self.private_key is not None:
            from cryptography.hazmat.primitives import serialization

            data = self._bytes(self.private_key)
            secret = self._secret(self.private_key_password_file)
            password = None if secret is None else secret.encode()
            try:
                if data.lstrip().startswith(b"-----"):
                    serialization.load_pem_private_key(data, password)
                else:
                    serialization.load_der_private_key(data, password)
            except (ValueError, TypeError) as error:
                raise SecurityError(
                    f"{self.private_key}: not a private key the bridge can use (PEM or DER, "
                    f"its password in --private-key-password-file): {error}"
                ) from None

    @staticmethod
    def _bytes(path: Path) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as error:
            raise SecurityError(f"{path}: cannot be read: {error}") from None

    @classmethod
    def _application_uri(cls, path: Path) -> str | None:
        """The certificate's application URI (its first URI subject alternative name)."""
        from cryptography import x509

        data = cls._bytes(path)
        try:
            if data.lstrip().startswith(b"-----"):
                certificate = x509.load_pem_x509_certificate(data)
            else:
                certificate = x509.load_der_x509_certificate(data)
        except ValueError as error:
            raise SecurityError(f"{path}: not an X.509 certificate (PEM or DER): {error}") from None
        try:
            names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        except x509.ExtensionNotFound:
            return None
        uris = names.value.get_values_for_type(x509.UniformResourceIdentifier)
        return uris[0] if uris else None

    @staticmethod
    def _secret(path: Path | None) -> str | None:
        if path is None:
            return None
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise SecurityError(f"{path}: cannot be read: {error}") from None
        if not text:
            raise SecurityError(f"{path}: empty")
        return text

    async def apply(self, client: Any, server_certificate: bytes | None = None) -> None:
        """Sets the security policy and the user on ``client`` (before connecting);
        ``server_certificate`` (DER), read from the server's endpoint, unless the bridge
        was given the server's certificate."""
        from asyncua.crypto import security_policies
        from asyncua.ua import MessageSecurityMode

        username = self._secret(self.username_file)
        if username is not None:
            client.set_user(username)
            client.set_password(self._secret(self.password_file))
        if self.policy is None:
            return
        # The client's application URI must be its certificate's (servers reject a
        # certificate that names another application).
        uri = self._application_uri(self.certificate)
        if uri:
            client.application_uri = uri
        given = None if self.server_certificate is None else str(self.server_certificate)
        await client.set_security(
            getattr(security_policies, f"SecurityPolicy{self.policy}"),
            str(self.certificate),
            str(self.private_key),
            self._secret(self.private_key_password_file),
            given or server_certificate,
            getattr(MessageSecurityMode, self.mode),
        )


def _status_name(error: BaseException) -> str | None:
    """The status code's name of an asyncua status error (None for any other error)."""
    from asyncua import ua

    code = getattr(error, "code", None)
    if not isinstance(error, ua.UaError) or code is None:
        return None
    return ua.StatusCode(code).name


#: The numeric built-in types by the id of the DataType a node declares: what a value
#: read from it may be (an abstract Number, Integer or UInteger admits its subtypes;
#: Duration is a Double).
_NUMERIC = {
    2: ("SByte", (2,)),
    3: ("Byte", (3,)),
    4: ("Int16", (4,)),
    5: ("UInt16", (5,)),
    6: ("Int32", (6,)),
    7: ("UInt32", (7,)),
    8: ("Int64", (8,)),
    9: ("UInt64", (9,)),
    10: ("Float", (10,)),
    11: ("Double", (11,)),
    26: ("Number", tuple(range(2, 12))),
    27: ("Integer", (2, 4, 6, 8)),
    28: ("UInteger", (3, 5, 7, 9)),
    290: ("Duration", (11,)),
}


@dataclasses.dataclass(frozen=True)
class NodeType:
    """The data type a node declares and the variant types a value of it may have."""

    name: str
    variants: frozenset[int]

    @classmethod
    def of(cls, data_type: Any) -> NodeType | None:
        """The numeric type of a DataType node id (``None``: not a numeric type)."""
        if getattr(data_type, "NamespaceIndex", None) != 0:
            return None
        known = _NUMERIC.get(getattr(data_type, "Identifier", None))
        if known is None:
            return None
        return cls(known[0], frozenset(known[1]))


def judge(
    value: Any,
    now: dt.datetime,
    stale_after: float,
    clock_skew: float,
    declared: NodeType | None = None,
) -> str | None:
    """Why the ``DataValue`` ``value`` is not usable (``None``: it is); ``declared``: the
    data type of its node, which the value's type must be."""
    status = value.StatusCode
    if status is not None and not status.is_good():
        return f"status {status.name}"
    stamp = value.SourceTimestamp or value.ServerTimestamp
    if stamp is None:
        return "no timestamp"
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    age = (now - stamp).total_seconds()
    if age > stale_after:
        return f"stale: source timestamp {age:.3g} s old (stale_after {stale_after:g} s)"
    if age < -clock_skew:
        return f"source timestamp {-age:.3g} s ahead of the bridge's clock"
    variant = value.Value
    if declared is not None:
        kind = getattr(getattr(variant, "VariantType", None), "value", None)
        if kind not in declared.variants:
            name = getattr(getattr(variant, "VariantType", None), "name", "no value")
            return f"data type: a {name} value on a node declared {declared.name}"
    number = variant.Value if variant is not None else None
    if isinstance(number, bool) or not isinstance(number, int | float):
        return f"not a number: {type(number).__name__}"
    if not math.isfinite(number):
        return f"not a finite number: {number}"
    return None


def _stated_units(information: Any) -> list[tuple[str, str]]:
    """What an ``EUInformation`` states: ``(how, unit)`` of its display name and, in the
    UNECE namespace, of its UnitId."""
    stated = []
    text = getattr(getattr(information, "DisplayName", None), "Text", None)
    if text and text.strip():
        stated.append((f"DisplayName {text.strip()!r}", text.strip()))
    identifier = getattr(information, "UnitId", None)
    namespace = getattr(information, "NamespaceUri", None)
    if namespace == UNECE_NAMESPACE and isinstance(identifier, int) and identifier > 0:
        code = unece_code(identifier)
        unit = unece_unit(identifier)
        if unit is not None:
            stated.append((f"UnitId {identifier} (UNECE {code})", unit))
    return stated


def judge_units(information: Any, unit: str | None) -> str | None:
    """Why the ``EUInformation`` ``information`` does not state ``unit`` (``None``: it
    does, or states nothing the bridge can compare).

    Each thing it states (the display name; the UNECE code in ``UnitId``) that the units
    library reads must be the same unit as ``unit``; a display name it cannot read must
    equal ``unit`` as written, unless the UnitId states ``unit``."""
    if unit is None or information is None:
        return None
    stated = _stated_units(information)
    confirmed = False
    unreadable = []
    for how, text in stated:
        try:
            parse_unit(text)
        except UnitError:
            if text != unit.strip():
                unreadable.append(how)
            continue
        if not same_unit(text, unit):
            return f"EngineeringUnits {how}, not {unit!r}"
        confirmed = True
    if unreadable and not confirmed:
        return f"EngineeringUnits {unreadable[0]}, which is no unit the bridge knows, not {unit!r}"
    return None


class PlantConnection:
    """One session with the server, its bound nodes checked.

    Args:
        endpoint: ``opc.tcp://host:port/path``.
        security: how to authenticate.
        timeout: seconds a request may take.
    """

    def __init__(self, endpoint: str, security: Security, timeout: float = 4.0) -> None:
        if not endpoint.startswith("opc.tcp://"):
            raise PlantConnectionError(f"endpoint {quote(endpoint)}: expected an opc.tcp:// URL")
        self.endpoint = endpoint
        self.security = security
        self.timeout = timeout
        self.client: Any = None
        self._variant_types: list[Any] = []
        #: Of each read node, as :meth:`check_nodes` found them: its data type, its
        #: EngineeringUnits property (``None``: none) and its binding's unit.
        self.read_types: list[NodeType] = []
        self.unit_nodes: list[Any] = []
        self.units: list[str | None] = []

    async def connect(self) -> None:
        """Opens a session; a server that offers no endpoint for the bridge's security is
        named.

        Raises:
            SecurityError: the server requires security the bridge was not given.
            OSError, asyncio.TimeoutError, asyncua.ua.UaError: the server cannot be
                reached or refused the session.
        """
        from asyncua import Client
        from asyncua.crypto import security_policies, uacrypto
        from asyncua.ua import MessageSecurityMode
        from cryptography.hazmat.primitives.serialization import Encoding

        client = Client(self.endpoint, timeout=self.timeout)
        # What the server offers decides: a server without an endpoint for the bridge's
        # security would refuse the session with a bare status code; say what it wants.
        endpoints = await client.connect_and_get_server_endpoints()
        offered = ", ".join(
            sorted(
                {e.SecurityPolicyUri.rsplit("#", 1)[-1] + "/" + e.SecurityMode.name
                 for e in endpoints}
            )
        )  # fmt: skip
        policy = self.security.policy
        if policy is None:
            if not any(e.SecurityPolicyUri.endswith("#None") for e in endpoints):
                raise SecurityError(
                    f"{self.endpoint} requires a security policy (it offers {offered}); give "
                    "--security-policy, --certificate and --private-key"
                )
            server_certificate = None
        else:
            uri = getattr(security_policies, f"SecurityPolicy{policy}").URI
            mode = getattr(MessageSecurityMode, self.security.mode)
            matching = [
                e for e in endpoints if e.SecurityPolicyUri == uri and e.SecurityMode == mode
            ]
            if not matching:
                raise SecurityError(
                    f"{self.endpoint} offers no endpoint with security policy {policy} in "
                    f"mode {self.security.mode} (it offers {offered})"
                )
            certificate = uacrypto.x509_from_der(matching[0].ServerCertificate)
            server_certificate = (
                None if certificate is None else certificate.public_bytes(Encoding.DER)
            )
        await self.security.apply(client, server_certificate)
        try:
            await client.connect()
        except BaseException as error:
            with contextlib.suppress(Exception):
                client.disconnect_socket()
            name = _status_name(error)
            if name in REFUSALS:
                # Not a lost connection: retrying would be refused the same way.
                raise SecurityError(
                    f"{self.endpoint} refused the bridge's session: {name} (check the user "
                    "name and password files, and that the server trusts the bridge's "
                    "certificate)"
                ) from None
            raise
        self.client = client

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                await client.disconnect()
            except Exception:  # the session is gone with the server: close the socket
                with contextlib.suppress(Exception):
                    client.disconnect_socket()

    async def check_nodes(
        self,
        read: Sequence[tuple[str, str]],
        written: Sequence[tuple[str, str]],
        units: Sequence[str | None],
    ) -> None:
        """Checks that every bound node exists and is a scalar variable, that the read ones
        declare a numeric data type and the written ones Float or Double, and that a node's
        EngineeringUnits (where it has them) state the map's unit. Remembers each read
        node's data type and EngineeringUnits, which :meth:`read` checks again.

        Args:
            read: ``(binding, node id)`` of the nodes read.
            written: ``(binding, node id)`` of the nodes written.
            units: the map's unit of each binding, ``read`` then ``written`` (``None``:
                not stated).

        Raises:
            NodeIdError: naming the binding and the node the server does not have, that
                is not a scalar variable, or whose data type the bridge cannot read (or
                write).
            UnitMismatchError: naming the node whose EngineeringUnits differ.
        """
        from asyncua import ua

        bindings = [*read, *written]
        nodes = [self.client.get_node(node) for _, node in bindings]
        classes = await self.client.read_attributes(nodes, ua.AttributeIds.NodeClass)
        for (binding, node), result in zip(bindings, classes, strict=True):
            if not result.StatusCode.is_good():
                raise NodeIdError(
                    f"{binding}: node {quote(node)} does not exist on {self.endpoint} "
                    f"({result.StatusCode.name})"
                )
            if result.Value.Value != ua.NodeClass.Variable:
                raise NodeIdError(
                    f"{binding}: node {quote(node)} is a {ua.NodeClass(result.Value.Value).name}, "
                    "not a variable with a value"
                )
        types = await self.client.read_attributes(nodes, ua.AttributeIds.DataType)
        ranks = await self.client.read_attributes(nodes, ua.AttributeIds.ValueRank)
        self._variant_types = []
        self.read_types = []
        for index, ((binding, node), result, rank) in enumerate(
            zip(bindings, types, ranks, strict=True)
        ):
            data_type = result.Value.Value if result.StatusCode.is_good() else None
            value_rank = rank.Value.Value if rank.StatusCode.is_good() else None
            if isinstance(value_rank, int) and value_rank >= 0:
                raise NodeIdError(
                    f"{binding}: node {quote(node)} holds an array (ValueRank {value_rank}); "
                    "the bridge reads and writes one number per node"
                )
            if index < len(read):
                declared = NodeType.of(data_type)
                if declared is None:
                    raise NodeIdError(
                        f"{binding}: node {quote(node)} declares data type {data_type}, not a "
                        "number; the bridge reads Double, Float or integer nodes"
                    )
                self.read_types.append(declared)
                continue
            variant = {
                ua.NodeId(ua.ObjectIds.Double): ua.VariantType.Double,
                ua.NodeId(ua.ObjectIds.Float): ua.VariantType.Float,
            }.get(data_type)
            if variant is None:
                raise NodeIdError(
                    f"{binding}: node {quote(node)} holds data type {data_type}; the bridge "
                    "writes Float or Double"
                )
            self._variant_types.append(variant)
        self.units = list(units[: len(read)])
        self.unit_nodes = []
        for index, ((binding, node), unit) in enumerate(zip(bindings, units, strict=True)):
            found = await self._check_unit(binding, node, unit)
            if index < len(read):
                self.unit_nodes.append(found)

    async def _check_unit(self, binding: str, node: str, unit: str | None) -> Any:
        """The node's EngineeringUnits property (``None``: it has none), checked against
        the binding's unit."""
        from asyncua import ua

        try:
            prop = await self.client.get_node(node).get_child("0:EngineeringUnits")
            information = await prop.read_value()
        except ua.UaError:
            return None  # no EngineeringUnits property: the map's word stands
        wrong = judge_units(information, unit)
        if wrong is not None:
            raise UnitMismatchError(
                f"{binding}: node {quote(node)} states {wrong} (the map's unit for the node; "
                "the units are compared by the units library: °C is degC)"
            )
        return prop

    async def read(self, nodes: Sequence[Any]) -> list[Any]:
        """The ``DataValue`` of each node (one request)."""
        from asyncua import ua

        return await self.client.read_attributes(nodes, ua.AttributeIds.Value)

    async def read_with_units(self, nodes: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """The ``DataValue`` of each read node and of its EngineeringUnits property as
        :meth:`check_nodes` found it (``None`` where it has none), in one request."""
        from asyncua import ua

        properties = [(i, prop) for i, prop in enumerate(self.unit_nodes) if prop is not None]
        parameters = ua.ReadParameters()
        parameters.NodesToRead = [
            ua.ReadValueId(NodeId=node.nodeid, AttributeId=ua.AttributeIds.Value)
            for node in [*nodes, *(prop for _, prop in properties)]
        ]
        results = await self.client.uaclient.read(parameters)
        units: list[Any] = [None] * len(nodes)
        for (i, _), result in zip(properties, results[len(nodes) :], strict=True):
            units[i] = result
        return list(results[: len(nodes)]), units

    async def write(self, nodes: Sequence[Any], values: Sequence[float]) -> list[Any]:
        """Writes ``values`` (one request); the status code of each write."""
        from asyncua import ua

        data = [
            ua.DataValue(ua.Variant(float(value), variant))
            for value, variant in zip(values, self._variant_types, strict=True)
        ]
        return await self.client.uaclient.write_attributes(
            [node.nodeid for node in nodes], data, ua.AttributeIds.Value
        )

    def nodes(self, ids: Sequence[str]) -> list[Any]:
        return [self.client.get_node(node) for node in ids]
