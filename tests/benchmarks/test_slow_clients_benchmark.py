"""The slow-client benchmark's pieces: what each attacker sends, and the counters it reads
back from a server's ``/metrics``."""

from __future__ import annotations

import http.server
import threading

import pytest

from benchmarks.slow_clients import _opening, scrape
from neorl_industrial.integration.deployment import ServerMetrics


def test_each_attack_opens_an_incomplete_request_and_trickles_one_byte():
    header, byte = _opening("slow_header")
    assert header.startswith(b"POST /v1/act HTTP/1.1\r\n") and b"\r\n\r\n" not in header
    body, byte_b = _opening("slow_body")
    assert b"Content-Length: 100000\r\n\r\n" in body and b"Authorization" not in body
    assert len(byte) == len(byte_b) == 1
    with pytest.raises(ValueError, match="slow_header"):
        _opening("fast")


def test_scrape_reads_the_cut_and_503_counters():
    metrics = ServerMetrics()
    metrics.connection_cut("shed")
    metrics.connection_cut("shed")
    metrics.unavailable("connection_limit")
    metrics.request("/v1/act", 503, 0.0)
    metrics.request("/readyz", 503, 0.0)
    metrics.request("/v1/act", 200, 0.0)
    body, content_type = metrics.exposition()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        found = scrape(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert found["connections_cut:shed"] == 2.0
    assert found["connections_cut:body_timeout"] == 0.0  # every reason exported from the start
    assert found["unavailable:connection_limit"] == 1.0
    assert found["requests_503"] == 2.0
