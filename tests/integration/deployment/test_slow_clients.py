"""Slow and many clients against a real uvicorn server on a free port, real sockets, the
protocol ``serve`` runs (:func:`guarded_protocol`) with short deadlines from the settings.

Slow-header and slow-body attackers (no API key) are cut with a 408 and counted; a body
that keeps up the minimum rate is not; at the connection cap, attackers are shed so that
fresh clients and the probes are answered; only when every connection is answering a
request does a new one get a 503, counted by reason, while the probes still answer.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import threading
import time

import pytest
import uvicorn

from benchmarks.harness import free_port
from neorl_industrial.cli.serving import uvicorn_options
from neorl_industrial.integration.deployment import ServerMetrics, ServerSettings, create_app
from neorl_industrial.integration.deployment.middleware import (
    METRICS_STATE_KEY,
    guarded_protocol,
)
from tests.wrappers.agents.test_export import exported_policy

KEY = "t8Hq2vN3xK_pLw9ZbRc4YdJe6FgA1sMuVo0Ti5XnQkE"
DEADLINE_S = 0.5
CAP = 8
BODY = json.dumps({"observation": [50.0] * 6}).encode()


class _Served:
    """A uvicorn server in a thread, stopped on exit."""

    def __init__(self, app, **options) -> None:
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                **options)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Served:
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return exported_policy(tmp_path_factory.mktemp("policy") / "a")


def _serving(model, deadline_s: float) -> _Served:
    settings = ServerSettings(
        model=str(model),
        api_keys={"act": [KEY]},
        batch_sizes=[1, 2],
        max_batch=2,
        header_timeout_s=deadline_s,
        body_timeout_s=deadline_s,
        body_min_rate=1024.0,
        max_connections=CAP,
        allow_unsigned=True,  # the test's policy is not signed
    )
    return _Served(create_app(settings), **uvicorn_options(settings))


@pytest.fixture(scope="module")
def server(model):
    """The policy server as ``serve`` runs it: deadlines of 0.5 s, at most 8 connections."""
    with _serving(model, DEADLINE_S) as served:
        yield served.port


@pytest.fixture(scope="module")
def patient_server(model):
    """The same with deadlines of 30 s: at the cap, only shedding closes an attacker,
    however slow the machine running the test."""
    with _serving(model, 30.0) as served:
        yield served.port


def _metric(port: int, name: str, reason: str) -> float:
    text = _get(port, "/metrics")[1].decode()
    match = re.search(rf'^{name}_total{{reason="{reason}"}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name}_total{{reason={reason!r}}} not in /metrics"
    return float(match.group(1))


def _get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _act(port: int, body: bytes = BODY) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("POST", "/v1/act", body, {
            "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})  # fmt: skip
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _trickle(sock: socket.socket, chunk: bytes, every: float, limit: float) -> tuple[float, bytes]:
    """Sends ``chunk`` every ``every`` s until the server closes; (seconds, what it said)."""
    started = time.monotonic()
    answer = b""
    sock.settimeout(every)
    while time.monotonic() - started < limit:
        try:
            sock.sendall(chunk)
            data = sock.recv(4096)
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            break
        if not data:
            break
        answer += data
    return time.monotonic() - started, answer


def _slow_body_head(length: int) -> bytes:
    return (b"POST /v1/act HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % length)  # fmt: skip


def test_a_client_trickling_its_headers_gets_a_408_and_is_counted(server):
    before = _metric(server, "neorl_connections_cut", "header_timeout")
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        seconds, answer = _trickle(sock, b"X-Slow: a\r\n", 0.1, 5.0)
    assert seconds < 4 * DEADLINE_S
    assert answer.startswith(b"HTTP/1.1 408")
    assert _metric(server, "neorl_connections_cut", "header_timeout") == before + 1


def _requests(port: int, status: int) -> float:
    text = _get(port, "/metrics")[1].decode()
    pattern = rf'^neorl_requests_total{{route="/v1/act",status="{status}"}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_a_client_trickling_its_body_gets_a_408_and_is_counted(server):
    before = _metric(server, "neorl_connections_cut", "body_timeout")
    timed_out, gone = _requests(server, 408), _requests(server, 499)
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(_slow_body_head(1000))
        seconds, answer = _trickle(sock, b" ", 0.1, 5.0)
    assert seconds < 4 * DEADLINE_S
    assert answer.startswith(b"HTTP/1.1 408")
    assert _metric(server, "neorl_connections_cut", "body_timeout") == before + 1
    # The cut request is counted as what the server answered (408), not as the app's
    # answer nor as a client that went away (499).
    deadline = time.monotonic() + 5
    while _requests(server, 408) == timed_out and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _requests(server, 408) == timed_out + 1
    assert _requests(server, 499) == gone


def test_a_body_keeping_up_the_minimum_rate_is_not_cut(server):
    # 3,000 bytes at ~3 KiB/s (the minimum: 1 KiB/s) takes ~1 s, twice the body timeout.
    body = BODY + b" " * (3000 - len(BODY))
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(_slow_body_head(len(body)))
        for start in range(0, len(body), 300):
            sock.sendall(body[start : start + 300])
            time.sleep(0.1)
        sock.settimeout(10)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401")  # read in full and answered (no key sent)


def test_at_the_cap_slow_attackers_are_shed_and_fresh_clients_answered(patient_server):
    server = patient_server
    shed = _metric(server, "neorl_connections_cut", "shed")
    shed_requests, gone = _requests(server, 444), _requests(server, 499)
    attackers = []
    try:
        for _ in range(2 * CAP):  # twice the cap, no key, bodies a byte at a time
            sock = socket.create_connection(("127.0.0.1", server))
            sock.sendall(_slow_body_head(1000) + b"{")
            attackers.append(sock)
        time.sleep(0.05)
        for _ in range(5):
            assert _act(server)[0] == 200
            assert _get(server, "/readyz")[0] == 200
    finally:
        for sock in attackers:
            sock.close()
    cut = _metric(server, "neorl_connections_cut", "shed") - shed
    assert cut >= CAP
    assert _metric(server, "neorl_unavailable", "connection_limit") == 0
    # Shed requests count as such (444, closed without a response), not as 499; the
    # attackers closed by the test itself at the end are the clients that went away.
    deadline = time.monotonic() + 5
    while _requests(server, 444) - shed_requests < cut and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _requests(server, 444) - shed_requests == cut
    assert _requests(server, 499) - gone <= 2 * CAP - cut


def test_a_normal_client_and_a_keep_alive_second_request_are_served(server):
    connection = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    try:
        for _ in range(2):
            connection.request("GET", "/healthz")
            response = connection.getresponse()
            assert response.status == 200 and json.loads(response.read()) == {"status": "ok"}
            time.sleep(2 * DEADLINE_S)  # idle past the header deadline: keep-alive governs
        connection.sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next headers trickle
        seconds, answer = _trickle(connection.sock, b"X-Slow: a\r\n", 0.1, 5.0)
    finally:
        connection.close()
    assert seconds < 4 * DEADLINE_S and answer.startswith(b"HTTP/1.1 408")


# -- every connection answering a request: a 503 for the new one, the probes still answered


def _busy_app(metrics: ServerMetrics):
    """An ASGI app whose ``/work`` waits for ``release``; its lifespan hands the protocol
    the metrics, as :func:`create_app`'s does."""
    waiting: dict = {}

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            await receive()
            waiting["release"] = asyncio.Event()
            waiting["loop"] = asyncio.get_running_loop()
            scope["state"][METRICS_STATE_KEY] = metrics
            await send({"type": "lifespan.startup.complete"})
            await receive()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/work":
            await waiting["release"].wait()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})

    return app, waiting


def test_when_every_connection_is_answering_a_new_request_gets_a_counted_503():
    metrics = ServerMetrics()
    app, waiting = _busy_app(metrics)
    protocol = guarded_protocol(
        header_timeout_s=5.0, body_timeout_s=5.0, body_min_rate=1024.0, max_connections=2
    )
    with _Served(app, http=protocol) as served:
        busy = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(2)]
        try:
            for sock in busy:
                sock.sendall(b"GET /work HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.1)
            assert _get(served.port, "/other")[0] == 503
            assert _get(served.port, "/readyz")[0] == 200  # the probes are never refused
            assert _get(served.port, "/healthz")[0] == 200
        finally:
            waiting["loop"].call_soon_threadsafe(waiting["release"].set)
            for sock in busy:
                sock.settimeout(5)
                assert sock.recv(1024).startswith(b"HTTP/1.1 200")
                sock.close()
        assert _get(served.port, "/other")[0] == 200  # room again
    text = metrics.exposition()[0].decode()
    assert 'neorl_unavailable_total{reason="connection_limit"} 1.0' in text


def test_serve_takes_its_limits_from_the_settings():
    settings = ServerSettings(
        header_timeout_s=3.0,
        body_timeout_s=6.0,
        body_min_rate=512.0,
        keep_alive_s=4.0,
        max_connections=32,
        max_header_bytes=8192,
    )
    options = uvicorn_options(settings)
    protocol = options["http"]
    assert (protocol.header_timeout, protocol.body_timeout) == (3.0, 6.0)
    assert (protocol.min_rate, protocol.connection_cap) == (512.0, 32)
    assert options["timeout_keep_alive"] == 4.0
    assert "limit_concurrency" not in options  # uvicorn's would refuse the probes too
    assert options["h11_max_incomplete_event_size"] == 8192


@pytest.mark.parametrize(
    ("field", "value"),
    [("header_timeout_s", 0.0), ("body_timeout_s", -1.0), ("body_min_rate", -1.0),
     ("max_connections", 0), ("parser", "picohttp")],
)  # fmt: skip
def test_bad_limits_are_refused_naming_the_setting(field, value):
    limits = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "body_min_rate": 0.0,
              "max_connections": 1, field: value}  # fmt: skip
    with pytest.raises(ValueError, match=field):
        guarded_protocol(**limits)


def test_the_open_file_limit_is_raised_for_the_cap_or_the_cap_lowered(monkeypatch, caplog):
    import resource

    from neorl_industrial.cli import serving

    limits = {"soft": 1024, "hard": 4096}
    monkeypatch.setattr(resource, "getrlimit", lambda _: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(
        resource, "setrlimit", lambda _, pair: limits.update(soft=pair[0], hard=pair[1])
    )
    assert serving._fit_open_files(2048) == 2048  # raised to fit: 2048 + the reserve
    assert limits["soft"] == 2048 + serving._RESERVED_FILES
    limits.update(soft=512, hard=512)
    with caplog.at_level("WARNING", logger="neorl_industrial.serve"):
        assert serving._fit_open_files(1024) == 512 - serving._RESERVED_FILES
    assert "does not fit the open-file limit 512" in caplog.text


def test_idle_connections_outlive_the_clients_keep_alive():
    """A server that closes an idle kept-alive connection before the client stops reusing
    it races the client's next request on it (a read error on a good request): the
    default outlives the common clients' pools (httpx keeps its idle ones 5 s)."""
    import httpx

    settings = ServerSettings()
    assert settings.keep_alive_s > 2 * httpx.Limits().keepalive_expiry
    assert uvicorn_options(settings)["timeout_keep_alive"] == settings.keep_alive_s


def test_headers_past_the_limit_get_a_431_and_the_connection_closed(server):
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.settimeout(10)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Big: a\r\n" * 3000)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431")


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_either_parser_cuts_a_slow_body_and_answers_a_fresh_client(parser):
    """The deadlines and counters are the same on httptools (``serve``'s) and h11."""
    metrics = ServerMetrics()
    app, _ = _busy_app(metrics)
    protocol = guarded_protocol(
        header_timeout_s=DEADLINE_S, body_timeout_s=DEADLINE_S, body_min_rate=1024.0,
        max_connections=CAP, parser=parser,
    )  # fmt: skip
    with _Served(app, http=protocol) as served:
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            sock.sendall(_slow_body_head(1000))
            seconds, answer = _trickle(sock, b" ", 0.1, 5.0)
        # (This app answers before it reads the body; the trickling body is cut still.)
        assert seconds < 4 * DEADLINE_S and b"HTTP/1.1 408" in answer
        assert _get(served.port, "/other")[0] == 200
    text = metrics.exposition()[0].decode()
    assert 'neorl_connections_cut_total{reason="body_timeout"} 1.0' in text
