"""The SQL a stream sends, and the Django internals it relies on (all of them, in this module).

A stream's start is one statement (the claim: ``UPDATE ... RETURNING`` every column), written
once per database; on PostgreSQL, claims that wait go together in one ``UPDATE ... FROM
unnest(...)`` and the checkpoints of every stream of the process go in one statement. The
statements that are not written out here are built by the ORM's own compilers
(:func:`update_statement`, :func:`reply_statement`, :func:`insert_statement`), values are
prepared as the ORM prepares them, and rows are converted as the ORM converts what it reads
(:func:`instance_from_row`), so every path stores and returns the same things as the ORM.

Django internals used (no public API builds a statement without sending it, or converts a row
read by another connection): the compilers of ``UpdateQuery`` / ``InsertQuery`` / a queryset's
``query`` (``chain``, ``add_update_values``, ``insert_values``, ``get_compiler``,
``pre_sql_setup``, ``as_sql``), ``Field.get_col`` and the converters of
``connection.ops.get_db_converters`` / ``Col.get_db_converters``, ``connection.ops.quote_name``,
and the undocumented ``_meta.concrete_fields``, ``_meta.pk``, ``Field.column`` /
``Field.attname``. Public: ``Field.get_db_prep_*``, ``Field.db_type``, ``Model.from_db``.
tests/test_django_internals.py fails, by name, the day one of them changes.
"""

from __future__ import annotations

import contextvars
import functools
import os
import socket
import sqlite3
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast
from uuid import UUID

from django.core.exceptions import FieldDoesNotExist
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Expression, Field, Model, QuerySet
from django.db.models.constants import OnConflict
from django.db.models.sql.subqueries import InsertQuery, UpdateQuery
from django.utils import timezone

from ..models import Generation, Message

Status = Generation.Status
T = TypeVar("T")
M = TypeVar("M", bound=Model)

WORKER = f"{socket.gethostname()}:{os.getpid()}"[:100]

_contexts = threading.local()


def claim_changes(generation_id: UUID, user_id: Any
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    now = timezone.now()
    changes = {"status": Status.STREAMING, "started_at": now, "heartbeat_at": now,
               "worker": WORKER}
    where = {"id": generation_id, "user": user_id, "status": Status.PENDING,
             "cancel_requested": False, "waits_for_tools": False}
    return changes, where


def _user_active_field() -> Field[Any, Any] | None:
    """The user model's ``is_active`` column; None for a model without one (every user of such
    a model counts as active, as Django's ModelBackend counts them)."""
    user_model = field("user").related_model
    try:
        active = user_model._meta.get_field("is_active")  # type: ignore[union-attr]
    except FieldDoesNotExist:
        return None
    return cast("Field[Any, Any]", active) if getattr(active, "column", None) else None


def active_user_lookup() -> dict[str, Any]:
    """The claim's condition on its user, as an ORM lookup: the user is active."""
    return {"user__is_active": True} if _user_active_field() is not None else {}


def _active_user_sql(db: str, generation: str) -> str:
    """The claim's condition on its user in SQL (`` AND EXISTS (...)``, or nothing):
    ``generation`` is how the statement names the generation table."""
    active = _user_active_field()
    if active is None:
        return ""
    quote = connections[db].ops.quote_name
    user_meta = active.model._meta
    return (f" AND EXISTS (SELECT 1 FROM {quote(user_meta.db_table)} AS cs_user "
            f"WHERE cs_user.{quote(str(user_meta.pk.column))} = "
            f"{generation}.{quote(str(field('user').column))} "
            f"AND cs_user.{quote(str(active.column))})")


# SQLite has RETURNING from 3.35 (what Django's undocumented feature flags check too, on the
# sqlite3 module its backend uses).
_SQLITE_RETURNING = sqlite3.sqlite_version_info >= (3, 35)


def updates_return_rows(connection: BaseDatabaseWrapper) -> bool:
    return connection.vendor == "postgresql" or (
        connection.vendor == "sqlite" and _SQLITE_RETURNING)


def claim_statement(db: str, generation_id: UUID, user_id: Any) -> tuple[str, list[Any]]:
    """The claim as one ``UPDATE ... RETURNING`` statement for ``db``, and its parameters.

    Written out once per database (it is on every stream's critical path: no query building
    per call); the values are prepared as the ORM would prepare them.
    """
    connection = connections[db]
    changes, where = claim_changes(generation_id, user_id)
    params = [field(n).get_db_prep_save(v, connection) for n, v in changes.items()]
    # A ForeignKey prepares a value as its target field does.
    params += [field(n).get_db_prep_value(v, connection, prepared=False)
               for n, v in where.items()]
    return _update_sql(db, tuple(changes), tuple(where)), params


@functools.cache
def _update_sql(db: str, changed: tuple[str, ...], matched: tuple[str, ...]) -> str:
    """``UPDATE generation SET <changed> WHERE <matched all equal> AND <the user is active>
    RETURNING <every column>``."""
    quote = connections[db].ops.quote_name
    meta = Generation._meta

    def column(name: str) -> str:
        return quote(str(field(name).column))

    return (f"UPDATE {quote(meta.db_table)} "
            f"SET {', '.join(f'{column(n)} = %s' for n in changed)} "
            f"WHERE {' AND '.join(f'{column(n)} = %s' for n in matched)}"
            f"{_active_user_sql(db, quote(meta.db_table))} "
            f"RETURNING {', '.join(quote(str(f.column)) for f in field_list())}")


def claims_statement(db: str, claims: Sequence[tuple[UUID, Any]]
                     ) -> tuple[str, list[Any], list[tuple[str, str]]]:
    """Many claims as one PostgreSQL statement: ``UPDATE ... FROM unnest(ids, users)
    RETURNING`` the rows taken, with the parameters and each claim's key; a returned row's
    key is ``row_key(row)``. The same conditions as :func:`claim_statement`, row by row."""
    connection = connections[db]
    changes, where = claim_changes(claims[0][0], claims[0][1])
    params = [field(n).get_db_prep_save(v, connection) for n, v in changes.items()]
    ids = [field("id").get_db_prep_value(g, connection, prepared=False) for g, _ in claims]
    user = field("user")
    users = [user.get_db_prep_value(u, connection, prepared=False) for _, u in claims]
    params += [ids, users, where["status"], where["cancel_requested"], where["waits_for_tools"]]
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
            f"AND g.{column('waits_for_tools')} = %s{_active_user_sql(db, 'g')} "
            f"RETURNING {', '.join('g.' + quote(str(f.column)) for f in field_list())}")


def field(name: str) -> Field[Any, Any]:
    """The Generation field ``name`` (typed: every name used here is a concrete field)."""
    return cast("Field[Any, Any]", Generation._meta.get_field(name))


def field_list() -> list[Field[Any, Any]]:
    # _meta.concrete_fields (undocumented, though Model.from_db's documented example uses it):
    # the columns of a row, in the order the ORM selects them and from_db() takes them.
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
        # The converters the ORM's compiler applies to a column it reads (the backend's, then
        # the field's from_db_value): undocumented (get_col, get_db_converters); the only public
        # way to convert a row is to have the ORM read it, on a connection it manages.
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


# -- statements built by the ORM, for a connection Django does not manage ------------------------


def update_statement(db: str, model: type[Model], lookup: dict[str, Any],
                     values: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters of ``model.objects.filter(**lookup).update(**values)``."""
    # What QuerySet.update() does, without executing: Query.chain, UpdateQuery and the
    # compiler are undocumented; no public API gives an update's SQL without sending it.
    query = model._default_manager.using(db).filter(**lookup).query.chain(UpdateQuery)
    assert isinstance(query, UpdateQuery)
    query.add_update_values(values)
    compiler = query.get_compiler(db)
    compiler.pre_sql_setup()
    sql, params = compiler.as_sql()
    return sql, tuple(params)


def reply_statement(db: str, generation: Generation, content: str
                    ) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters of ``_orm.save_reply`` (one ``INSERT ... ON CONFLICT``)."""
    # What bulk_create(update_conflicts=True) builds, without executing nor RETURNING:
    # InsertQuery, OnConflict and the compiler are undocumented.
    meta = Message._meta
    reply = Message(generation=generation, conversation_id=generation.conversation_id,
                    role=Message.Role.ASSISTANT, content=content)
    query = InsertQuery(Message, on_conflict=OnConflict.UPDATE,
                        update_fields=[meta.get_field("content")],
                        unique_fields=[meta.get_field("generation")])
    query.insert_values([f for f in meta.concrete_fields if not f.primary_key], [reply])
    [(sql, params)] = query.get_compiler(db).as_sql()
    return sql, tuple(params)


def insert_statement(db: str, model: type[M], rows: Sequence[M]) -> tuple[str, tuple[Any, ...]]:
    """The SQL and parameters of ``bulk_create(rows)`` for a model whose key the database
    makes (an ``AutoField``): one ``INSERT``, no ``RETURNING``."""
    # InsertQuery and its compiler are undocumented (see reply_statement).
    query = InsertQuery(model)
    query.insert_values([f for f in model._meta.concrete_fields if not f.primary_key],
                        list(rows))
    [(sql, params)] = query.get_compiler(db).as_sql()
    return sql, tuple(params)


class Slot(Expression):
    """A parameter of a statement the ORM builds once (:func:`compiled`), named ``name`` and
    given its value on each call: a lookup's value (``user_id=Slot("user", field)``), as
    ``field`` prepares it."""

    def __init__(self, name: str, field: Field[Any, Any]) -> None:
        super().__init__(output_field=field)
        self.name = name

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        return "%s", (self,)


class Compiled:
    """A queryset's SQL, with its slots' places among its parameters."""

    def __init__(self, db: str, queryset: QuerySet[Any]) -> None:
        # A queryset's compiler (undocumented, as update_statement's): its as_sql() gives
        # the SQL without sending it; a Slot leaves itself among the parameters.
        self.db = db
        self.sql, params = queryset.query.get_compiler(db).as_sql()
        self._params = tuple(params)

    def params(self, values: dict[str, Any]) -> list[Any]:
        """The parameters with each slot's value, prepared as the ORM prepares a lookup's."""
        connection = connections[self.db]
        return [param.output_field.get_db_prep_value(values[param.name], connection,
                                                     prepared=False)
                if isinstance(param, Slot) else param for param in self._params]


@functools.cache
def compiled(db: str, build: Callable[[], QuerySet[Any]]) -> Compiled:
    """The statement of the queryset ``build()`` (built with :class:`Slot` for its values), for
    ``db``: compiled once, where building it through the ORM on each call costs more than its
    round trip."""
    return Compiled(db, build())


def fetch(db: str, build: Callable[[], QuerySet[Any]], **values: Any) -> list[tuple[Any, ...]]:
    """Every row of the queryset ``build()`` makes with :class:`Slot` for its values (compiled
    once), with the slots' ``values``, read through Django's connection to ``db`` as the
    database sends them (:meth:`PostgresStore.rows` reads them on the event loop)."""
    statement = compiled(db, build)
    with connections[db].cursor() as cursor:
        cursor.execute(statement.sql, statement.params(values))
        return list(cursor.fetchall())


@functools.cache
def checkpoint_sql(db: str) -> str:
    quote = connections[db].ops.quote_name
    meta = Generation._meta

    def column(name: str) -> str:
        return quote(str(field(name).column))

    pk, content, reasoning, first, beat, answered = (
        column(n) for n in ("id", "content", "reasoning", "first_token_at", "heartbeat_at",
                            "answered_by"))
    # A NULL in the content, reasoning, first-token or answered-by array means "unchanged" (a
    # row with only a heartbeat, or only one of the texts, or a call not committed yet).
    return (f"UPDATE {quote(meta.db_table)} AS g SET "
            f"{content} = COALESCE(v.content, g.{content}), "
            f"{reasoning} = COALESCE(v.reasoning, g.{reasoning}), "
            f"{first} = COALESCE(v.first_token, g.{first}), {beat} = v.heartbeat, "
            f"{answered} = COALESCE(v.answered_by, g.{answered}) "
            "FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::timestamptz[], "
            "%s::timestamptz[], %s::text[]) "
            "AS v(id, content, reasoning, first_token, heartbeat, answered_by) "
            f"WHERE g.{pk} = v.id AND g.{column('status')} = '{Generation.Status.STREAMING}' "
            f"AND NOT g.{column('cancel_requested')} RETURNING g.{pk}")


@functools.cache
def checkpoint_update_sql(db: str, changed: tuple[str, ...]) -> str:
    """One row's checkpoint through the ORM store: ``changed`` set where the row is still a
    stream of ours (:func:`checkpoint_condition` gives the condition's parameters)."""
    quote = connections[db].ops.quote_name

    def column(name: str) -> str:
        return quote(str(field(name).column))

    assignments = ", ".join(f"{column(name)} = %s" for name in changed)
    return (f"UPDATE {quote(Generation._meta.db_table)} SET {assignments} WHERE "
            f"{column('id')} = %s AND {column('status')} = %s AND "
            f"{column('cancel_requested')} = %s")


def checkpoint_condition(connection: BaseDatabaseWrapper, generation_id: UUID) -> list[Any]:
    return [field("id").get_db_prep_value(generation_id, connection, prepared=False),
            Generation.Status.STREAMING.value,
            field("cancel_requested").get_db_prep_value(False, connection, prepared=False)]


def built(build: Callable[..., T], *args: Any) -> T:
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
