"""The OPC UA side of the bridge (asyncua): connecting with the security the server
requires, credentials read from files, checking the bound nodes once connected, reading
values with their quality and writing actions.

A value is usable when its status code is Good, its source timestamp (the server's
timestamp when the source gives none) is no older than the map's ``stale_after`` and not
ahead of the bridge's clock by more than ``clock_skew``, and it is a finite number.
:func:`judge` says why one is not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from neorl_industrial.core.utils.messages import quote
from neorl_industrial.integration.plant_floor.errors import (
    NodeIdError,
    PlantConnectionError,
    SecurityError,
    UnitMismatchError,
)

__all__ = ["PlantConnection", "Security", "judge"]

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


def judge(value: Any, now: dt.datetime, stale_after: float, clock_skew: float) -> str | None:
    """Why the ``DataValue`` ``value`` is not usable (``None``: it is)."""
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
    number = value.Value.Value if value.Value is not None else None
    if isinstance(number, bool) or not isinstance(number, int | float):
        return f"not a number: {type(number).__name__}"
    if not math.isfinite(number):
        return f"not a finite number: {number}"
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
        """Checks that every bound node exists and is a variable, that the written ones
        hold a Float or Double, and that a node's EngineeringUnits (where it has them)
        state the map's unit.

        Args:
            read: ``(binding, node id)`` of the nodes read.
            written: ``(binding, node id)`` of the nodes written.
            units: the map's unit of each binding, ``read`` then ``written`` (``None``:
                not stated).

        Raises:
            NodeIdError: naming the binding and the node the server does not have, or
                that it holds no number the bridge can write.
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
        write_nodes = [self.client.get_node(node) for _, node in written]
        types = await self.client.read_attributes(write_nodes, ua.AttributeIds.DataType)
        self._variant_types = []
        for (binding, node), result in zip(written, types, strict=True):
            data_type = result.Value.Value
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
        for (binding, node), unit in zip(bindings, units, strict=True):
            await self._check_unit(binding, node, unit)

    async def _check_unit(self, binding: str, node: str, unit: str | None) -> None:
        from asyncua import ua

        try:
            prop = await self.client.get_node(node).get_child("0:EngineeringUnits")
            information = await prop.read_value()
        except ua.UaError:
            return  # no EngineeringUnits property: the map's word stands
        stated = getattr(getattr(information, "DisplayName", None), "Text", None)
        if stated and unit is not None and stated.strip() != unit:
            raise UnitMismatchError(
                f"{binding}: node {quote(node)} states EngineeringUnits {stated!r}, the map "
                f"and the task {unit!r}"
            )

    async def read(self, nodes: Sequence[Any]) -> list[Any]:
        """The ``DataValue`` of each node (one request)."""
        from asyncua import ua

        return await self.client.read_attributes(nodes, ua.AttributeIds.Value)

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
