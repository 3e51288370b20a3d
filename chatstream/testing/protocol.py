"""A minimal HTTP/1.1 server connection as an :class:`asyncio.Protocol`.

Just enough HTTP for OpenAI clients: keep-alive, pipelined requests answered in order,
``Content-Length`` request bodies (``Expect: 100-continue`` honoured), fixed-length and chunked
responses, and write flow control. A Protocol rather than streams because ``connection_lost``
tells us the client went away the moment it happens, even while a response is paused; the
request's task is then cancelled so nothing more is written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

logger = logging.getLogger("chatstream.testing")

MAX_HEAD = 64 * 1024
MAX_BODY = 32 * 1024 * 1024


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


Handler = Callable[["Connection", Request], Coroutine[Any, Any, None]]


class Connection(asyncio.Protocol):
    """One client connection; ``handler`` runs once per request, in order."""

    def __init__(self, handler: Handler, registry: set[Connection], number: int) -> None:
        self.handler = handler
        self.registry = registry
        self.number = number
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.closed_at: float | None = None
        self.on_close: Callable[[float], None] | None = None
        # Told when the connection is closed, by either side, at any time (not only mid-answer).
        self.on_lost: Callable[[float], None] | None = None
        self.keep_alive = True
        self.chunked = True  # HTTP/1.0 clients get a close-delimited body instead
        self._head: tuple[str, str, str, dict[str, str], int] | None = None
        self._continued = False
        self._paused = False
        self._drained: asyncio.Future[None] | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.registry.add(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.task is None:
            self._next_request()
        elif len(self.buffer) > MAX_HEAD + MAX_BODY:
            self.abort()  # a client flooding us while its response streams

    def eof_received(self) -> bool:
        self._lost()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()
        self.registry.discard(self)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # Writing

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's buffer is over its high-water mark."""
        if self._paused and not self.closed:
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    def write_head(self, status: int, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {_phrase(status)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if not self.keep_alive:
            lines.append("connection: close")
        self.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def respond(self, status: int, headers: dict[str, str], body: bytes) -> None:
        """A whole response with ``Content-Length``."""
        self.write_head(status, {**headers, "content-length": str(len(body))})
        self.write(body)

    def start_stream(self, status: int, headers: dict[str, str]) -> None:
        """Headers of a body of unknown length: chunked, or for HTTP/1.0 ended by closing."""
        if self.chunked:
            headers = {**headers, "transfer-encoding": "chunked"}
        else:
            self.keep_alive = False
        self.write_head(status, headers)

    def write_chunk(self, data: bytes) -> None:
        self.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)

    def end_stream(self) -> None:
        if self.chunked:
            self.write(b"0\r\n\r\n")

    def close(self) -> None:
        """Close after flushing what was written (the client sees EOF, mid body if unfinished)."""
        self.keep_alive = False
        self.on_close = None  # our close, not the client's
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        self.on_close = None
        if self.transport is not None:
            self.transport.abort()

    # Requests

    def _lost(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.closed_at = time.monotonic()
        if self.on_close is not None:
            self.on_close(self.closed_at)
        if self.on_lost is not None:
            self.on_lost(self.closed_at)
        if self.task is not None:
            self.task.cancel()
        if self._drained is not None and not self._drained.done():
            self._drained.cancel()

    def _next_request(self) -> None:
        if self.closed:
            return
        if self._head is None:
            while self.buffer[:2] == b"\r\n":  # RFC 9112 §2.2: ignore empty lines before a request
                del self.buffer[:2]
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self._reject(431)
                return
            try:
                self._head = _parse_head(bytes(self.buffer[:end]).decode("latin-1"))
            except (ValueError, UnicodeError):
                self._reject(400)
                return
            del self.buffer[: end + 4]
            method, target, version, headers, length = self._head
            if "transfer-encoding" in headers:
                self._reject(411)  # chunked request bodies: no OpenAI client sends them
                return
            if length > MAX_BODY:
                self._reject(413)
                return
        method, target, version, headers, length = self._head
        if len(self.buffer) < length:
            if not self._continued and headers.get("expect", "").lower() == "100-continue":
                self._continued = True
                self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            return
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        self._head = None
        self._continued = False
        connection = headers.get("connection", "").lower()
        keep_alive = "close" not in connection and (
            version == "HTTP/1.1" or "keep-alive" in connection
        )
        self.keep_alive = keep_alive
        self.chunked = version == "HTTP/1.1"
        url = urlsplit(target)
        request = Request(method, url.path, url.query, headers, body, keep_alive)
        self.task = asyncio.get_running_loop().create_task(self.handler(self, request))
        self.task.add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task[None]) -> None:
        self.task = None
        self.on_close = None
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.error("Simulator handler failed", exc_info=exc)
            self.abort()
            return
        if self.closed:
            return
        if not self.keep_alive:
            self.close()
        elif self.buffer:
            self._next_request()

    def _reject(self, status: int) -> None:
        self.keep_alive = False
        self.respond(status, {"content-type": "text/plain"}, _phrase(status).encode())
        self.close()


def _parse_head(head: str) -> tuple[str, str, str, dict[str, str], int]:
    request_line, *lines = head.split("\r\n")
    method, target, version = request_line.split(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(version)
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if not name:
            raise ValueError(line)
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    length = int(headers.get("content-length", "0"))
    if length < 0:
        raise ValueError(length)
    return method, target, version, headers, length


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"
