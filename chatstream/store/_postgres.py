"""A stream's database work on PostgreSQL without a thread: :class:`PostgresStore`.

The ORM is synchronous, so through it (:class:`OrmStore`) each of a stream's writes costs two
thread hops, wake-ups that on a busy worker take longer than the query, and ORM work that holds
the GIL while the loop's other streams wait. On PostgreSQL the claim, the checkpoints and the
final save are sent on the event loop instead, with psycopg's async API, through a small pool
per event loop (:class:`Pool`, ``CHATSTREAM_CLAIM_POOL_SIZE`` connections) opened with the
parameters Django itself connects with (``DatabaseWrapper.get_connection_params()``: the same
server, credentials, options, adapters and time zone handling). The statements are the ones
the ORM store runs (see ``_sql.py``), so both store and return the same things; the rest of
the interface is the ORM store's. bench/README.md has the measurements that keep this module.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from django.db import connections
from django.db.models import QuerySet
from django.utils import timezone

from .._loops import PerLoop
from ..conf import conf
from ..models import Attempt, Conversation, Generation, QuotaCharge
from ._base import Settlement
from ._orm import OrmStore, gone
from ._pool import Pool
from ._sql import (
    Slot,
    built,
    checkpoint_sql,
    claims_statement,
    compiled,
    generation_from_row,
    insert_statement,
    instance_from_row,
    reply_statement,
    row_key,
    update_statement,
)

# The server's synchronous_commit, per pool connection set to commit without waiting for the
# flush (CHATSTREAM_ASYNC_COMMIT): the final save sets it back for its own transaction.
_flushed_commit: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def usable(db: str) -> bool:
    """Whether ``db`` can have a :class:`PostgresStore`: PostgreSQL through psycopg 3, and no
    ``assume_role`` (which switches roles per connection Django opens)."""
    wrapper = connections[db]
    if wrapper.vendor != "postgresql" or wrapper.settings_dict["OPTIONS"].get("assume_role"):
        return False
    try:
        import psycopg  # noqa: F401
    except ImportError:  # psycopg 2
        return False
    return True


class PostgresStore(OrmStore):
    """The claim, the checkpoints and the final save on the event loop; the rest as the ORM."""

    def __init__(self, db: str) -> None:
        super().__init__(db)
        self._loops: PerLoop[_LoopState] = PerLoop(
            lambda: _LoopState(db, Pool(built(_connector, db), max_size=conf.CLAIM_POOL_SIZE)),
            close=_LoopState.aclose)

    async def claim(self, generation_id: UUID, user_id: Any) -> Generation | None:
        row = await (await self._loops.aget()).claim(generation_id, user_id)
        if row is None:
            return None
        return built(generation_from_row, self.db, row)

    async def checkpoint(self, rows: dict[UUID, dict[str, Any]], *,
                         calls: Sequence[Attempt] = ()) -> set[UUID]:
        """One ``UPDATE ... FROM unnest(arrays)`` for every row; those it did not return are no
        longer ours. With ``calls``, one INSERT of those of the rows returned, in the same
        transaction."""
        ids = list(rows)
        content = [rows[i].get("content") for i in ids]
        reasoning = [rows[i].get("reasoning") for i in ids]
        first_token = [rows[i].get("first_token_at") for i in ids]
        heartbeat = [rows[i]["heartbeat_at"] for i in ids]
        answered_by = [rows[i].get("answered_by") for i in ids]
        params = [ids, content, reasoning, first_token, heartbeat, answered_by]
        pool = (await self._loops.aget()).pool
        async with pool.connection() as connection:
            if not calls:  # the usual pass: one statement, in autocommit
                async with connection.cursor() as cursor:
                    await cursor.execute(checkpoint_sql(self.db), params)
                    kept = {row[0] for row in await cursor.fetchall()}
                return set(ids) - kept
            async with connection.transaction(), connection.cursor() as cursor:
                await cursor.execute(checkpoint_sql(self.db), params)
                kept = {row[0] for row in await cursor.fetchall()}
                if ours := [call for call in calls if call.generation_id in kept]:
                    await cursor.execute(*built(insert_statement, self.db, Attempt, ours))
        return set(ids) - kept

    async def finish(self, generation: Generation, fields: dict[str, Any],
                     settlement: Settlement | None = None,
                     attempts: Sequence[Attempt] = ()) -> None:
        """The ORM store's statements, built by the ORM, and the hold settled, in one
        transaction."""
        db = self.db
        for name, value in fields.items():
            setattr(generation, name, value)
        statements = built(_final_statements, db, generation, fields, attempts)
        pool = (await self._loops.aget()).pool
        async with pool.connection() as connection, connection.transaction():
            cursor = connection.cursor()
            flushed = _flushed_commit.get(connection)
            if flushed is not None:  # the outcome is durable before the browser hears of it
                await cursor.execute("SELECT set_config('synchronous_commit', %s, true)",
                                     [flushed])
            (sql, params), *rest = statements  # the generation's, first
            await cursor.execute(sql, params)
            if not cursor.rowcount:
                gone(generation)
                return
            for sql, params in rest:
                await cursor.execute(sql, params)
            if settlement is not None:
                # Its hold (one per generation), settled unless it already is (the sweeper's).
                hold = built(compiled, db, _hold_statement)
                await cursor.execute(hold.sql, built(hold.params, {"generation": generation.pk}))
                row = await cursor.fetchone()
                charge = None if row is None else built(instance_from_row, QuotaCharge, db, row)
                if charge is not None and charge.settled_at is None:
                    await cursor.execute(*built(
                        update_statement, db, QuotaCharge,
                        {"pk": charge.pk, "settled_at__isnull": True},
                        {**settlement.against(charge), "settled_at": timezone.now()}))

    async def rows(self, build: Callable[[], QuerySet[Any]], **values: Any
                   ) -> list[tuple[Any, ...]]:
        """Every row of the queryset ``build()`` makes with :class:`Slot` for its values,
        compiled once (:func:`compiled`), with the slots' ``values``, read on the loop as the
        database sends them."""
        statement = built(compiled, self.db, build)
        params = built(statement.params, values)
        pool = (await self._loops.aget()).pool
        async with pool.connection() as connection, connection.cursor() as cursor:
            await cursor.execute(statement.sql, params)
            return list(await cursor.fetchall())

    async def aclose(self) -> None:
        """Close the running loop's pool now (it is closed with its loop anyway)."""
        state = self._loops.pop()
        if state is not None:
            await state.aclose()


def _hold_statement() -> QuerySet[QuotaCharge]:
    """A generation's quota hold (one at most)."""
    return QuotaCharge.objects.filter(
        generation_id=Slot("generation", QuotaCharge._meta.get_field("generation_id")))


def _final_statements(db: str, generation: Generation, fields: dict[str, Any],
                      attempts: Sequence[Attempt]) -> list[tuple[str, tuple[Any, ...]]]:
    statements = [update_statement(db, Generation, {"pk": generation.pk}, fields)]
    if fields.get("content"):
        statements.append(reply_statement(db, generation, fields["content"]))
    if attempts:
        statements.append(insert_statement(db, Attempt, attempts))
    statements.append(update_statement(
        db, Conversation, {"pk": generation.conversation_id}, {"updated_at": timezone.now()}))
    return statements


class _LoopState:
    """One event loop's pool for a database, and its claims on their way.

    A claim is sent at once while fewer than the pool's size of batches are in flight;
    otherwise it waits, and goes with every claim that arrived meanwhile, in one statement
    (``claims_statement``), as soon as a batch returns. Alone, a claim waits for nothing; in a
    burst of stream starts, claims share round trips instead of queueing one by one for the
    pool's connections (bench/README.md: the flood of 1,000 starts).
    """

    def __init__(self, db: str, pool: Pool) -> None:
        self.db, self.pool = db, pool
        self.in_flight = 0
        self.waiting: list[tuple[UUID, Any, asyncio.Future[Any]]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def aclose(self) -> None:
        await self.pool.close()

    async def claim(self, generation_id: UUID, user_id: Any) -> Any:
        """The claimed row (every column), or None if it was not ours to take."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((generation_id, user_id, future))
        if self.in_flight < self.pool.max_size:
            self._send()
        return await future

    def _send(self) -> None:
        batch, self.waiting = self.waiting, []
        self.in_flight += 1
        task = asyncio.get_running_loop().create_task(self._run(batch))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, batch: list[tuple[UUID, Any, asyncio.Future[Any]]]) -> None:
        try:
            sql, params, keys = built(claims_statement, self.db, [(g, u) for g, u, _ in batch])
            async with self.pool.connection() as connection, connection.cursor() as cursor:
                await cursor.execute(sql, params)
                rows = {row_key(row): row for row in await cursor.fetchall()}
        except BaseException as error:
            for *_, future in batch:
                if future.done():
                    continue
                if isinstance(error, Exception):
                    future.set_exception(error)
                else:
                    future.cancel()
            if not isinstance(error, Exception):
                raise
        else:
            for key, (*_, future) in zip(keys, batch, strict=True):
                # A row goes to the first claim that asked for it: twice in one batch is
                # still once.
                if not future.done():
                    future.set_result(rows.pop(key, None))
        finally:
            self.in_flight -= 1
            if self.waiting:
                self._send()


def _connector(db: str) -> Any:
    """How a pool connection to ``db`` is opened: as Django connects, in autocommit, and (with
    ``CHATSTREAM_ASYNC_COMMIT``) committing without waiting for the WAL flush."""
    import psycopg

    wrapper = connections[db]
    params = wrapper.get_connection_params()
    # Bind parameters as Django does: client side unless OPTIONS asks for server_side_binding.
    server_side = not issubclass(params.pop("cursor_factory", psycopg.ClientCursor),
                                 psycopg.ClientCursor)
    params["cursor_factory"] = psycopg.AsyncCursor if server_side else psycopg.AsyncClientCursor
    params["autocommit"] = True
    params.setdefault("connect_timeout", 10)  # libpq's default is to wait for ever
    timezone_name = wrapper.timezone_name
    set_time_zone = wrapper.ops.set_time_zone_sql()

    async def connect() -> Any:
        connection = await psycopg.AsyncConnection.connect(**params)
        try:
            if timezone_name and connection.info.parameter_status("TimeZone") != timezone_name:
                await connection.execute(set_time_zone, [timezone_name])
            if conf.ASYNC_COMMIT:
                # A claim or a checkpoint lost in a crash of the database server is recovered
                # as any interrupted stream is (the sweeper); the claim's wait for the flush
                # would be on the path to the first token.
                cursor = await connection.execute(
                    "SELECT current_setting('synchronous_commit'), "
                    "set_config('synchronous_commit', 'off', false)")
                row = await cursor.fetchone()
                assert row is not None
                _flushed_commit[connection] = row[0]
        except BaseException:
            await connection.close()
            raise
        return connection

    return connect
