"""A pool of async PostgreSQL connections for one event loop, with no task of its own.

A connection is made by the task that needs one, when none is idle and the pool is not full;
otherwise that task waits for one to come back. Nothing runs in the background, so whatever a
loop runner does at shutdown (asyncio.run, asgiref and uvicorn cancel every task, then close the
loop's async generators) the pool can't keep the loop from ending. psycopg_pool's
``AsyncConnectionPool`` makes connections in worker tasks that catch a cancellation arriving
mid-connect and try again later, so a loop that ended while one was being made waited for it
forever.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any


class PoolClosed(RuntimeError):
    """The pool was closed (its event loop is shutting down)."""


class Pool:
    """At most ``max_size`` connections made by ``connect()``; idle ones are closed after
    ``max_idle`` seconds. A connection that comes back in any state but idle (broken, closed,
    left in a transaction by a cancelled statement) is closed, not reused."""

    def __init__(self, connect: Callable[[], Awaitable[Any]], max_size: int,
                 max_idle: float = 600.0) -> None:
        self._connect = connect
        self.max_size = max_size
        self.max_idle = max_idle
        self.closed = False
        self._size = 0  # connections idle, lent, or being made
        # One connection is made at a time (a burst of tasks waits for the first to come
        # back rather than opening max_size server processes at once, each costing the
        # server a fork and its CPU while the burst needs it).
        self._connecting = False
        self._idle: collections.deque[tuple[float, Any]] = collections.deque()  # oldest first
        self._waiters: collections.deque[asyncio.Future[Any]] = collections.deque()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection for the body of the ``async with``; it goes back to the pool after."""
        connection = await self._take()
        try:
            yield connection
        finally:
            await self._give_back(connection)

    async def close(self) -> None:
        """Close the idle connections now, and every lent one when it comes back."""
        self.closed = True
        while self._idle:
            await self._discard(self._idle.popleft()[1])
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(PoolClosed())

    async def _take(self) -> Any:
        loop = asyncio.get_running_loop()
        while True:
            if self.closed:
                raise PoolClosed()
            while self._idle and loop.time() - self._idle[0][0] > self.max_idle:
                await self._discard(self._idle.popleft()[1])
            if self._idle:
                return self._idle.pop()[1]  # the most recently used: the likeliest to be warm
            if self._size < self.max_size and not self._connecting:
                self._size += 1
                self._connecting = True
                try:
                    return await self._connect()
                except BaseException:
                    self._size -= 1
                    raise
                finally:
                    self._connecting = False
                    if self._size < self.max_size:
                        self._wake_one(None)  # a waiting task may make the next one
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                connection = await waiter
            except asyncio.CancelledError:
                # Cancelled just after being handed a connection or a place: pass it on.
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    if waiter.result() is None:
                        self._wake_one(None)
                    else:
                        await self._give_back(waiter.result())
                raise
            if connection is not None:
                return connection
            # None: a connection may be made (one was discarded, or one was made): go round.

    async def _give_back(self, connection: Any) -> None:
        from psycopg.pq import TransactionStatus

        if self.closed or connection.info.transaction_status != TransactionStatus.IDLE:
            await self._discard(connection)
        elif not self._wake_one(connection):
            self._idle.append((asyncio.get_running_loop().time(), connection))

    async def _discard(self, connection: Any) -> None:
        self._size -= 1
        await connection.close()  # psycopg's close doesn't wait for anything
        self._wake_one(None)

    def _wake_one(self, connection: Any) -> bool:
        """Hand ``connection`` (or, with None, a free place) to the first task still waiting."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return True
        return False
