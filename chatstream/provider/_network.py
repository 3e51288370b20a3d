"""The upstream connections' network layer: httpcore over plain asyncio protocols.

httpx reaches the network through httpcore, by default over anyio. On asyncio, anyio's socket
stream resumes the transport's reading before every read and pauses it after (two
``epoll_ctl`` system calls per chunk received) and runs each read in a cancel scope. A relay's
work is mostly reading small chunks, so that costs a busy worker dearly (bench/README.md has
the profile and the A/B against httpcore's own backend). This backend keeps each connection's
transport reading (pausing only when 256 KiB wait unread), buffers what arrives and wakes the
one reader. Writes are held until the
connection is next read (or 64 KiB wait): h11 writes a request's head and body separately, and
sent as they come they would be two system calls and two packets instead of one.

Only the network layer changes: httpcore still speaks HTTP and pools connections, and httpx
is the client. See :class:`Transport`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, cast

import aiohappyeyeballs
import httpcore
import httpx

_HIGH_WATER = 256 * 1024  # unread bytes at which the socket stops being read, until drained
_MAX_UNSENT = 64 * 1024  # bytes written but held back, at which they are sent at once
_HAPPY_EYEBALLS_DELAY = 0.25  # before the next address is tried alongside (RFC 8305's advice)


class Transport(httpx.AsyncBaseTransport):
    """httpx's transport over an httpcore connection pool that reaches the network through
    :class:`Backend`: what ``httpx.AsyncHTTPTransport`` does, with the network backend httpx
    does not take (httpcore's ``network_backend``). Public interfaces only, of both."""

    def __init__(self, limits: httpx.Limits) -> None:
        self.pool = httpcore.AsyncConnectionPool(
            ssl_context=_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=Backend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        sent = httpcore.Request(
            request.method,
            httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                         target=url.raw_path),
            headers=request.headers.raw, content=cast(AsyncIterable[bytes], request.stream),
            extensions=request.extensions)
        with _httpx_errors():
            answer = await self.pool.handle_async_request(sent)
        return httpx.Response(answer.status, headers=answer.headers,
                              stream=_Body(cast(AsyncIterable[bytes], answer.stream)),
                              extensions=answer.extensions)

    async def aclose(self) -> None:
        await self.pool.aclose()


class _Body(httpx.AsyncByteStream):
    """A response's body as httpx reads it, httpcore's errors as httpx's."""

    def __init__(self, stream: AsyncIterable[bytes]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _httpx_errors():
            async for part in self._stream:
                yield part

    async def aclose(self) -> None:
        close = getattr(self._stream, "aclose", None)
        if close is not None:
            await close()


# Each of httpcore's errors and the one of httpx's that has its name (both public).
_ERRORS: dict[type[Exception], type[httpx.HTTPError]] = {
    getattr(httpcore, name): getattr(httpx, name) for name in (
        "TimeoutException", "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout",
        "NetworkError", "ConnectError", "ReadError", "WriteError", "ProxyError",
        "UnsupportedProtocol", "ProtocolError", "LocalProtocolError", "RemoteProtocolError")}


@contextlib.contextmanager
def _httpx_errors() -> Iterator[None]:
    """httpcore's errors raised as httpx's, the nearest of each (as httpx's transport does)."""
    try:
        yield
    except tuple(_ERRORS) as exc:
        nearest = next(_ERRORS[kind] for kind in type(exc).__mro__ if kind in _ERRORS)
        raise nearest(str(exc)) from exc


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """httpx's default context (certifi's CAs), made once per process: loading the CA bundle
    takes tens of milliseconds, and every event loop (each async view of a WSGI site runs on
    one of its own) gets a pool."""
    return httpx.create_ssl_context(trust_env=False)


class _Protocol(asyncio.Protocol):
    """What a connection has received and not yet read, and whether it has ended."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ended = False
        self.error: BaseException | None = None
        self.reader: asyncio.Future[None] | None = None
        self.writer: asyncio.Future[None] | None = None  # set while writing is paused
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) >= _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = exc
        self._wake()
        if self.writer is not None and not self.writer.done():
            self.writer.set_result(None)

    def pause_writing(self) -> None:
        if self.writer is None or self.writer.done():
            self.writer = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.writer is not None and not self.writer.done():
            self.writer.set_result(None)

    def _wake(self) -> None:
        if self.reader is not None and not self.reader.done():
            self.reader.set_result(None)


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


class Stream(httpcore.AsyncNetworkStream):
    """One connection, as httpcore reads and writes it."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._unsent: list[bytes] = []
        self._unsent_size = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._unsent:
            await self._send(timeout)
        protocol = self._protocol
        if not protocol.buffer and not protocol.ended:
            loop = asyncio.get_running_loop()
            reader = protocol.reader = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _expire, reader)
            try:
                await reader
            except TimeoutError:
                raise httpcore.ReadTimeout("No data arrived within the read timeout.") from None
            finally:
                protocol.reader = None
                if timer is not None:
                    timer.cancel()
        if protocol.buffer:
            data = bytes(protocol.buffer[:max_bytes])
            del protocol.buffer[:max_bytes]
            if protocol.paused and len(protocol.buffer) < _HIGH_WATER // 4:
                protocol.paused = False
                self._transport.resume_reading()
            return data
        if protocol.error is not None:
            raise httpcore.ReadError(str(protocol.error) or type(protocol.error).__name__)
        return b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise httpcore.WriteError("The connection is closed.")
        self._unsent.append(buffer)
        self._unsent_size += len(buffer)
        if self._unsent_size >= _MAX_UNSENT:
            await self._send(timeout)

    async def _send(self, timeout: float | None) -> None:
        """Write what is held back, waiting (up to ``timeout``) while the peer does not read."""
        data = self._unsent[0] if len(self._unsent) == 1 else b"".join(self._unsent)
        self._unsent.clear()
        self._unsent_size = 0
        if self._transport.is_closing():
            raise httpcore.WriteError("The connection is closed.")
        self._transport.write(data)
        writer = self._protocol.writer
        if writer is not None and not writer.done():
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(writer)
            except TimeoutError:
                raise httpcore.WriteTimeout("The peer did not read within the timeout.") from None
        if self._protocol.error is not None:
            raise httpcore.WriteError(str(self._protocol.error))

    async def aclose(self) -> None:
        self._unsent.clear()
        self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        if self._unsent:
            await self._send(timeout)
        loop = asyncio.get_running_loop()
        try:
            upgraded = await loop.start_tls(
                self._transport, self._protocol, ssl_context, server_hostname=server_hostname,
                ssl_handshake_timeout=timeout)
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(str(exc)) from exc
        if upgraded is None:  # the peer closed during the handshake
            raise httpcore.ConnectError("The connection closed during the TLS handshake.")
        self._protocol.transport = upgraded
        return Stream(upgraded, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        if info == "is_readable":  # an idle connection with news has been closed, or is broken
            return bool(self._protocol.buffer) or self._protocol.ended
        return None


async def _addresses(loop: asyncio.AbstractEventLoop, host: str,
                     port: int) -> Sequence[aiohappyeyeballs.AddrInfoType]:
    """Where ``host`` may be reached: an IP address as it is (asyncio's ``getaddrinfo`` would
    ask a worker thread even for one), a name through the resolver."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return aiohappyeyeballs.addr_to_addr_infos((host, port)) or []


class Backend(httpcore.AsyncNetworkBackend):
    """Connections as asyncio transports with a :class:`_Protocol`."""

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        """Happy Eyeballs (RFC 8305) by aiohappyeyeballs, which asks of the loop only what
        every loop has (``getaddrinfo``, ``sock_connect``): uvloop's ``create_connection``, for
        one, takes no ``happy_eyeballs_delay``."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                local = await _addresses(loop, local_address, 0) if local_address else None
                sock = await aiohappyeyeballs.start_connection(
                    await _addresses(loop, host, port), local_addr_infos=local,
                    happy_eyeballs_delay=_HAPPY_EYEBALLS_DELAY, interleave=1)
                try:
                    transport, protocol = await loop.create_connection(_Protocol, sock=sock)
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"Could not connect within {timeout} s.") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return self._opened(transport, protocol, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None,
                                  ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_unix_connection(_Protocol, path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"Could not connect within {timeout} s.") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return self._opened(transport, protocol, socket_options)

    @staticmethod
    def _opened(transport: asyncio.BaseTransport, protocol: _Protocol,
                socket_options: Iterable[Any] | None) -> Stream:
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return Stream(transport, protocol)  # type: ignore[arg-type]

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
