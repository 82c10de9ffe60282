"""An exported policy's files, read and verified before anything is deserialized: the
format's names, the manifest and its digest, the signature, and the checks that refuse
anything but the regular files the manifest lists with their sha256, and the policy's
parameters (:data:`PARAMETER_ARRAYS`) checked against what the functions take.
:class:`~.artifact.PolicyArtifact` serves what :func:`read_artifact_files` returns."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import stat
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from neorl_industrial.core.utils.messages import quote, shorten
from neorl_industrial.wrappers.agents.signing import (
    SIGNATURE,
    SigningError,
    load_public_keys,
    verify_manifest,
)
from neorl_industrial.wrappers.hostio import file_kind

__all__ = [
    "CONSTRAINTS",
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "PARAMETERS",
    "PARAMETER_ARRAYS",
    "ArtifactFiles",
    "PolicyArtifactError",
    "read_artifact_files",
    "verified_file",
]

FORMAT = "neorl_industrial.policy"
# 3: the functions take the policy's parameters as their first argument (the arrays of
# PARAMETER_ARRAYS), so policies of one architecture share their compiled programs;
# 2: the functions hold the parameters as constants, and return the proposed and applied
# margins as one ``[batch, 2, n_hard]`` output ("margins"); 1: the proposed margins alone
# ("margin"). Formats 1 and 2 are still read (from 1, what the applied action breaks is
# then unknown).
FORMAT_VERSION = 3
READABLE_FORMAT_VERSIONS = (1, 2, 3)
MANIFEST = "manifest.json"
CONSTRAINTS = "constraints.yaml"
PARAMETERS = "params.msgpack"
#: The policy's parameters as the functions take them (format 3): ``leaf_0`` ...
#: ``leaf_<n-1>``, the array leaves of its parameter tree in tree order, written by
#: ``numpy.savez``. PARAMETERS holds the same values by path, for inspection.
PARAMETER_ARRAYS = "params.npz"


class PolicyArtifactError(ValueError):
    """An artifact that cannot be written or loaded; the message names the file or field."""


def _digest(manifest: Mapping[str, Any]) -> str:
    body = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class ArtifactFiles:
    """A verified artifact's contents, as the serving classes are built from them.

    Attributes:
        path: the artifact directory.
        manifest: the manifest, its digest checked.
        functions: ``(manifest entry, jax.export.Exported)`` of each serialized function.
        spec_text: the constraint spec's YAML.
        signature: ``{"key_fingerprint": ..., "verified": bool}``; ``None``: unsigned.
        check: ``(manifest entry, jax.export.Exported)`` of the check function (see
            :data:`~.artifact.CHECK`); ``None`` for an artifact exported without one.
        parameters: the arrays of :data:`PARAMETER_ARRAYS`, the first argument of every
            function, each of the shape and dtype the functions take; ``None`` for an
            artifact of format 1 or 2, whose functions hold their parameters.
    """

    path: Path
    manifest: dict[str, Any]
    functions: list[tuple[dict[str, Any], Any]]
    spec_text: str
    signature: dict[str, Any] | None = None
    check: tuple[dict[str, Any], Any] | None = None
    parameters: tuple[np.ndarray, ...] | None = None


def read_artifact_files(
    path: Path, trusted_keys: Iterable[Any] | None, require_signature: bool
) -> ArtifactFiles:
    """The files of the artifact at ``path``, each checked against the manifest's sha256,
    its functions deserialized for this machine's platform.

    Raises:
        PolicyArtifactError: as :meth:`~.artifact.PolicyArtifact.load` lists.
    """
    _check_entries(path)
    manifest = _read_manifest(path)
    signature = _checked_signature(path, manifest, trusted_keys, require_signature)
    digests = manifest["files"]
    check_entry = manifest.get("check")
    takes_parameters = manifest["format_version"] >= 3
    named = {entry["file"] for entry in manifest["functions"]} | {CONSTRAINTS}
    if check_entry is not None:
        named.add(check_entry["file"])
    if takes_parameters:
        named.add(PARAMETER_ARRAYS)
    for name in sorted(named):
        if name not in digests:
            raise PolicyArtifactError(f"{path / MANIFEST}: lists no sha256 for {name}")
    contents = {name: verified_file(path, name, digest) for name, digest in digests.items()}
    functions = [
        (entry, _deserialized(path, entry["file"], contents)) for entry in manifest["functions"]
    ]
    check = None
    if check_entry is not None:
        check = (check_entry, _deserialized(path, check_entry["file"], contents))
    parameters = None
    if takes_parameters:
        exported = [(entry["file"], function) for entry, function in functions]
        if check is not None:
            exported.append((check[0]["file"], check[1]))
        parameters = _parameter_arrays(path, contents[PARAMETER_ARRAYS], exported)
    try:
        spec_text = contents[CONSTRAINTS].decode()
    except UnicodeDecodeError as error:
        raise PolicyArtifactError(f"{path / CONSTRAINTS}: not UTF-8 text: {error}") from None
    return ArtifactFiles(path, manifest, functions, spec_text, signature, check, parameters)


def _deserialized(path: Path, name: str, contents: Mapping[str, bytes]) -> Any:
    """The serialized function ``name`` of the artifact, for this machine's platform."""
    try:
        exported = jax.export.deserialize(bytearray(contents[name]))
    except Exception as error:
        raise PolicyArtifactError(
            f"{path / name}: cannot deserialize the policy function with jax "
            f"{jax.__version__}: {type(error).__name__}: {error}"
        ) from None
    platform = jax.default_backend()
    if platform not in exported.platforms:
        raise PolicyArtifactError(
            f"{path / name}: lowered for {list(exported.platforms)}, but this machine "
            f"runs on {platform!r}; export it again with platforms including {platform!r}"
        )
    return exported


def _parameter_avals(path: Path, name: str, exported: Any) -> tuple[Any, ...]:
    """The parameters the function ``name`` takes: the avals of its first argument,
    refused unless it is called ``function(parameters, observations, prev_actions)`` with
    ``parameters`` a flat tuple of arrays."""
    count = len(exported.in_avals) - 2
    expected = jax.tree.structure((((0,) * max(count, 0), 0, 0), {}))
    if count < 0 or exported.in_tree != expected:
        raise PolicyArtifactError(
            f"{path / name}: takes {exported.in_tree}, not (parameters, observations, "
            "prev_actions) with the parameters a tuple of arrays, as a function of "
            f"format_version {FORMAT_VERSION} does"
        )
    return tuple(exported.in_avals[:count])


def _described(dtype: Any, shape: tuple[int, ...]) -> str:
    return f"{np.dtype(dtype).name} {tuple(shape)}"


def _parameter_arrays(
    path: Path, data: bytes, functions: list[tuple[str, Any]]
) -> tuple[np.ndarray, ...]:
    """The arrays of :data:`PARAMETER_ARRAYS` (``data``, its sha256 checked), refused
    by name unless every function takes arrays of exactly their number, shapes and
    dtypes."""
    first, avals = functions[0][0], _parameter_avals(path, *functions[0])
    for name, exported in functions[1:]:
        other = _parameter_avals(path, name, exported)
        if [(a.shape, a.dtype) for a in other] != [(a.shape, a.dtype) for a in avals]:
            raise PolicyArtifactError(
                f"{path / name}: takes other parameters than {first} "
                f"({len(other)} arrays, not {len(avals)}, or of other shapes or dtypes)"
            )
    file = path / PARAMETER_ARRAYS
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = archive.namelist()
            expected = [f"leaf_{index}.npy" for index in range(len(avals))]
            if sorted(names) != sorted(expected):
                listed = ", ".join(name.removesuffix(".npy") for name in names[:8])
                raise PolicyArtifactError(
                    f"{file}: holds {len(names)} arrays ({listed or 'none'}), but the policy "
                    f"functions take {len(avals)} (leaf_0 ... leaf_{len(avals) - 1})"
                )
            return tuple(
                _parameter_array(file, archive, name, aval)
                for name, aval in zip(expected, avals, strict=True)
            )
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as error:
        # Not a zip archive, a damaged member, or one compressed or encrypted in a way
        # zipfile cannot read (numpy.savez writes none of these).
        raise PolicyArtifactError(
            f"{file}: not a numpy .npz archive of the policy's parameters: "
            f"{type(error).__name__}: {error}"
        ) from None


def _parameter_array(file: Path, archive: zipfile.ZipFile, name: str, aval: Any) -> np.ndarray:
    """The array ``name`` of the archive, its header compared with ``aval`` before its
    data is read (and then exactly the bytes that header declares)."""
    expected = np.dtype(aval.dtype)
    with archive.open(name) as member:
        try:
            version = np.lib.format.read_magic(member)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
            else:
                raise ValueError(f"npy format version {version} (1.0 or 2.0 are read)")
        except (ValueError, SyntaxError, TypeError) as error:
            raise PolicyArtifactError(
                f"{file}: {name} is not a numpy array: {shorten(str(error))}"
            ) from None
        # numpy writes types it has no name for (bfloat16, float8) as raw bytes ("V2").
        raw_of_expected = (
            dtype.kind == "V" == expected.kind
            and dtype.fields is None
            and dtype.itemsize == expected.itemsize
        )
        if tuple(shape) != tuple(aval.shape) or not (dtype == expected or raw_of_expected):
            raise PolicyArtifactError(
                f"{file}: {name} is {_described(dtype, shape)}, but the policy functions "
                f"take {_described(expected, aval.shape)}"
            )
        size = math.prod(shape) * dtype.itemsize
        values = member.read(size + 1)
    if len(values) != size:
        raise PolicyArtifactError(
            f"{file}: {name} holds {len(values)} bytes of values, not the {size} of "
            f"{_described(expected, aval.shape)}"
        )
    return np.frombuffer(values, expected).reshape(shape, order="F" if fortran else "C")


def _check_entries(path: Path) -> None:
    """Refuses an artifact directory holding anything but regular files (a FIFO would
    block a reader forever, a symlink could point out of the directory, a device could
    be endless), before a byte of it is read."""
    try:
        entries = sorted(os.scandir(path), key=lambda entry: entry.name)
    except NotADirectoryError:
        raise PolicyArtifactError(f"{path}: not a directory; a policy artifact is one") from None
    except FileNotFoundError:
        raise PolicyArtifactError(f"{path}: no such policy artifact directory") from None
    except OSError as error:
        raise PolicyArtifactError(f"{path}: cannot be listed: {error}") from None
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            mode = entry.stat(follow_symlinks=False).st_mode
            raise PolicyArtifactError(
                f"{path / entry.name}: a {file_kind(mode)}, not a regular file; a policy artifact "
                "holds regular files only (nothing was read)"
            )


def _read_regular(file: Path) -> bytes:
    """The bytes of ``file``, opened without following a symlink and without blocking,
    and read only if it is a regular file (checked on the open descriptor, so nothing can
    be swapped in between the check and the read).

    Raises:
        FileNotFoundError: if it is missing.
        PolicyArtifactError: for anything but a regular file, or an unreadable one.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(file, flags)
    except FileNotFoundError:
        raise
    except OSError as error:
        if file.is_symlink():
            raise PolicyArtifactError(
                f"{file}: a symbolic link, not a regular file; a policy artifact holds "
                "regular files only"
            ) from None
        raise PolicyArtifactError(f"{file}: cannot be read: {error}") from None
    # Checked on the descriptor before a file object is made of it: Python's open of a
    # directory raises IsADirectoryError, naming neither the file nor the artifact.
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise PolicyArtifactError(
            f"{file}: a {file_kind(mode)}, not a regular file; a policy artifact holds regular "
            "files only"
        )
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read()


#: The deepest nesting of a manifest or signature read (the exporter writes at most a few
#: levels); deeper JSON is refused before anything walks it recursively.
MAX_JSON_DEPTH = 64
_SHA256_HEX = frozenset("0123456789abcdef")


def _read_json(file: Path, data: bytes) -> Any:
    """``data`` parsed as JSON, refused by name when it is not JSON or nested deeper than
    :data:`MAX_JSON_DEPTH` (Python's parser would raise RecursionError, and every later
    walk of it too)."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise PolicyArtifactError(f"{file}: cannot be read as JSON: {error}") from None
    except RecursionError:
        raise PolicyArtifactError(
            f"{file}: JSON nested too deeply to read (at most {MAX_JSON_DEPTH} levels)"
        ) from None
    # Iterative, so a depth the parser still took cannot overflow a recursive walk later.
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise PolicyArtifactError(
                f"{file}: JSON nested deeper than {MAX_JSON_DEPTH} levels; not written by "
                "the exporter"
            )
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return value


def _check_files_table(file: Path, manifest: dict[str, Any]) -> None:
    """The manifest's ``files``, ``functions`` and ``check`` tables before anything they
    name is opened: every name a plain file name of the artifact (no ``..``, ``.``, path or
    absolute path), every digest a SHA-256."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise PolicyArtifactError(f"{file}: 'files' must map file names to their sha256")
    for name, digest in files.items():
        if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise PolicyArtifactError(
                f"{file}: files lists {quote(name)}, which is not a file name of the artifact "
                "(no '.', '..', paths or absolute paths; nothing was read)"
            )
        if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _SHA256_HEX):
            raise PolicyArtifactError(
                f"{file}: the sha256 of {quote(name)} is {quote(digest)}, not 64 hex digits"
            )
    functions = manifest.get("functions")
    if not isinstance(functions, list) or not functions:
        raise PolicyArtifactError(f"{file}: 'functions' must list the serialized functions")
    for index, entry in enumerate(functions):
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("file"), str)
            and isinstance(entry.get("min_batch"), int)
            and not isinstance(entry.get("min_batch"), bool)
        ):
            raise PolicyArtifactError(
                f"{file}: functions[{index}] must be {{'file': name, 'min_batch': integer}}"
            )
    check = manifest.get("check")
    if check is not None and not (
        isinstance(check, dict)
        and isinstance(check.get("file"), str)
        and isinstance(check.get("max_batch"), int)
        and not isinstance(check.get("max_batch"), bool)
        and check["max_batch"] >= 1
    ):
        raise PolicyArtifactError(
            f"{file}: 'check' must be {{'file': name, 'max_batch': positive integer}}"
        )


def _read_manifest(path: Path) -> dict[str, Any]:
    file = path / MANIFEST
    try:
        data = _read_regular(file)
    except FileNotFoundError:
        raise PolicyArtifactError(f"{file}: missing; {path} is not a policy artifact") from None
    manifest = _read_json(file, data)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise PolicyArtifactError(f"{file}: not a {FORMAT} manifest (no 'format': {FORMAT!r})")
    version = manifest.get("format_version")
    if isinstance(version, bool) or version not in READABLE_FORMAT_VERSIONS:
        readable = " and ".join(map(str, READABLE_FORMAT_VERSIONS))
        raise PolicyArtifactError(
            f"{file}: format_version {version!r} is unknown; this neorl_industrial reads "
            f"format_version {readable}"
        )
    if manifest.get("manifest_sha256") != _digest(manifest):
        raise PolicyArtifactError(f"{file}: corrupt (its content does not match its sha256)")
    _check_files_table(file, manifest)
    return manifest


def verified_file(path: Path, name: str, digest: str) -> bytes:
    """The bytes of the artifact's file ``name``, refused unless their sha256 is ``digest``."""
    file = path / name
    if Path(name).name != name:
        raise PolicyArtifactError(f"{path / MANIFEST}: file name {name!r} is not in the artifact")
    try:
        data = _read_regular(file)
    except FileNotFoundError:
        raise PolicyArtifactError(f"{file}: missing from the policy artifact") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise PolicyArtifactError(f"{file}: corrupt (sha256 differs from the manifest's)")
    return data


def _checked_signature(
    path: Path,
    manifest: dict[str, Any],
    trusted_keys: Iterable[Any] | None,
    require_signature: bool,
) -> dict[str, Any] | None:
    """The artifact's signature, verified against ``trusted_keys`` when they are given."""
    file = path / SIGNATURE
    try:
        data = _read_regular(file)
    except FileNotFoundError:
        if require_signature:
            raise PolicyArtifactError(
                f"{path}: unsigned (no {SIGNATURE}), but a signature by a trusted key is "
                "required; export it with a signing key (neorl-industrial export --sign-key)"
            ) from None
        return None
    signature = _read_json(file, data)
    if not isinstance(signature, dict):
        raise PolicyArtifactError(f"{file}: expected a JSON object")
    if trusted_keys is None:
        if require_signature:
            raise PolicyArtifactError(
                f"{file}: a signature is required but no trusted keys were given to verify it"
            )
        return {"key_fingerprint": str(signature.get("key_fingerprint")), "verified": False}
    try:
        fingerprint = verify_manifest(
            manifest, signature, load_public_keys(trusted_keys), str(file)
        )
    except SigningError as error:
        raise PolicyArtifactError(str(error)) from None
    return {"key_fingerprint": fingerprint, "verified": True}
