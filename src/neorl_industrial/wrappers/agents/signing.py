"""Ed25519 signatures of exported policies: who exported an artifact, and that nothing in
it changed since.

The manifest already holds the sha256 of every file, so a signature over the manifest's
canonical bytes covers the serialized policy, the shield's constraints and the parameters.
It is stored next to the manifest as ``signature.json``::

    {"algorithm": "ed25519", "key_fingerprint": "<sha256 of the raw public key>",
     "signature": "<base64>"}

A server holds the public keys it trusts (:func:`load_public_keys`) and verifies with
:func:`verify_manifest`; the private key stays with whoever may release policies.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "ALGORITHM",
    "PRIVATE_KEY",
    "PUBLIC_KEY",
    "SIGNATURE",
    "SigningError",
    "canonical_manifest_bytes",
    "fingerprint",
    "generate_key_pair",
    "load_private_key",
    "load_public_keys",
    "sign_manifest",
    "verify_manifest",
]

ALGORITHM = "ed25519"
SIGNATURE = "signature.json"
PRIVATE_KEY = "policy-signing.key"
PUBLIC_KEY = "policy-signing.pub"


class SigningError(ValueError):
    """A key or signature that cannot be used; the message names the file and why."""


def canonical_manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The bytes a signature covers: the whole manifest as sorted, compact JSON."""
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def fingerprint(public_key: Ed25519PublicKey) -> str:
    """``sha256:<hex>`` of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"sha256:{hashlib.sha256(raw).hexdigest()}"


def generate_key_pair(directory: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Writes a new key pair into ``directory``: the private key PEM (mode 0600) and the
    public key PEM that servers trust.

    Returns:
        The private key's path (the public key is next to it, ``.pub``).

    Raises:
        FileExistsError: if a key is there already and ``overwrite`` is false.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / PRIVATE_KEY, directory / PUBLIC_KEY
    for path in (private_path, public_path):
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path}: already exists; pass overwrite to replace it")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    # Each key is written whole under a temporary name and then put in place, so a
    # process that finds a key (two runs making the pair at once) reads a complete one.
    staged = []
    try:
        for path, data, mode in (
            (public_path, public_pem, 0o644),
            (private_path, private_pem, 0o600),
        ):
            temporary = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            # Created with its mode from the start: a private key is never readable by
            # others, not even briefly.
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            staged.append(temporary)
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
        public_staged, private_staged = staged
        if overwrite:
            os.replace(private_staged, private_path)
            os.replace(public_staged, public_path)
        else:
            # link() fails if the name exists: of two writers, one pair wins whole.
            os.link(private_staged, private_path)
            try:
                os.link(public_staged, public_path)
            except FileExistsError:
                private_path.unlink()
                raise
    except FileExistsError:
        raise FileExistsError(
            f"{private_path}: already exists; pass overwrite to replace it"
        ) from None
    finally:
        for temporary in staged:
            temporary.unlink(missing_ok=True)
    return private_path


def load_private_key(key: str | os.PathLike[str] | Ed25519PrivateKey) -> Ed25519PrivateKey:
    """A private key object, or the PEM file of one (unencrypted PKCS#8)."""
    if isinstance(key, Ed25519PrivateKey):
        return key
    return _load_pem(
        key,
        lambda data: serialization.load_pem_private_key(data, password=None),
        Ed25519PrivateKey,
        "the signing key",
        "an unencrypted PEM private key",
    )


def _load_pem(key: str | os.PathLike[str], load: Any, kind: type, what: str, expected: str) -> Any:
    """The Ed25519 key (``kind``) in the PEM file ``key``, read with ``load``.

    Raises:
        SigningError: naming the file: unreadable, not ``expected``, or not Ed25519.
    """
    path = Path(key)
    try:
        loaded = load(path.read_bytes())
    except OSError as error:
        raise SigningError(f"{path}: cannot read {what}: {error}") from None
    except (ValueError, TypeError) as error:
        raise SigningError(f"{path}: not {expected}: {error}") from None
    if not isinstance(loaded, kind):
        raise SigningError(f"{path}: a {type(loaded).__name__}; expected an Ed25519 key")
    return loaded


def load_public_keys(
    keys: Iterable[str | os.PathLike[str] | Ed25519PublicKey],
) -> dict[str, Ed25519PublicKey]:
    """The trusted public keys (objects or PEM files) by fingerprint."""
    trusted: dict[str, Ed25519PublicKey] = {}
    for key in keys:
        if not isinstance(key, Ed25519PublicKey):
            key = _load_pem(
                key,
                serialization.load_pem_public_key,
                Ed25519PublicKey,
                "the trusted key",
                "a PEM public key",
            )
        trusted[fingerprint(key)] = key
    return trusted


def sign_manifest(
    manifest: Mapping[str, Any], key: str | os.PathLike[str] | Ed25519PrivateKey
) -> dict[str, str]:
    """The ``signature.json`` content of ``manifest`` signed with ``key``."""
    private = load_private_key(key)
    signature = private.sign(canonical_manifest_bytes(manifest))
    return {
        "algorithm": ALGORITHM,
        "key_fingerprint": fingerprint(private.public_key()),
        "signature": base64.b64encode(signature).decode(),
    }


def verify_manifest(
    manifest: Mapping[str, Any],
    signature: Mapping[str, Any],
    trusted: Mapping[str, Ed25519PublicKey],
    where: str = SIGNATURE,
) -> str:
    """Checks ``signature`` of ``manifest`` against the ``trusted`` keys.

    Returns:
        The fingerprint of the key that signed it.

    Raises:
        SigningError: for a signature of another algorithm, by a key not trusted, or one
            that does not match the manifest (the manifest or a file was changed).
    """
    if not isinstance(signature, Mapping) or signature.get("algorithm") != ALGORITHM:
        raise SigningError(f"{where}: not an {ALGORITHM} signature")
    key_fingerprint = str(signature.get("key_fingerprint", ""))
    key = trusted.get(key_fingerprint)
    if key is None:
        raise SigningError(
            f"{where}: signed by the key {key_fingerprint}, which is not one of the "
            f"{len(trusted)} trusted key(s)"
        )
    try:
        raw = base64.b64decode(str(signature.get("signature", "")), validate=True)
        key.verify(raw, canonical_manifest_bytes(manifest))
    except (InvalidSignature, ValueError):
        raise SigningError(
            f"{where}: the signature does not match the manifest (the artifact was changed "
            "after it was signed)"
        ) from None
    return key_fingerprint
