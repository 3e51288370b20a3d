"""The upstream network layer (chatstream/network.py) against real loopback sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import httpcore
import httpx
import pytest

from chatstream import network, upstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def with_server(handler: Handler, test: Callable[[int], Awaitable[Any]]) -> Any:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:  # also when the test ends first: no socket left for the collector to find
            writer.close()

    async def main() -> Any:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        try:
            return await test(server.sockets[0].getsockname()[1])
        finally:
            server.close()

    return asyncio.run(main())


def test_a_large_body_read_slowly_arrives_whole_and_reading_resumes_after_a_pause():
    payload = os.urandom(3 * 1024 * 1024)  # well over the 256 KiB at which reading pauses

    async def send_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(payload)
        await writer.drain()
        writer.close()

    async def read_slowly(port: int) -> bytes:
        stream = await network.Backend().connect_tcp("127.0.0.1", port, timeout=5)
        got = bytearray()
        await asyncio.sleep(0.2)  # the sender fills our buffer past the high-water mark
        assert stream._protocol.paused  # type: ignore[attr-defined]
        while chunk := await stream.read(65536, timeout=5):
            got += chunk
        await stream.aclose()
        return bytes(got)

    assert with_server(send_all, read_slowly) == payload


def test_silence_is_a_read_timeout_and_a_reset_is_a_read_error():
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # with SO_LINGER 0: a reset, not an orderly close

    async def read(port: int) -> None:
        stream = await network.Backend().connect_tcp("127.0.0.1", port, timeout=5)
        with pytest.raises(httpcore.ReadTimeout):
            await stream.read(100, timeout=0.1)
        with pytest.raises(httpcore.ReadError):
            await stream.read(100, timeout=5)
        with pytest.raises(httpcore.WriteError):
            await stream.write(b"x", timeout=1)

    with_server(silent, read)


def test_a_refused_connection_is_a_connect_error():
    async def refused() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(httpcore.ConnectError):
            await network.Backend().connect_tcp("127.0.0.1", port, timeout=5)

    asyncio.run(refused())


def test_an_idle_connection_the_server_closed_is_not_reused():
    """httpcore asks ``is_readable`` of an idle connection before reusing it."""
    seen: list[int] = []

    async def answer_then_close(reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
        seen.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()  # keep-alive from the client's side, closed from the server's

    async def two_requests(port: int) -> list[str]:
        limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
        async with httpx.AsyncClient(transport=network.transport(limits)) as client:
            first = (await client.get(f"http://127.0.0.1:{port}/")).text
            await asyncio.sleep(0.3)
            second = (await client.get(f"http://127.0.0.1:{port}/")).text
        return [first, second]

    assert with_server(answer_then_close, two_requests) == ["ok", "ok"]
    assert len(seen) == 2


def test_the_upstream_client_uses_this_network_layer(settings):
    async def backend() -> Any:
        try:
            return upstream.get_client()._transport._pool._network_backend  # type: ignore[attr-defined]
        finally:
            await upstream.aclose_clients()

    assert isinstance(asyncio.run(backend()), network.Backend)
