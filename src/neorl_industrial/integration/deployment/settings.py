"""Settings of the policy server (pydantic-settings): environment variables with the
prefix ``NEORL_SERVE_``, a ``.env`` file, and API keys from the settings or a secrets file.

    NEORL_SERVE_MODEL=models:/ib-policy@champion
    NEORL_SERVE_API_KEYS='{"act": ["k1"], "admin": ["k2"]}'
    NEORL_SERVE_API_KEYS_FILE=/run/secrets/api-keys.yaml    # the same mapping, YAML or JSON

Keys are compared in constant time. A server without any key refuses to start unless
``NEORL_SERVE_AUTH=false`` says that is intended (a closed network, a test); so does one
with a placeholder (``replace-with-...``, ``change-me``), short (below 32 characters) or
low-entropy key.

What the server trusts (see :class:`~.policy.PolicyTrust`): policies signed by one of its
keys, by default ``keys/policy-signing.pub`` in the working directory (where a first
``neorl-industrial run`` makes the pair) when no key is named; a server with no key
refuses to start unless ``NEORL_SERVE_ALLOW_UNSIGNED=true`` says, on purpose, that
unsigned policies may serve (logged as a warning at start and at every reload).

    NEORL_SERVE_TRUSTED_KEYS='["/run/secrets/release.pub"]'     # whose signatures count
    NEORL_SERVE_PINNED_CONSTRAINTS=/etc/neorl/constraints.yaml  # the safety engineer's spec
    NEORL_SERVE_PINNED_TASK=/etc/neorl/dataset.json             # names, units, bounds
"""

from __future__ import annotations

import json
import math
import re
import zlib
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from neorl_industrial.integration.deployment.errors import SettingsError
from neorl_industrial.wrappers.hostio import YamlError, read_yaml

__all__ = [
    "DEFAULT_TRUSTED_KEY",
    "MIN_KEY_LENGTH",
    "ROLES",
    "ServerSettings",
    "SettingsError",
    "check_api_key",
]

#: ``act`` may call the policy; ``admin`` may also reload it.
ROLES = ("act", "admin")
#: The shortest API key accepted (``secrets.token_urlsafe(32)`` gives 43 characters).
MIN_KEY_LENGTH = 32
#: Fewer bits than this (estimated, see :func:`check_api_key`): a pattern, not a secret.
_MIN_KEY_BITS = 90.0
_PLACEHOLDERS = (
    "replace-with",
    "change-me",
    "changeme",
    "placeholder",
    "your-api-key",
    "your_api_key",
    "api-key-here",
    "secret-key",
    "password",
    "example",
)
#: Runs of neighbouring keys and letters (``qwerty``, ``asdf``, ``12345``, ``abcde``),
#: which a person types and an attacker tries first.
_WALKS = (
    "qwertyuiop",
    "asdfghjkl",
    "zxcvbnm",
    "1234567890",
    "abcdefghijklmnopqrstuvwxyz",
    "qazwsxedcrfvtgbyhnujmikolp",
    # The columns with their digits, the way up and down, and shifted (lowered: the
    # estimate compares lower case).
    "1qaz2wsx3edc4rfv5tgb6yhn7ujm8ik,9ol.0p;/",
    "zaq1xsw2cde3vfr4bgt5nhy6mju7,ki8.lo9/;p0",
    "!qaz@wsx#edc$rfv%tgb^yhn&ujm*ik<(ol>)p:?",
    "!@#$%^&*()_+",
)
#: The trusted key the server reads when none is named: where ``make run`` puts it.
DEFAULT_TRUSTED_KEY = Path("keys") / "policy-signing.pub"
_GENERATE = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="NEORL_SERVE_", env_file=".env", extra="ignore", frozen=True
    )

    #: An exported policy directory or a registry URI (``models:/ib-policy@champion``).
    model: str = Field(default="", description="policy directory or models:/ URI")
    #: The MLflow store that ``models:/`` URIs are read from (default: MLflow's own).
    tracking_uri: str | None = None
    #: API keys per role: ``{"act": [...], "admin": [...]}``.
    api_keys: dict[str, list[SecretStr]] = Field(default_factory=dict)
    #: A YAML or JSON file with the same mapping (e.g. a mounted Kubernetes Secret).
    api_keys_file: Path | None = None
    #: Require an API key (False only on purpose: a closed network or a test).
    auth: bool = True
    #: Batch sizes compiled at start; requests are padded up to the next one.
    batch_sizes: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256])
    #: Most observations in one ``/v1/act/batch`` request.
    max_batch: int = Field(default=256, ge=1, le=65_536)
    #: How long the micro-batcher waits for requests still being read once one is ready
    #: (ms); a request that is alone never waits.
    max_wait_ms: float = Field(default=1.0, ge=0.0, le=100.0)
    #: Micro-batches of at most this many rows are decided on the event loop, larger ones
    #: on the policy thread. A small batch's call takes less than handing it to that
    #: thread and back, and than the two threads taking turns at Python's interpreter
    #: lock; a large one runs beside the event loop, which keeps reading requests. 0:
    #: every batch on the policy thread.
    loop_batch_rows: int = Field(default=64, ge=0, le=65_536)
    #: Largest request body in bytes.
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=256 * 1024 * 1024)
    #: Origins allowed by CORS; empty: CORS off.
    cors_origins: list[str] = Field(default_factory=list)
    #: The audit log of overrides (JSON Lines); None: no audit log.
    audit_log: Path | None = None
    #: fsync the audit log after every write.
    audit_fsync: bool = False
    #: Rotate the audit log before it passes this many bytes (0: never).
    audit_max_bytes: int = Field(default=100 * 1024 * 1024, ge=0, le=1 << 40)
    #: Rotated audit files kept (audit.jsonl.1 .. .N; older ones move to
    #: audit.jsonl.archive/, never deleted); 0: never rotate.
    audit_backups: int = Field(default=10, ge=0)
    #: Overrides of one key with the same constraints and shield flags within this many
    #: seconds are one full record and one aggregate record (count, times, digest of the
    #: rows); 0: every override in full.
    audit_window_s: float = Field(default=10.0, ge=0.0, le=3600.0)
    #: Full audit records per API key per second (burst: ten seconds' worth); past it,
    #: overrides are counted in aggregate records. 0: no limit (needs audit_window_s).
    audit_key_rate: float = Field(default=10.0, ge=0.0, le=1e6)
    #: Seconds a client has to send its request line and headers (``serve``).
    header_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    #: Seconds a client has to send a request's body once its headers are in, plus one
    #: second per ``body_min_rate`` bytes received (``serve``); then 408 and closed.
    body_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    #: Bytes per second a body must keep up, on average, past ``body_timeout_s`` (0: the
    #: body deadline is fixed) (``serve``).
    body_min_rate: float = Field(default=1024.0, ge=0.0, le=1e9)
    #: Seconds an idle keep-alive connection stays open (``serve``). Longer than clients
    #: keep theirs (httpx 5 s, aiohttp 15 s, proxies and load balancers 60 s): a server
    #: that closes an idle connection first races the client's next request on it, which
    #: then fails with a read error (idle connections are shed first at the cap anyway).
    keep_alive_s: float = Field(default=75.0, gt=0.0, le=3600.0)
    #: Most open connections (``serve``): past it, the slowest reader is shed; a 503 only
    #: when every connection is answering a request (``/healthz``, ``/readyz`` never). An
    #: open connection costs ~4 KiB, so the cap is set well above what slow clients open.
    max_connections: int = Field(default=1024, ge=1, le=65_536)
    #: Largest request line plus headers in bytes (``serve``).
    max_header_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    #: Once the policy is compiled, move everything alive to the garbage collector's
    #: permanent generation and collect less often: without it, full collections over
    #: JAX's objects put ~100 ms pauses into the latency tail. Process-wide, so the
    #: ``serve`` command turns it on; an app embedded in another process leaves it off.
    tune_gc: bool = False
    #: Pin the ``serve`` process (every thread of it) to this CPU, numbered as the
    #: operating system numbers them (``taskset``'s), one of those the process may use.
    #: The policy's compiled calls are tens of microseconds: on more than one core each
    #: waits on a thread woken on another core, which costs about as much as the call
    #: (on a 2-core host, pinned: about a quarter more requests per second at 1 and at 16
    #: connections, ``benchmarks.serving``). One event loop runs on one core anyway. None:
    #: not pinned; a host running several servers gives each its own.
    cpu: int | None = Field(default=None, ge=0, le=65_535)
    #: Ed25519 public key files (``keys generate``) whose signatures are trusted; every
    #: artifact served must be signed by one of them. Empty: ``keys/policy-signing.pub``
    #: in the working directory if there is one.
    trusted_keys: list[Path] = Field(default_factory=list)
    #: Serve unsigned policies too (development only): logged as a warning at start and
    #: every reload, and shown in ``/v1/policy``. Signed ones are still verified when
    #: keys are given.
    allow_unsigned: bool = False
    #: The safety engineer's own constraint spec: an artifact whose bundled spec enforces
    #: other limits is refused, and the server checks every action against this one.
    pinned_constraints: Path | None = None
    #: The task the policy must be exported for (a dataset card, e.g. a run's
    #: ``dataset.json``, or a task file): observation and action names in order, units,
    #: bounds. Required with ``pinned_constraints``.
    pinned_task: Path | None = None

    @field_validator("api_keys", mode="before")
    @classmethod
    def _parse_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except RecursionError:
                raise ValueError("JSON nested too deeply to read") from None
        return value

    @field_validator("batch_sizes")
    @classmethod
    def _sizes(cls, sizes: list[int]) -> list[int]:
        if not sizes or any(size < 1 for size in sizes):
            raise ValueError(f"expected positive batch sizes, got {sizes}")
        return sorted(set(sizes))

    @model_validator(mode="after")
    def _roles(self) -> ServerSettings:
        unknown = sorted(set(self.api_keys) - set(ROLES))
        if unknown:
            raise ValueError(f"api_keys: unknown role(s) {unknown}; expected {list(ROLES)}")
        return self

    def keys(self) -> dict[str, str]:
        """Every key with its role, from the settings and the secrets file.

        Raises:
            SettingsError: for an unreadable secrets file, an unknown role, an empty or
                repeated key, or no key at all while ``auth`` is on.
        """
        mapping: dict[str, list[str]] = {
            role: [key.get_secret_value() for key in keys] for role, keys in self.api_keys.items()
        }
        if self.api_keys_file is not None:
            path = self.api_keys_file
            try:
                loaded = read_yaml(path, what="API keys file") or {}
            except YamlError as error:
                raise SettingsError(f"api_keys_file {path}: cannot be read: {error}") from None
            if not isinstance(loaded, dict):
                raise SettingsError(f"api_keys_file {path}: expected a mapping of role to keys")
            for role, keys in loaded.items():
                if role not in ROLES:
                    raise SettingsError(
                        f"api_keys_file {path}: unknown role {role!r}; expected {list(ROLES)}"
                    )
                if isinstance(keys, str):
                    keys = [keys]
                mapping.setdefault(role, []).extend(str(key) for key in keys or [])
        roles: dict[str, str] = {}
        for role, keys in mapping.items():
            for key in keys:
                check_api_key(key, role)
                if key in roles:
                    raise SettingsError(f"api_keys: a key is listed twice ({roles[key]}, {role})")
                roles[key] = role
        if self.auth and not roles:
            raise SettingsError(
                "api_keys: no API key configured; set NEORL_SERVE_API_KEYS or "
                "NEORL_SERVE_API_KEYS_FILE, or NEORL_SERVE_AUTH=false to serve without keys"
            )
        return roles

    def trust(self) -> Any:
        """The :class:`~.policy.PolicyTrust` of these settings (keys and pins read).

        Raises:
            SettingsError: for a trusted key, pinned spec or task that cannot be read, or
                no trusted key while signatures are required.
        """
        from neorl_industrial.integration.deployment.policy import PolicyTrust

        return PolicyTrust.from_files(
            self.trusted_key_files(),
            self.pinned_constraints,
            self.pinned_task,
            allow_unsigned=self.allow_unsigned,
        )

    def trusted_key_files(self) -> list[Path]:
        """The named trusted keys, else ``keys/policy-signing.pub`` if it exists here."""
        if self.trusted_keys:
            return list(self.trusted_keys)
        return [DEFAULT_TRUSTED_KEY] if DEFAULT_TRUSTED_KEY.is_file() else []


def check_api_key(key: str, role: str) -> None:
    """Refuses a placeholder, short or low-entropy API key, saying how to make one.

    Raises:
        SettingsError: naming the role and what is wrong with the key (never the key).
    """
    how = f"generate one with: {_GENERATE}"
    lowered = key.lower()
    if any(marker in lowered for marker in _PLACEHOLDERS):
        raise SettingsError(f"api_keys: a key of role {role!r} is a placeholder; {how}")
    if len(key) < MIN_KEY_LENGTH:
        raise SettingsError(
            f"api_keys: a key of role {role!r} is shorter than {MIN_KEY_LENGTH} characters "
            f"({len(key)}); {how}"
        )
    bits = _estimated_bits(key)
    if bits < _MIN_KEY_BITS:
        raise SettingsError(
            f"api_keys: a key of role {role!r} is low-entropy (about {bits:.0f} bits: "
            f"repeats, keyboard walks, sequences or words; at least {_MIN_KEY_BITS:.0f} "
            f"expected); {how}"
        )


#: Words a key of this server is likely made of, and the most published passphrases:
#: zxcvbn counts them as one dictionary word each.
_CONTEXT_WORDS = (
    "correcthorsebatterystaple",
    "correct",
    "horse",
    "battery",
    "staple",
    "tr0ub4dor&3",
    "troubadour",
    "neorl",
    "industrial",
    "neorl-industrial",
    "neorl_industrial",
    "policy",
    "server",
    "serve",
    "admin",
    "apikey",
    "api-key",
    "api_key",
    "secret",
    "token",
)
#: What separates the words of a passphrase.
_SEPARATORS = re.compile(r"[-_ .,:;+/|]")
#: zxcvbn estimates passwords of at most this many characters.
_ZXCVBN_CHARS = 72
#: Strides of the sequences :func:`_sequence_bits` looks for (``abcd``: 1; ``a1b2c3``: 2).
_STRIDES = (1, 2, 3, 4)


def _estimated_bits(key: str) -> float:
    """A cautious estimate of a key's entropy in bits: the smallest of four.

    * zxcvbn's (Dropbox's estimator of guesses: dictionaries, keyboard walks, repeats,
      sequences, dates), with this server's words and the famous passphrases as its
      dictionary of the context; a key longer than it reads is estimated in pieces.
    * Sequences: :func:`_sequence_bits` (``0123456789abcdef1011...``, ``a1b2c3...``, the
      printable ASCII run), which zxcvbn counts only where the step is one.
    * and the two below.

    * Compression: a random key does not compress, while zlib finds every repeated
      substring (``"password" * 4``, ``"ab" * 20``); its compressed length, less zlib's
      fixed overhead, bounds what the key holds.
    * Composition: runs of four or more neighbouring keys or letters (``qwer``, ``1234``,
      either direction) count a few bits in all; runs of four or more lower-case letters
      (a capital first allowed) with the vowels of words (``thisismysecret``) count 2 bits
      a letter, as English does; every other character counts by the alphabet it draws
      from (lower, upper, digits, symbols).
    """
    lowered = key.lower()
    walked = [False] * len(key)
    for walk in _WALKS:
        for run in (walk, walk[::-1]):
            for start in range(len(run) - 3):
                piece = run[start : start + 4]
                for found in re.finditer(f"(?={re.escape(piece)})", lowered):
                    for i in range(found.start(), found.start() + 4):
                        walked[i] = True
    worded = [False] * len(key)
    # Words are typed in lower case or capitalized; a random key mixes cases.
    for found in re.finditer(r"[A-Z]?[a-z]{4,}|[A-Z]{5,}", key):
        letters = found.group().lower()
        if sum(c in "aeiouy" for c in letters) >= 0.3 * len(letters):
            for i in range(found.start(), found.end()):
                worded[i] = not walked[i]
    rest = "".join(c for c, w, v in zip(key, walked, worded, strict=True) if not (w or v))
    alphabet = sum(
        (
            any(c.islower() for c in rest) * 26,
            any(c.isupper() for c in rest) * 26,
            any(c.isdigit() for c in rest) * 10,
            any(not c.isalnum() for c in rest) * 33,
        )
    )
    composition = (
        len(rest) * (math.log2(alphabet) if alphabet else 0.0)
        + 2.0 * sum(worded)
        + 4.0 * math.sqrt(sum(walked))
    )
    # zlib adds ~11 bytes of header and checksum to any input.
    compressed = max(len(zlib.compress(key.encode(), 9)) - 11, 0) * 8.0
    cheap = min(composition, compressed, _sequence_bits(key))
    if cheap < _MIN_KEY_BITS:
        return cheap  # refused already: zxcvbn (tens of ms, seconds on long runs) not asked
    bits = min(cheap, _zxcvbn_bits(key))
    # A passphrase's separators hide its words from zxcvbn's dictionaries: the words
    # joined, and a few bits for each separator.
    joined = _SEPARATORS.sub("", key)
    if joined != key and joined:
        bits = min(bits, _zxcvbn_bits(joined) + 2.0 * (len(key) - len(joined)))
    return bits


def _zxcvbn_bits(key: str) -> float:
    """The bits of the patterns zxcvbn finds (its guesses for each word, walk, repeat,
    sequence or date), and of the characters between them by the key's alphabet: zxcvbn
    counts such characters as decimal digits, which would refuse a random hex key for a
    date-like run of digits in it. Summed over pieces of the length zxcvbn reads."""
    from zxcvbn import zxcvbn

    per_character = math.log2(max(_alphabet(key), 2))
    bits = 0.0
    for start in range(0, len(key), _ZXCVBN_CHARS):
        piece = key[start : start + _ZXCVBN_CHARS]
        for match in zxcvbn(piece, user_inputs=list(_CONTEXT_WORDS))["sequence"]:
            if match["pattern"] == "bruteforce":
                bits += len(match["token"]) * per_character
            else:
                bits += float(match["guesses_log10"]) * math.log2(10)
    return bits


def _alphabet(text: str) -> int:
    """The size of the alphabet ``text`` draws from: lower, upper, digits, symbols."""
    return sum(
        (
            any(c.islower() for c in text) * 26,
            any(c.isupper() for c in text) * 26,
            any(c.isdigit() for c in text) * 10,
            any(not c.isalnum() for c in text) * 33,
        )
    )


def _sequence_bits(key: str) -> float:
    """The bits a key holds beyond arithmetic sequences of its characters' code points.

    A character is predicted when, for some stride ``k`` of :data:`_STRIDES`, it continues
    the step of the two characters ``k`` and ``2k`` before it (``c[i] - c[i-k] ==
    c[i-k] - c[i-2k]``): runs (``abcdef``, ``0123``), interleaved runs (``a1b2c3``:
    stride 2) and a printable run. Counting (``0123456789abcdef``, ``101112...``, in base
    10 or 16) is found by :func:`_counting_spans`. A predicted character counts 2 bits
    where a run starts (which stride) and a quarter bit where it goes on, a counted one
    nothing (its span 16 bits: base and start), any other the bits of the key's alphabet;
    a random key loses a few percent of its characters to chance predictions.
    """
    counted, spans = _counting_spans(key)
    codes = [ord(c) for c in key]
    per_character = math.log2(max(_alphabet(key), 2))
    bits = 16.0 * spans
    previous = None  # the stride that predicted the character before
    for i, code in enumerate(codes):
        if counted[i]:
            previous = None
            continue
        strides = [
            k
            for k in _STRIDES
            if i >= 2 * k and code - codes[i - k] == codes[i - k] - codes[i - 2 * k]
        ]
        if previous in strides:
            bits += 0.25  # a run goes on: whether it stops here
        elif strides:
            bits += 2.0  # a run starts: which stride
            previous = strides[0]
        else:
            bits += per_character
            previous = None
    return bits


def _counting_spans(key: str) -> tuple[list[bool], int]:
    """Which characters belong to a run of at least three consecutive numbers written
    out in base 10 or 16 (``7891011``, ``0123456789abcdef10``), and how many runs."""
    lowered = key.lower()
    counted = [False] * len(key)
    spans = 0
    i = 0
    while i < len(key):
        best = i
        for base, digits in ((10, "0123456789"), (16, "0123456789abcdef")):
            for width in range(1, 5):
                text = lowered[i : i + width]
                if len(text) < width or any(c not in digits for c in text):
                    break
                number, end, count = int(text, base), i + width, 1
                while True:
                    number += 1
                    following = format(number, "x") if base == 16 else str(number)
                    if not lowered.startswith(following, end):
                        break
                    end += len(following)
                    count += 1
                if count >= 3 and end > best:
                    best = end
        if best > i:
            counted[i:best] = [True] * (best - i)
            spans += 1
            i = best
        else:
            i += 1
    return counted, spans
