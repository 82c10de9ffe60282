"""Slow clients against a real uvicorn server: a client trickling its headers is
disconnected after the header timeout; ``serve`` takes its limits from the settings."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from benchmarks.harness import free_port
from neorl_industrial.cli.serving import uvicorn_options
from neorl_industrial.integration.deployment import ServerSettings
from neorl_industrial.integration.deployment.middleware import header_timeout_protocol


async def _hello(scope, receive, send):
    if scope["type"] != "http":
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server():
    port = free_port()
    config = uvicorn.Config(
        _hello, host="127.0.0.1", port=port, log_level="warning",
        http=header_timeout_protocol(0.5), timeout_keep_alive=5,
    )  # fmt: skip
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not instance.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield port
    instance.should_exit = True
    thread.join(10)


def _closed_after(sock: socket.socket, limit: float) -> float | None:
    """Seconds until the server closed ``sock`` while bytes trickle in, or None."""
    started = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - started < limit:
        try:
            sock.sendall(b"X-Slow: a\r\n")
            if sock.recv(1024) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started
    return None


def test_a_client_trickling_its_headers_is_disconnected(server):
    with socket.create_connection(("127.0.0.1", server)) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        closed = _closed_after(sock, 5.0)
    assert closed is not None and closed < 2.0


def test_a_normal_client_and_a_keep_alive_second_request_are_served(server):
    with socket.create_connection(("127.0.0.1", server)) as sock:
        for _ in range(2):
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"ok"):
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
            time.sleep(0.7)  # idle longer than the header timeout: keep-alive governs
        # The next request's headers trickle: the deadline applies again.
        sock.sendall(b"GET / HTTP/1.1\r\n")
        assert _closed_after(sock, 5.0) is not None


def test_serve_takes_its_limits_from_the_settings():
    settings = ServerSettings(
        header_timeout_s=3.0, keep_alive_s=4.0, max_connections=32, max_header_bytes=8192
    )
    options = uvicorn_options(settings)
    assert options["http"].header_timeout == 3.0
    assert options["timeout_keep_alive"] == 4.0
    assert options["limit_concurrency"] == 32
    assert options["h11_max_incomplete_event_size"] == 8192
