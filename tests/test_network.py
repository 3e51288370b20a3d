"""The upstream network layer (chatstream/_network.py) against real loopback sockets."""

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

from chatstream.provider import _network

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
        stream = await _network.Backend().connect_tcp("127.0.0.1", port, timeout=5)
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
        stream = await _network.Backend().connect_tcp("127.0.0.1", port, timeout=5)
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
            await _network.Backend().connect_tcp("127.0.0.1", port, timeout=5)

    asyncio.run(refused())


def test_the_transport_raises_httpx_errors_for_httpcore_ones():
    """What the stream engine catches are httpx's errors: the transport turns httpcore's into
    the nearest of them, before the response and while its body is read."""
    async def head_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                                ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await asyncio.sleep(1)

    async def call(port: int) -> None:
        limits = httpx.Limits(max_connections=2)
        async with httpx.AsyncClient(transport=_network.Transport(limits)) as client:
            async with client.stream("GET", f"http://127.0.0.1:{port}/",
                                     timeout=httpx.Timeout(5, read=0.2)) as response:
                assert response.status_code == 200
                with pytest.raises(httpx.ReadTimeout) as late:
                    await response.aread()
                assert isinstance(late.value.__cause__, httpcore.ReadTimeout)
            server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            closed = server.sockets[0].getsockname()[1]
            server.close()
            await server.wait_closed()
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{closed}/")

    with_server(head_then_silence, call)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"], ids=["by-name", "by-address"])
def test_a_provider_is_reached_by_name_and_by_address_from_a_given_local_address(host):
    """A name goes through the loop's resolver, an address is used as it is; either way the
    connection leaves from ``local_address`` when one is given."""
    async def echo_peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(repr(writer.get_extra_info("peername")[0]).encode())
        await writer.drain()

    async def connect(port: int) -> tuple[bytes, bytes]:
        answers = []
        for local in (None, "127.0.0.2"):
            stream = await _network.Backend().connect_tcp(host, port, timeout=5,
                                                          local_address=local)
            answers.append(await stream.read(100, timeout=5))
            await stream.aclose()
        return answers[0], answers[1]

    assert with_server(echo_peer, connect) == (b"'127.0.0.1'", b"'127.0.0.2'")


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
        async with httpx.AsyncClient(transport=_network.Transport(limits)) as client:
            first = (await client.get(f"http://127.0.0.1:{port}/")).text
            await asyncio.sleep(0.3)
            second = (await client.get(f"http://127.0.0.1:{port}/")).text
        return [first, second]

    assert with_server(answer_then_close, two_requests) == ["ok", "ok"]
    assert len(seen) == 2


def test_https_through_tls_on_the_same_connection(tmp_path):
    """Providers are reached over HTTPS: httpcore upgrades the connection with start_tls."""
    import datetime
    import ipaddress
    import ssl

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert_file, key_file)
    client_side = ssl.create_default_context(cafile=str(cert_file))
    events = b"".join(f"data: {i}\n\n".encode() for i in range(50))

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for start in range(0, len(events), 97):  # chunks that split events
            piece = events[start:start + 97]
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.001)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main() -> tuple[bytes, bool]:
        server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_side)
        port = server.sockets[0].getsockname()[1]
        try:
            async with httpcore.AsyncConnectionPool(ssl_context=client_side,
                                                    network_backend=_network.Backend()) as pool:
                async with pool.stream("GET", f"https://localhost:{port}/") as response:
                    body = b"".join([chunk async for chunk in response.aiter_stream()])
                    encrypted = response.extensions["network_stream"].get_extra_info(
                        "ssl_object") is not None
            return body, encrypted
        finally:
            server.close()

    assert asyncio.run(main()) == (events, True)


class CountingWrites:
    """A transport that notes the size of each write (uvloop's transports can't be patched)."""

    def __init__(self, transport: asyncio.Transport, sizes: list[int]) -> None:
        self._transport = transport
        self._sizes = sizes

    def write(self, data: bytes) -> None:
        self._sizes.append(len(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def test_a_request_goes_out_in_one_write_and_a_streamed_body_in_large_ones():
    """h11 writes a request's head and its body (each piece of it) separately; held until
    the response is read, or until 64 KiB wait, they leave in as few system calls."""
    import hashlib

    piece = os.urandom(8 * 1024)
    pieces = 1024  # 8 MiB
    writes: list[int] = []
    received: list[tuple[bytes, str]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            received.append((head, hashlib.sha256(body).hexdigest()))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async def trace(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":  # count what reaches the socket
            stream = info["return_value"]
            stream._transport = CountingWrites(stream._transport, writes)

    async def body() -> Any:
        for _ in range(pieces):
            yield piece

    async def two_requests(port: int) -> list[int]:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(transport=_network.Transport(limits)) as client:
            url = f"http://127.0.0.1:{port}/"
            small = await client.post(url, content=b'{"a": 1}', extensions={"trace": trace})
            assert small.text == "ok"
            first = len(writes)
            large = await client.post(url, content=body(), extensions={"trace": trace},
                                      headers={"Content-Length": str(len(piece) * pieces)})
            assert large.text == "ok"
        return writes[first:]

    large_writes = with_server(answer, two_requests)
    assert len(writes) - len(large_writes) == 1  # head and body of the small request: one write
    assert received[0][0].startswith(b"POST / HTTP/1.1\r\n")
    assert received[1][1] == hashlib.sha256(piece * pieces).hexdigest()
    assert all(size >= 64 * 1024 for size in large_writes[:-1]), large_writes
    assert max(large_writes) < 64 * 1024 + len(piece) + 1024  # held back: 64 KiB at most
    assert len(large_writes) <= pieces * len(piece) // (64 * 1024) + 1
