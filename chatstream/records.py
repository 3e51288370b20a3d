"""Every database read and write of a generation's life, as plain sync functions.

The streaming path calls them through :func:`in_pool`: on the shared executor, so an open
stream pins no thread and no connection between writes. Connections there follow
``CONN_MAX_AGE`` as a request's would: closed after each call when it is 0, kept (and
health-checked) when persistent or pooled.
"""

from __future__ import annotations

import functools
import os
import socket
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast
from uuid import UUID

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model, QuerySet
from django.db.models.constants import OnConflict
from django.db.models.sql.subqueries import InsertQuery, UpdateQuery
from django.utils import timezone

from .models import Conversation, Generation, Message

Status = Generation.Status
T = TypeVar("T")
M = TypeVar("M", bound=Model)

WORKER = f"{socket.gethostname()}:{os.getpid()}"[:100]


def in_pool(func: Callable[..., T]) -> Callable[..., Any]:
    """``func`` as a coroutine function run on the shared executor."""

    def call(*args: Any, **kwargs: Any) -> T:
        close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return sync_to_async(call, thread_sensitive=False)


@dataclass
class Claim:
    """A generation this process now streams, with the messages to send upstream."""

    generation: Generation
    messages: list[dict[str, str]]


def claim(generation_id: UUID, user_id: Any, using: str | None = None) -> Claim | None:
    """Atomically move the user's pending generation to streaming; None if it wasn't ours to take.

    One conditional UPDATE decides: of any number of concurrent callers, exactly one wins. On
    PostgreSQL and SQLite it also returns the row (``UPDATE ... RETURNING``), so a stream's
    start costs one database round trip; elsewhere the row is read after the update. (On
    PostgreSQL the stream sends the same statement without a thread: see pgasync.py.)
    """
    db = using or router.db_for_write(Generation)
    if _updates_return_rows(connections[db]):
        sql, params = claim_statement(db, generation_id, user_id)
        with connections[db].cursor() as cursor:
            cursor.execute(sql, params)
            # Read to the end: SQLite commits an UPDATE ... RETURNING once it is stepped out.
            found = cursor.fetchall()
        if not found:
            return None
        generation = generation_from_row(db, found[0])
    else:
        changes, where = _claim_changes(generation_id, user_id)
        if not Generation.objects.using(db).filter(**where).update(**changes):
            return None
        generation = Generation.objects.using(db).get(pk=generation_id)
    return Claim(generation, history(generation))


def _claim_changes(generation_id: UUID, user_id: Any
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    now = timezone.now()
    changes = {"status": Status.STREAMING, "started_at": now, "heartbeat_at": now,
               "worker": WORKER}
    where = {"id": generation_id, "user": user_id, "status": Status.PENDING,
             "cancel_requested": False}
    return changes, where


def _updates_return_rows(connection: BaseDatabaseWrapper) -> bool:
    # SQLite has RETURNING from 3.35, the release that also lets inserts return columns.
    return connection.vendor == "postgresql" or (
        connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert
    )


def claim_statement(db: str, generation_id: UUID, user_id: Any) -> tuple[str, list[Any]]:
    """The claim as one ``UPDATE ... RETURNING`` statement for ``db``, and its parameters.

    Written out once per database (it is on every stream's critical path: no query building
    per call); the values are prepared as the ORM would prepare them.
    """
    connection = connections[db]
    changes, where = _claim_changes(generation_id, user_id)
    params = [field(n).get_db_prep_save(v, connection) for n, v in changes.items()]
    for name, value in where.items():
        target = field(name)
        if target.is_relation:
            target = target.target_field  # type: ignore[attr-defined]
        params.append(target.get_db_prep_value(value, connection, prepared=False))
    return _update_sql(db, tuple(changes), tuple(where)), params


@functools.cache
def _update_sql(db: str, changed: tuple[str, ...], matched: tuple[str, ...]) -> str:
    """``UPDATE generation SET <changed> WHERE <matched all equal> RETURNING <every column>``."""
    quote = connections[db].ops.quote_name
    meta = Generation._meta

    def column(name: str) -> str:
        return quote(str(field(name).column))

    return (f"UPDATE {quote(meta.db_table)} "
            f"SET {', '.join(f'{column(n)} = %s' for n in changed)} "
            f"WHERE {' AND '.join(f'{column(n)} = %s' for n in matched)} "
            f"RETURNING {', '.join(quote(str(f.column)) for f in field_list())}")


def claims_statement(db: str, claims: Sequence[tuple[UUID, Any]]
                     ) -> tuple[str, list[Any], list[tuple[str, str]]]:
    """Many claims as one PostgreSQL statement: ``UPDATE ... FROM unnest(ids, users)
    RETURNING`` the rows taken, with the parameters and each claim's key; a returned row's
    key is ``row_key(row)``. The same conditions as :func:`claim_statement`, row by row."""
    connection = connections[db]
    changes, where = _claim_changes(claims[0][0], claims[0][1])
    params = [field(n).get_db_prep_save(v, connection) for n, v in changes.items()]
    ids = [field("id").get_db_prep_value(g, connection, prepared=False) for g, _ in claims]
    user = field("user").target_field  # type: ignore[attr-defined]
    users = [user.get_db_prep_value(u, connection, prepared=False) for _, u in claims]
    params += [ids, users, where["status"], where["cancel_requested"]]
    keys = [(str(g), str(u)) for g, u in zip(ids, users, strict=True)]
    return _claims_sql(db, tuple(changes)), params, keys


def row_key(row: Sequence[Any]) -> tuple[str, str]:
    """The (generation id, user id) of a row of every column, as ``claims_statement`` keys it."""
    at_id, at_user = _key_columns()
    return str(row[at_id]), str(row[at_user])


@functools.cache
def _key_columns() -> tuple[int, int]:
    names = [f.name for f in field_list()]
    return names.index("id"), names.index("user")


@functools.cache
def _claims_sql(db: str, changed: tuple[str, ...]) -> str:
    connection = connections[db]
    quote = connection.ops.quote_name

    def column(name: str) -> str:
        return quote(str(field(name).column))

    id_type, user_type = field("id").db_type(connection), field("user").db_type(connection)
    return (f"UPDATE {quote(Generation._meta.db_table)} AS g "
            f"SET {', '.join(f'{column(n)} = %s' for n in changed)} "
            f"FROM unnest(%s::{id_type}[], %s::{user_type}[]) AS v(id, user_id) "
            f"WHERE g.{column('id')} = v.id AND g.{column('user')} = v.user_id "
            f"AND g.{column('status')} = %s AND g.{column('cancel_requested')} = %s "
            f"RETURNING {', '.join('g.' + quote(str(f.column)) for f in field_list())}")


def field(name: str) -> Field[Any, Any]:
    """The Generation field ``name`` (typed: every name used here is a concrete field)."""
    return cast("Field[Any, Any]", Generation._meta.get_field(name))


def field_list() -> list[Field[Any, Any]]:
    return list(Generation._meta.concrete_fields)


def generation_from_row(db: str, row: Sequence[Any]) -> Generation:
    """A Generation from a row of every concrete column, converted as the ORM would."""
    return instance_from_row(Generation, db, row)


def instance_from_row(model: type[M], db: str, row: Sequence[Any]) -> M:
    """A ``model`` instance from a row of its concrete columns (in field order), converted as
    the ORM converts what it reads."""
    connection = connections[db]
    names, conversions = _row_plan(connection, model)
    values = list(row)
    for i, column, converters in conversions:
        for convert in converters:
            values[i] = convert(values[i], column, connection)
    return model.from_db(db, names, values)


_row_plans: weakref.WeakKeyDictionary[BaseDatabaseWrapper, dict[type[Model], Any]] = (
    weakref.WeakKeyDictionary())


def _row_plan(connection: BaseDatabaseWrapper, model: type[Model]
              ) -> tuple[list[str], list[tuple[int, Any, list[Callable[..., Any]]]]]:
    """The attribute names of ``model``'s concrete fields, and the converters of the columns
    that have any: worked out once per connection object (a claim converts a row per stream)."""
    plans = _row_plans.setdefault(connection, {})
    if model not in plans:
        meta = model._meta
        conversions = []
        for i, field in enumerate(meta.concrete_fields):
            column = field.get_col(meta.db_table)
            converters = [*connection.ops.get_db_converters(column),
                          *column.get_db_converters(connection)]
            if converters:
                conversions.append((i, column, converters))
        plans[model] = ([f.attname for f in meta.concrete_fields], conversions)
    return cast("tuple[list[str], list[tuple[int, Any, list[Callable[..., Any]]]]]", plans[model])


# -- statements built by the ORM, for a connection Django does not manage (see pgasync.py) --------


def update_statement(db: str, model: type[Model], lookup: dict[str, Any],
                     values: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters of ``model.objects.filter(**lookup).update(**values)``."""
    query = model._default_manager.using(db).filter(**lookup).query.chain(UpdateQuery)
    assert isinstance(query, UpdateQuery)
    query.add_update_values(values)
    compiler = query.get_compiler(db)
    compiler.pre_sql_setup()
    sql, params = compiler.as_sql()
    return sql, tuple(params)


def select_statement(queryset: QuerySet[Any]) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters of ``queryset`` (every concrete column, in field order)."""
    names = [f.attname for f in queryset.model._meta.concrete_fields]
    sql, params = queryset.values_list(*names).query.get_compiler(queryset.db).as_sql()
    return sql, tuple(params)


def reply_statement(db: str, generation: Generation, content: str
                    ) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters of :func:`save_reply` (one ``INSERT ... ON CONFLICT``)."""
    meta = Message._meta
    reply = Message(generation=generation, conversation_id=generation.conversation_id,
                    role=Message.Role.ASSISTANT, content=content)
    query = InsertQuery(Message, on_conflict=OnConflict.UPDATE,
                        update_fields=[meta.get_field("content")],
                        unique_fields=[meta.get_field("generation")])
    query.insert_values([f for f in meta.concrete_fields if not f.primary_key], [reply])
    [(sql, params)] = query.get_compiler(db).as_sql()
    return sql, tuple(params)


def owns(generation_id: UUID, user_id: Any) -> bool:
    return Generation.objects.filter(pk=generation_id, user_id=user_id).exists()


def load(generation_id: UUID) -> Generation:
    return Generation.objects.select_related("conversation", "prompt_message").get(
        pk=generation_id
    )


def watched_since(generation_id: UUID, seconds: float) -> bool:
    """Whether a page has shown this live generation within the last ``seconds``."""
    return Generation.objects.filter(
        pk=generation_id, watched_at__gte=timezone.now() - timedelta(seconds=seconds)
    ).exists()


def unwatched(generation_ids: Iterable[UUID], seconds: float) -> set[UUID]:
    """Which of ``generation_ids`` no page has shown within the last ``seconds``."""
    ids = set(generation_ids)
    watched = Generation.objects.filter(
        pk__in=list(ids), watched_at__gte=timezone.now() - timedelta(seconds=seconds)
    ).values_list("pk", flat=True)
    return ids - set(watched)


def mark_watched(**lookup: Any) -> list[UUID]:
    """Note that a page now shows the streaming generations matching ``lookup``; their ids."""
    rows = Generation.objects.filter(status=Status.STREAMING, **lookup)
    ids = list(rows.values_list("pk", flat=True))
    if ids:
        Generation.objects.filter(pk__in=ids).update(watched_at=timezone.now())
    return ids


def follow(generation_id: UUID) -> Generation:
    """Load a generation for a page following it, noting that the page still watches."""
    mark_watched(pk=generation_id)
    return load(generation_id)


def history(generation: Generation) -> list[dict[str, str]]:
    """The messages sent upstream for ``generation``, as stored when it was created."""
    return list(generation.upstream_messages) or build_history(generation)


def build_history(generation: Generation) -> list[dict[str, str]]:
    """The messages to send upstream for ``generation``: stored text only, never request input.

    Each earlier question is followed by the latest reply that produced text; replies to the
    question being answered now (earlier attempts) are left out. Called when a generation is
    created (its ``upstream_messages`` keep the result), and for rows made before that field.
    """
    from .conf import conf

    prompt = generation.prompt_message
    messages: list[dict[str, str]] = []
    if conf.SYSTEM_PROMPT:
        messages.append({"role": "system", "content": conf.SYSTEM_PROMPT})
    stored = list(
        Message.objects.filter(conversation_id=generation.conversation_id,
                               created_at__lte=prompt.created_at)
        .select_related("generation")
        .order_by("created_at", "id")
    )
    replies: dict[int, Message] = {}
    for message in stored:
        if message.role == Message.Role.ASSISTANT and message.generation is not None:
            replies[message.generation.prompt_message_id] = message
    for message in stored:
        if message.role == Message.Role.USER and message.pk <= prompt.pk:
            messages.append({"role": "user", "content": message.content})
            reply = replies.get(message.pk)
            if reply is not None and message.pk != prompt.pk:
                messages.append({"role": "assistant", "content": reply.content})
    return messages


def stop_requested(generation_ids: Iterable[UUID]) -> set[UUID]:
    """Which of ``generation_ids`` carry the durable Stop flag."""
    return set(Generation.objects.filter(pk__in=list(generation_ids), cancel_requested=True)
               .values_list("pk", flat=True))


def checkpoint(rows: dict[UUID, dict[str, Any]], using: str | None = None) -> set[UUID]:
    """Save partial text and heartbeats in one transaction; return the rows no longer ours.

    A row stops being ours when a Stop was requested or the sweeper closed it: the conditional
    UPDATE then matches nothing, and the caller stops that stream.
    """
    lost = set()
    db = using or router.db_for_write(Generation)
    with transaction.atomic(using=db):
        for generation_id, fields in rows.items():
            if not Generation.objects.using(db).filter(
                pk=generation_id, status=Status.STREAMING, cancel_requested=False
            ).update(**fields):
                lost.add(generation_id)
    return lost


def finish(generation: Generation, fields: dict[str, Any]) -> Generation:
    """Store a generation's outcome, its reply message and its quota settlement, at once."""
    from . import quota

    db = generation._state.db or router.db_for_write(Generation)
    with transaction.atomic(using=db):
        Generation.objects.using(db).filter(pk=generation.pk).update(**fields)
        for name, value in fields.items():
            setattr(generation, name, value)
        if fields.get("content"):
            save_reply(generation, fields["content"])
        Conversation.objects.using(db).filter(pk=generation.conversation_id).update(
            updated_at=timezone.now())
        quota.settle(generation)
    return generation


def save_reply(generation: Generation, content: str) -> None:
    """Create or update the assistant message holding ``generation``'s text: one statement."""
    reply = Message(generation=generation, conversation_id=generation.conversation_id,
                    role=Message.Role.ASSISTANT, content=content)
    db = generation._state.db or router.db_for_write(Message)
    if connections[db].features.supports_update_conflicts_with_target:
        Message.objects.using(db).bulk_create(
            [reply], update_conflicts=True, unique_fields=["generation"],
            update_fields=["content"])
    else:
        Message.objects.using(db).update_or_create(generation=generation, defaults={
            "conversation_id": generation.conversation_id, "role": Message.Role.ASSISTANT,
            "content": content})


def request_stop(generation_id: UUID) -> None:
    """Write the durable Stop flag; a generation nobody streams yet is cancelled on the spot."""
    from . import quota

    with transaction.atomic():
        cancelled = Generation.objects.filter(pk=generation_id, status=Status.PENDING).update(
            status=Status.CANCELLED, reason="stopped by user", error_type="stopped_by_user",
            cancel_requested=True, completed_at=timezone.now(),
            usage_source=Generation.UsageSource.NONE,
        )
        if cancelled:
            quota.settle(Generation.objects.get(pk=generation_id))
        else:
            Generation.objects.filter(pk=generation_id, status=Status.STREAMING).update(
                cancel_requested=True)
