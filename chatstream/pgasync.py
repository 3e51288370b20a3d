"""A stream's database work on PostgreSQL without a thread: psycopg's async API.

A stream touches the database three ways: the claim at its start (one round trip, see
:func:`records.claim`), a checkpoint of its text every second, and the final save. Django's ORM
is synchronous, so through it each costs two thread hops (wake-ups that, on a busy worker,
can take longer than the query) and ORM work that holds the GIL while other streams wait for
the event loop. On PostgreSQL all three are sent on the event loop instead, through a small
pool (:class:`pgpool.Pool`) per event loop and database alias, whose connections are opened
with the parameters Django itself connects with (``DatabaseWrapper.get_connection_params()``:
the same server, credentials, options, adapters and time zone handling). The statements are
the ones the threaded versions run (written once, or built by the ORM's own compilers) and
the rows are converted as the ORM converts them, so both paths store and return the same
things.

Claims that would wait for a connection go together, in one statement (see
:class:`_ClaimBatches`). Anything else (SQLite, other backends, a role switch with
``assume_role``, psycopg 2) takes the threaded path. Pool size:
``CHATSTREAM_CLAIM_POOL_SIZE``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from django.db import connections, router
from django.utils import timezone

from . import loops, pgpool, records
from .conf import conf
from .models import Conversation, Generation, QuotaCharge

logger = logging.getLogger("chatstream.pgasync")

_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)
_contexts = threading.local()
_claim_batches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _ClaimBatches]] = (
    weakref.WeakKeyDictionary())
# The server's synchronous_commit, per pool connection set to commit without waiting for the
# flush (CHATSTREAM_ASYNC_COMMIT): the final save sets it back for its own transaction.
_flushed_commit: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

T = TypeVar("T")


async def claim(generation_id: UUID, user_id: Any, using: str | None = None
                ) -> records.Claim | None:
    """:func:`records.claim`, sent on the event loop when the database is PostgreSQL."""
    db = using or router.db_for_write(Generation)
    opened = _pool_for(db)
    if opened is None:
        return await records.in_pool(records.claim)(generation_id, user_id, db)
    pool = await opened
    loop = asyncio.get_running_loop()
    batches = _claim_batches.setdefault(loop, {})
    if db not in batches or batches[db].pool is not pool:
        batches[db] = _ClaimBatches(db, pool)
    row = await batches[db].claim(generation_id, user_id)
    if row is None:
        return None
    generation = _built(records.generation_from_row, db, row)
    return records.Claim(generation, records.history(generation))


class _ClaimBatches:
    """Claims on their way to the database, sent together when they have to wait.

    A claim is sent at once while fewer than the pool's size of batches are in flight;
    otherwise it waits, and goes with every claim that arrived meanwhile, in one statement
    (:func:`records.claims_statement`), as soon as a batch returns. Alone, a claim waits for
    nothing; in a burst of stream starts, claims share round trips instead of queueing one by
    one for the pool's connections (1,000 starts at once: 2.2 s median wait for a connection).
    """

    def __init__(self, db: str, pool: Any) -> None:
        self.db, self.pool = db, pool
        self.in_flight = 0
        self.waiting: list[tuple[UUID, Any, asyncio.Future[Any]]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    async def claim(self, generation_id: UUID, user_id: Any) -> Any:
        """The claimed row (every column), or None if it was not ours to take."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((generation_id, user_id, future))
        if self.in_flight < conf.CLAIM_POOL_SIZE:
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
            sql, params, keys = _built(records.claims_statement, self.db,
                                       [(g, u) for g, u, _ in batch])
            async with self.pool.connection() as connection, connection.cursor() as cursor:
                await cursor.execute(sql, params)
                rows = {records.row_key(row): row for row in await cursor.fetchall()}
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


async def checkpoint(rows: dict[UUID, dict[str, Any]], using: str | None = None) -> set[UUID]:
    """:func:`records.checkpoint`: on PostgreSQL one statement for every row, on the loop.

    ``UPDATE ... FROM unnest(arrays)`` writes the partial text and heartbeats of all of this
    process's streams in one round trip; the rows it did not return are no longer ours (a Stop
    was requested, or the sweeper closed them), as with the threaded version.
    """
    db = using or router.db_for_write(Generation)
    opened = _pool_for(db)
    if opened is None:
        return set(await records.in_pool(records.checkpoint)(rows, db))
    pool = await opened
    ids = list(rows)
    content = [rows[i].get("content") for i in ids]
    first_token = [rows[i].get("first_token_at") for i in ids]
    heartbeat = [rows[i]["heartbeat_at"] for i in ids]
    async with pool.connection() as connection, connection.cursor() as cursor:
        await cursor.execute(_checkpoint_sql(db), [ids, content, first_token, heartbeat])
        kept = {row[0] for row in await cursor.fetchall()}
    return set(ids) - kept


@functools.cache
def _checkpoint_sql(db: str) -> str:
    quote = connections[db].ops.quote_name
    meta = Generation._meta

    def column(name: str) -> str:
        return quote(str(records.field(name).column))

    pk, content, first, beat = (column(n) for n in ("id", "content", "first_token_at",
                                                     "heartbeat_at"))
    # A NULL in the content or first-token array means "unchanged" (a heartbeat-only row).
    return (f"UPDATE {quote(meta.db_table)} AS g SET "
            f"{content} = COALESCE(v.content, g.{content}), "
            f"{first} = COALESCE(v.first_token, g.{first}), {beat} = v.heartbeat "
            "FROM unnest(%s::uuid[], %s::text[], %s::timestamptz[], %s::timestamptz[]) "
            "AS v(id, content, first_token, heartbeat) "
            f"WHERE g.{pk} = v.id AND g.{column('status')} = '{Generation.Status.STREAMING}' "
            f"AND NOT g.{column('cancel_requested')} RETURNING g.{pk}")


async def finish(generation: Generation, fields: dict[str, Any],
                 render: Callable[[Generation], str] | None = None) -> str:
    """:func:`records.finish` (then ``render``, if given): on PostgreSQL on the loop.

    The same statements as the threaded save (each built by the ORM: see
    ``records.update_statement``), in one transaction, and the same quota settlement
    (``quota.settlement.charge_for``). Elsewhere, the threaded save and the render run in one
    thread hop.
    """
    from .quota.settlement import charge_for

    db = generation._state.db or router.db_for_write(Generation)
    opened = _pool_for(db)
    if opened is None:
        def save_and_render() -> str:
            saved = records.finish(generation, fields)
            return render(saved) if render is not None else ""

        return str(await records.in_pool(save_and_render)())
    pool = await opened
    for name, value in fields.items():
        setattr(generation, name, value)
    statements = _built(_final_statements, db, generation, fields)
    async with pool.connection() as connection, connection.transaction():
        cursor = connection.cursor()
        flushed = _flushed_commit.get(connection)
        if flushed is not None:  # the outcome is durable before the browser hears of it
            await cursor.execute("SELECT set_config('synchronous_commit', %s, true)", [flushed])
        for sql, params in statements:
            await cursor.execute(sql, params)
        if generation.status not in Generation.LIVE:
            await cursor.execute(*_built(_unsettled_charge, db, generation))
            row = await cursor.fetchone()
            if row is not None:
                charge = _built(records.instance_from_row, QuotaCharge, db, row)
                charged, source = charge_for(generation, charge)
                await cursor.execute(*_built(
                    records.update_statement, db, QuotaCharge,
                    {"pk": charge.pk, "settled_at__isnull": True},
                    {"charged": charged, "source": source, "settled_at": timezone.now()}))
    return render(generation) if render is not None else ""


def _final_statements(db: str, generation: Generation, fields: dict[str, Any]
                      ) -> list[tuple[str, tuple[Any, ...]]]:
    statements = [records.update_statement(db, Generation, {"pk": generation.pk}, fields)]
    if fields.get("content"):
        statements.append(records.reply_statement(db, generation, fields["content"]))
    statements.append(records.update_statement(
        db, Conversation, {"pk": generation.conversation_id}, {"updated_at": timezone.now()}))
    return statements


def _unsettled_charge(db: str, generation: Generation) -> tuple[str, tuple[Any, ...]]:
    return records.select_statement(
        QuotaCharge.objects.using(db)
        .filter(generation_id=generation.pk, settled_at__isnull=True).order_by("pk")[:1])


def _built(build: Callable[..., T], *args: Any) -> T:
    """``build(*args)`` (SQL building, row conversion) in one context kept per thread.

    Django keeps a connection object per async context: asked for ``connections[db]`` in a
    stream's own context, as the ORM's compilers and converters ask, it would make one for each
    stream and keep it as long as the stream runs (~3 KB each). Built in this context, one
    object serves every stream; nothing is ever sent through it (the pool's connections send).
    """
    context = getattr(_contexts, "context", None)
    if context is None:
        context = _contexts.context = contextvars.Context()
    return context.run(build, *args)


def _pool_for(db: str) -> asyncio.Future[pgpool.Pool] | None:
    """The running loop's pool for ``db`` (ready once awaited), or None if it can't have one."""
    loop = asyncio.get_running_loop()
    pools = _pools.setdefault(loop, {})
    if db not in pools:
        pool = _built(_new_pool, db)
        pools[db] = None if pool is None else asyncio.ensure_future(_opened(pool))
    return pools[db]


async def _opened(pool: pgpool.Pool) -> pgpool.Pool:
    await loops.close_at_shutdown(pool.close)
    return pool


def _new_pool(db: str) -> pgpool.Pool | None:
    wrapper = connections[db]
    if wrapper.vendor != "postgresql" or wrapper.settings_dict["OPTIONS"].get("assume_role"):
        return None
    try:
        import psycopg
    except ImportError:  # psycopg 2: the threaded path
        return None
    params = wrapper.get_connection_params()
    # Bind parameters as Django does: client side unless OPTIONS asks for server_side_binding.
    server_side = not issubclass(params.pop("cursor_factory", psycopg.ClientCursor),
                                 psycopg.ClientCursor)
    params["cursor_factory"] = psycopg.AsyncCursor if server_side else psycopg.AsyncClientCursor
    params["autocommit"] = True
    params.setdefault("connect_timeout", 10)  # libpq's default is to wait for ever
    timezone_name = wrapper.timezone_name

    async def connect() -> Any:
        connection = await psycopg.AsyncConnection.connect(**params)
        try:
            if timezone_name and connection.info.parameter_status("TimeZone") != timezone_name:
                await connection.execute(wrapper.ops.set_time_zone_sql(), [timezone_name])
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

    return pgpool.Pool(connect, max_size=conf.CLAIM_POOL_SIZE)


async def aclose_pools() -> None:
    """Close the running loop's claim pools now (they are closed with their loop anyway)."""
    for opened in _pools.pop(asyncio.get_running_loop(), {}).values():
        if opened is not None:
            await (await opened).close()
