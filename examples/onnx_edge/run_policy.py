"""Runs an exported policy's ONNX graph with nothing but ONNX Runtime and numpy.

The artifact directory comes from ``neorl-industrial export AGENT --out DIR --format
onnx``. This script does on an edge box what the project's loader does: it checks the
manifest's own digest, the signature (with ``cryptography``, when a trusted key is given)
and the graph's sha256 before ONNX Runtime reads a byte of it, then decides actions::

    python run_policy.py DIR --trusted-key policy-signing.pub --observations obs.csv

``obs.csv`` has a header row naming the observation features (the manifest's
``observation_names``, any order) and one row per observation; ``--prev-actions`` is the
same for the actions applied at the previous step (without it: unknown, and the rate
limits cannot apply). Without ``--observations`` it decides a few rows drawn inside the
data's range, as a smoke test. Exit status 0: decided; 2: the artifact or an input was
refused (the message says why).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime

MANIFEST = "manifest.json"
SIGNATURE = "signature.json"
FORMAT = "neorl_industrial.policy"


class Refused(Exception):
    """The artifact or an input cannot be used; the message says why."""


def read_manifest(directory: Path) -> dict:
    """The manifest, checked against its own sha256."""
    try:
        manifest = json.loads((directory / MANIFEST).read_bytes())
    except (OSError, ValueError) as error:
        raise Refused(f"{directory / MANIFEST}: cannot be read: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise Refused(f"{directory / MANIFEST}: not a {FORMAT} manifest")
    body = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    if hashlib.sha256(text.encode()).hexdigest() != manifest.get("manifest_sha256"):
        raise Refused(f"{directory / MANIFEST}: corrupt (its content does not match its sha256)")
    if "onnx" not in manifest:
        raise Refused(f"{directory}: exported without an ONNX graph; export it with --format onnx")
    return manifest


def verify_signature(directory: Path, manifest: dict, key_file: Path | None, required: bool) -> str:
    """Checks ``signature.json`` (Ed25519 over the manifest's canonical JSON) with the
    trusted public key; returns what was checked."""
    file = directory / SIGNATURE
    if not file.is_file():
        if required:
            raise Refused(f"{directory}: unsigned (no {SIGNATURE}), but a signature is required")
        return "unsigned"
    signature = json.loads(file.read_bytes())
    if key_file is None:
        if required:
            raise Refused("a signature is required: give the trusted key (--trusted-key)")
        return f"signed by {signature.get('key_fingerprint')} (not verified: no trusted key)"
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
    except ModuleNotFoundError:
        raise Refused(
            "verifying the signature needs the cryptography package (pip install "
            "cryptography), or openssl (see README.md)"
        ) from None
    key = serialization.load_pem_public_key(key_file.read_bytes())
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    fingerprint = f"sha256:{hashlib.sha256(raw).hexdigest()}"
    if signature.get("algorithm") != "ed25519" or signature.get("key_fingerprint") != fingerprint:
        raise Refused(f"{file}: not an Ed25519 signature by the trusted key {fingerprint}")
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=False)
    try:
        key.verify(base64.b64decode(signature["signature"], validate=True), canonical.encode())
    except (InvalidSignature, ValueError):
        raise Refused(
            f"{file}: the signature does not match the manifest (the artifact was changed)"
        ) from None
    return f"signed by {fingerprint} (verified)"


def open_graph(directory: Path, manifest: dict) -> onnxruntime.InferenceSession:
    """The ONNX Runtime session of the graph, whose bytes match the manifest's sha256."""
    name = manifest["onnx"]["file"]
    if Path(name).name != name:
        raise Refused(f"{directory / MANIFEST}: file name {name!r} is not in the artifact")
    data = (directory / name).read_bytes()  # read once: these bytes are checked and run
    if hashlib.sha256(data).hexdigest() != manifest["files"].get(name):
        raise Refused(f"{directory / name}: corrupt (sha256 differs from the manifest's)")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def read_rows(file: Path, names: list[str]) -> np.ndarray:
    """``[rows, len(names)]`` float32 from a CSV whose header names the columns."""
    with file.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = sorted(set(names) - set(reader.fieldnames or ()))
        if missing:
            raise Refused(f"{file}: no column for {missing[:5]} (header: the manifest's names)")
        try:
            rows = [[float(row[name]) for name in names] for row in reader]
        except ValueError as error:
            raise Refused(f"{file}: {error}") from None
    if not rows:
        raise Refused(f"{file}: no rows")
    return np.asarray(rows, np.float32)


def demo_rows(manifest: dict, rows: int = 4) -> np.ndarray:
    """Rows drawn inside the data's range (or the physical bounds; else [-1, 1])."""
    size = manifest["observation_size"]
    low = np.full(size, -1.0)
    high = np.full(size, 1.0)
    for low_key, high_key in (("observation_low", "observation_high"), ("data_low", "data_high")):
        for i, (lo, hi) in enumerate(
            zip(
                manifest.get(low_key) or [None] * size,
                manifest.get(high_key) or [None] * size,
                strict=True,
            )
        ):
            if lo is not None and hi is not None:
                low[i], high[i] = lo, hi
    return np.random.default_rng(0).uniform(low, high, (rows, size)).astype(np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path, help="the exported policy's directory")
    parser.add_argument("--trusted-key", type=Path, help="the signer's public key (PEM)")
    parser.add_argument("--require-signature", action="store_true")
    parser.add_argument("--observations", type=Path, help="CSV of observations (header: names)")
    parser.add_argument("--prev-actions", type=Path, help="CSV of previous actions")
    parser.add_argument("--json", action="store_true", help="print the decisions as JSON")
    args = parser.parse_args(argv)
    try:
        manifest = read_manifest(args.artifact)
        signed = verify_signature(args.artifact, manifest, args.trusted_key, args.require_signature)
        session = open_graph(args.artifact, manifest)
        names = manifest["observation_names"]
        observations = (
            read_rows(args.observations, names) if args.observations else demo_rows(manifest)
        )
        if args.prev_actions:
            prev_actions = read_rows(args.prev_actions, manifest["action_names"])
            if len(prev_actions) != len(observations):
                raise Refused(f"{args.prev_actions}: one row per observation expected")
        else:
            prev_actions = np.full((len(observations), manifest["action_size"]), np.nan, np.float32)
    except Refused as error:
        print(f"refused: {error}", file=sys.stderr)
        return 2
    action, status = session.run(
        ["action", "status"],
        {"observations": observations, "prev_actions": prev_actions},
    )
    bits = manifest["status_bits"]
    flags = [[name for name, bit in bits.items() if int(s) & bit] for s in status]
    if args.json:
        print(
            json.dumps(
                {
                    "signature": signed,
                    "action": action.tolist(),
                    "status": status.tolist(),
                    "flags": flags,
                }
            )
        )
        return 0
    print(f"{args.artifact}: {signed}; opset {manifest['onnx']['opset']}")
    for row, (applied, flagged) in enumerate(zip(action, flags, strict=True)):
        values = ", ".join(
            f"{name}={value:.6g}"
            for name, value in zip(manifest["action_names"], applied, strict=True)
        )
        print(f"row {row}: {values}" + (f"  [{', '.join(flagged)}]" if flagged else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
