"""SQLite: every write of the streams from one thread, its connection kept while work waits.

SQLite lets one connection write at a time. Through the shared executor, streams' claims,
checkpoints and final saves each open a connection and then contend for the database's lock,
and a connection that finds it taken sleeps in SQLite's busy handler (for 1, 2, 5, 10... up to
100 ms a try) whatever happens meanwhile: in a burst of stream starts, a claim can wait far
longer than the writes before it took. :class:`SqliteStore` sends those writes, in order, to
one thread of their own per database, which never contends with itself: each write waits
only for the ones before it. That thread keeps its connection while writes are waiting, and
closes it once none is (a connection left open would outlive its thread at exit); a write
that fails closes it too. Reads, which SQLite's WAL mode lets run beside a write, stay on the
shared executor.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar
from uuid import UUID

from django.db import connections

from ..models import Generation
from . import _orm
from ._base import Settlement

T = TypeVar("T")


class SqliteStore(_orm.OrmStore):
    """The ORM store, its writes on one thread per database (see the module docstring)."""

    def __init__(self, db: str) -> None:
        super().__init__(db)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix=f"chatstream-sqlite-{db}")
        self._lock = threading.Lock()
        self._waiting = 0  # writes submitted and not yet done

    async def claim(self, generation_id: UUID, user_id: Any) -> Generation | None:
        return await self._write(_orm.claim, generation_id, user_id, self.db)

    async def checkpoint(self, rows: dict[UUID, dict[str, Any]]) -> set[UUID]:
        return await self._write(_orm.checkpoint, rows, self.db)

    async def finish(self, generation: Generation, fields: dict[str, Any],
                     settlement: Settlement | None = None) -> None:
        await self._write(_orm.finish, generation, fields, settlement)

    async def request_stop(self, generation_id: UUID, *, reason: str, error_type: str,
                           settlement: Settlement) -> Generation | None:
        return await self._write(functools.partial(
            _orm.request_stop, reason=reason, error_type=error_type, settlement=settlement,
            using=self.db), generation_id)

    async def _write(self, func: Callable[..., T], *args: Any) -> T:
        with self._lock:
            self._waiting += 1
        done: Future[T] = self._writer.submit(self._run, func, *args)
        done.add_done_callback(self._done)
        return await asyncio.wrap_future(done)

    def _run(self, func: Callable[..., T], *args: Any) -> T:
        connection = connections[self.db]
        try:
            return func(*args)
        except Exception:
            connection.close()  # whatever state it was left in, the next write starts anew
            raise
        finally:
            with self._lock:
                idle = self._waiting == 1  # this write is the last one submitted
            if idle:
                connection.close()

    def _done(self, _future: Future[Any]) -> None:
        with self._lock:
            self._waiting -= 1
