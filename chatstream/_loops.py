"""What chatstream keeps per event loop: :class:`PerLoop`, and closing it with its loop; and
:func:`in_executor`, how sync database work runs from a loop.

Everything a stream shares with the other streams of its process (the upstream connection
pool, the PostgreSQL pool, the checkpoint writer, the Stop listener) belongs to one event loop:
an asyncio object used from another loop fails. A process can run several loops, one after
another or at once (a WSGI site runs each async view on a loop of its own; tests do too), so
each is kept per loop, weakly, and made on first use.

An event loop has no close hook, but every runner that ends a loop properly (``asyncio.run``,
asgiref's ``async_to_sync``, uvicorn, Django's test client) first calls
``loop.shutdown_asyncgens()``, which closes each async generator the loop has seen. A generator
suspended in ``try: yield`` with the closing in its ``finally`` is therefore called at shutdown
(:func:`close_at_shutdown`). Without it, a loop that ends with idle keep-alive connections
leaves their sockets open until the garbage collector finds them.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Generic, TypeVar

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections

T = TypeVar("T")

# The loop holds its async generators weakly: they are held here, per loop.
_held: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[AsyncGenerator[None, None]]] = (
    weakref.WeakKeyDictionary())


class PerLoop(Generic[T]):
    """One ``T`` per running event loop, made by ``make()`` the first time that loop asks.

    With ``close``, get it with :meth:`aget`: ``close(value)`` is awaited when the loop shuts
    down.
    """

    def __init__(self, make: Callable[[], T],
                 close: Callable[[T], Awaitable[object]] | None = None) -> None:
        self._make = make
        self._close = close
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary())

    def get(self) -> T:
        """The running loop's value (made now if it has none)."""
        assert self._close is None, "a value closed with its loop is made by aget()"
        loop = asyncio.get_running_loop()
        try:
            return self._values[loop]
        except KeyError:
            value = self._values[loop] = self._make()
            return value

    async def aget(self) -> T:
        """The running loop's value; a new one is closed when the loop shuts down."""
        loop = asyncio.get_running_loop()
        try:
            return self._values[loop]
        except KeyError:
            value = self._values[loop] = self._make()
        if self._close is not None:
            await close_at_shutdown(self._closer(loop, value))
        return value

    def peek(self) -> T | None:
        """The running loop's value, or None if it has none yet."""
        return self._values.get(asyncio.get_running_loop())

    def set(self, value: T) -> T:
        """Make ``value`` the running loop's (it is not closed with the loop)."""
        self._values[asyncio.get_running_loop()] = value
        return value

    def pop(self) -> T | None:
        """Forget the running loop's value (a new one is made next time) and return it."""
        return self._values.pop(asyncio.get_running_loop(), None)

    def items(self) -> list[tuple[asyncio.AbstractEventLoop, T]]:
        """Every loop that has a value, with it (for tests and shutdown code)."""
        return list(self._values.items())

    def _closer(self, loop: asyncio.AbstractEventLoop, value: T
                ) -> Callable[[], Awaitable[object]]:
        async def close() -> None:
            if self._values.get(loop) is value:
                del self._values[loop]
            assert self._close is not None
            await self._close(value)

        return close


async def close_at_shutdown(close: Callable[[], Awaitable[object]]) -> None:
    """Await ``close()`` when the running loop shuts down."""
    closer = _closer(close)
    await closer.__anext__()  # now suspended at its yield, and known to the loop
    _held.setdefault(asyncio.get_running_loop(), []).append(closer)


async def _closer(close: Callable[[], Awaitable[object]]) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await close()


def in_executor(func: Callable[..., T]) -> Callable[..., Any]:
    """``func`` as a coroutine function run on the shared executor (``thread_sensitive=False``:
    work never queues behind other work on one thread), its database connections handled as a
    request's are (closed after it when ``CONN_MAX_AGE`` is 0, health-checked when kept), but
    for SQLite's, which the thread keeps (:func:`_keep_sqlite`)."""

    def call(*args: Any, **kwargs: Any) -> T:
        close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            _keep_sqlite()
            close_old_connections()

    return sync_to_async(call, thread_sensitive=False)


def _keep_sqlite() -> None:
    """Keep this thread's SQLite connections open for its next work, whatever ``CONN_MAX_AGE``
    says, and close each when the thread ends.

    Opening one (the file, then the ``init_command``'s PRAGMAs) costs more than a stream's
    start reads from it, and a kept one holds a file, not a server's slot. Django cannot keep a
    request's own connections this way under ASGI, as each request has a thread of its own that
    then leaves its connection to the garbage collector; the executor's threads live as long as
    their loop, and a connection kept here is closed with its thread (when Django's wrapper,
    which the thread's locals hold, is collected). A connection left in a transaction or made
    unusable is still closed after the call; the next one the thread opens is kept instead.
    """
    for connection in connections.all(initialized_only=True):
        if connection.vendor == "sqlite" and connection.connection is not None:
            connection.close_at = None
            held = _kept.get(connection)
            if held is None:  # one finalizer per wrapper, however often it reconnects
                held = _kept[connection] = []
                weakref.finalize(connection, _close_held, held)
            # Also when CONN_MAX_AGE keeps it, which Django leaves to the garbage collector.
            held[:] = [connection.connection]


# Each wrapper's kept SQLite connection, in a list its finalizer closes.
_kept: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _close_held(held: list[Any]) -> None:
    for raw in held:
        raw.close()
