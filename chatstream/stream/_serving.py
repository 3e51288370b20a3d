"""Whether this server can stream replies, found out at its first stream.

ASGI servers run no system checks, so what a deployment gets wrong about its server shows
nowhere until replies fail. Two things are checked where a stream starts:

- **WSGI.** An async stream under WSGI is buffered to its end, and a browser that leaves is
  never noticed: such a site needs an ASGI server.
- **The event loop.** The first stream on each kind of event loop opens one connection over
  loopback through the upstream network layer (the same calls a provider's request makes:
  address lookup, connect, write, read, close) and, when PostgreSQL serves the streams, asks
  the loop to watch a socket as psycopg does. A loop that cannot is named in the log.

What is found is logged once per process, with what to do, and every reply the server cannot
serve is answered with an honest error (see ``_outcomes.unsupported_server``),
never started and left broken.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import httpcore
from django.db import connections

from .._loops import PerLoop
from ..provider import Backend

logger = logging.getLogger("chatstream.serving")

_ADVICE = (
    "Serve the site with an ASGI server chatstream is tested under: uvicorn (with uvloop or "
    "asyncio's loop), gunicorn with uvicorn-worker's UvicornWorker, hypercorn, daphne, or "
    "`manage.py runserver` with daphne in INSTALLED_APPS (see the README, \"Supported versions "
    "and servers\")."
)
WSGI = "the site is served over WSGI, which buffers a stream to its end"

# The verdict on each kind of event loop this process has streamed on: None when it serves.
_verdicts: dict[type[asyncio.AbstractEventLoop], str | None] = {}
# The check under way on a loop: the streams that arrive meanwhile (a burst after a deploy)
# wait for it rather than each opening sockets of its own.
_checking: PerLoop[asyncio.Task[str | None]] = PerLoop(
    lambda: asyncio.get_running_loop().create_task(_try_loop()))
_told: set[str] = set()


async def problem(*, wsgi: bool = False) -> str | None:
    """Why this server cannot stream replies, or None when it can (the common case: one dict
    lookup once the running loop's kind has been tried)."""
    if wsgi:
        found: str | None = WSGI
    else:
        loop = asyncio.get_running_loop()
        if type(loop) not in _verdicts:
            # Shielded: a stream that goes away does not cancel the others' check.
            _verdicts[type(loop)] = await asyncio.shield(_checking.get())
            _checking.pop()
        found = _verdicts[type(loop)]
    if found is not None and found not in _told:
        _told.add(found)
        logger.error("chatstream cannot stream replies here: %s. Every reply is answered with "
                     "an error until this is fixed. %s", found, _ADVICE)
    return found


async def _try_loop() -> str | None:
    loop = asyncio.get_running_loop()
    name = f"{type(loop).__module__}.{type(loop).__qualname__}"
    try:
        async with asyncio.timeout(5):
            await _round_trip()
        if _postgresql_in_use():
            _watch_a_socket(loop)
    except (OSError, TimeoutError, httpcore.NetworkError, httpcore.TimeoutException):
        # Loopback itself refused or stalled: nothing learnt about the loop.
        logger.debug("The event loop check could not run", exc_info=True)
        return None
    except Exception as error:
        return f"its event loop ({name}) lacks what chatstream uses: {error!r}"
    return None


async def _round_trip() -> None:
    """A connection to a loopback listener through the network layer, both ways."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        host, port = listener.getsockname()[:2]
        stream = await Backend().connect_tcp(host, port, timeout=5)
        try:
            accepted, _address = listener.accept()  # connected already: returns at once
            with accepted:
                accepted.settimeout(5)
                accepted.sendall(b"pong")
                await stream.write(b"ping")  # sent by the next read (see network.Stream)
                if await stream.read(4, timeout=5) != b"pong" or accepted.recv(4) != b"ping":
                    raise RuntimeError("a loopback connection carried the wrong bytes")
        finally:
            await stream.aclose()


def _postgresql_in_use() -> bool:
    return any(connections[alias].vendor == "postgresql" for alias in connections)


def _watch_a_socket(loop: asyncio.AbstractEventLoop) -> None:
    """What psycopg's async connections ask of a loop (a Windows proactor loop says no)."""
    left, right = socket.socketpair()
    with left, right:
        loop.add_reader(left.fileno(), lambda: None)
        loop.remove_reader(left.fileno())
        loop.add_writer(left.fileno(), lambda: None)
        loop.remove_writer(left.fileno())
