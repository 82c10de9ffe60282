"""A response's status line and headers leave with its body, in one socket write."""

from __future__ import annotations

import asyncio

from neorl_industrial.integration.deployment.middleware import _OneWrite

HEADERS = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n"


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def _run(scenario):
    async def main():
        transport = _Transport()
        await scenario(_OneWrite(transport, asyncio.get_running_loop()), transport)
        return transport

    return asyncio.run(main())


def test_headers_wait_for_the_body_and_leave_with_it():
    async def scenario(one, transport):
        one.write(HEADERS)
        assert transport.writes == []
        one.write(b"{}")
        assert transport.writes == [HEADERS + b"{}"]
        one.write(b"more")  # anything after the headers' write goes as it is
        await asyncio.sleep(0)  # the fallback flush finds nothing held
        assert transport.writes == [HEADERS + b"{}", b"more"]

    _run(scenario)


def test_headers_without_a_body_leave_at_the_next_turn_or_on_close():
    async def scenario(one, transport):
        one.write(HEADERS)
        await asyncio.sleep(0)
        assert transport.writes == [HEADERS]
        one.write(HEADERS)
        one.close()
        assert transport.writes == [HEADERS, HEADERS] and transport.closed
        assert one.get_extra_info("peername") == "info:peername"

    _run(scenario)


def test_held_headers_are_dropped_once_the_connection_is_closing():
    async def scenario(one, transport):
        one.write(HEADERS)
        transport.closed = True  # cut by a deadline: nothing more goes out
        await asyncio.sleep(0)
        assert transport.writes == []

    _run(scenario)
