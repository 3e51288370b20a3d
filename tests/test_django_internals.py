"""The Django internals chatstream relies on, each held here, so that a Django upgrade that
changes one fails a test named for it rather than a distant end-to-end one.

* chatstream/store/_sql.py builds statements with the ORM's own compilers (sent later by
  psycopg's async API, on a connection Django does not manage) and converts rows as the ORM's
  compiler does: each builder is compared, on SQLite and PostgreSQL, with what the ORM itself
  sends (``connection.execute_wrapper``, public, sees it) and reads.
* chatstream/store/_postgres.py opens its pool's connections with Django's connection
  parameters and time zone statement.
* chatstream/asgi.py serves ticketed streams before Django's request cycle: the request it makes
  from a scope, the script prefix, the URLconf's resolver, the middleware's response half.

Each call shape chatstream uses is also bound against the signature Django has now.
"""

from __future__ import annotations

import inspect
import io
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import django
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.db.models import Model
from django.test import RequestFactory
from django.utils import timezone

from chatstream import asgi
from chatstream.models import Attempt, Conversation, Generation, Message, QuotaCharge
from chatstream.store import _sql

ALIASES = ["default", *(["postgres"] if "postgres" in settings.DATABASES else [])]
Status = Generation.Status
NOW = datetime(2026, 3, 10, 15, 0, 0, 123456, tzinfo=UTC)


def _why(what: str, relied_on_by: str) -> str:
    return (f"Django {django.get_version()} changed {what}, which {relied_on_by} relies on "
            "(no public API does the same): adapt it to this Django")


# --- the call shapes chatstream uses --------------------------------------------------------------


def _shapes() -> Iterator[Any]:
    from django.core.handlers.asgi import ASGIRequest
    from django.db.backends.base.operations import BaseDatabaseOperations
    from django.db.models import Field
    from django.db.models.expressions import Col
    from django.db.models.sql.compiler import SQLCompiler, SQLInsertCompiler, SQLUpdateCompiler
    from django.db.models.sql.query import Query
    from django.db.models.sql.subqueries import InsertQuery, UpdateQuery
    from django.middleware.clickjacking import XFrameOptionsMiddleware
    from django.middleware.security import SecurityMiddleware
    from django.urls import get_resolver, set_script_prefix

    store, front = "chatstream/store/_sql.py", "chatstream/asgi.py"
    x = object()
    # (callable, positional args, keyword args, who relies on it), as the code calls them.
    yield Query.chain, (x, UpdateQuery), {}, store
    yield UpdateQuery.add_update_values, (x, {}), {}, store
    yield Query.get_compiler, (x, "default"), {}, store
    yield SQLUpdateCompiler.pre_sql_setup, (x,), {}, store
    yield SQLUpdateCompiler.as_sql, (x,), {}, store
    yield SQLCompiler.as_sql, (x,), {}, store
    yield InsertQuery, (Message,), dict(on_conflict=x, update_fields=[], unique_fields=[]), store
    yield InsertQuery.insert_values, (x, [], []), {}, store
    yield SQLInsertCompiler.as_sql, (x,), {}, store
    yield BaseDatabaseOperations.get_db_converters, (x, x), {}, store
    yield BaseDatabaseOperations.quote_name, (x, "name"), {}, store
    yield Field.get_col, (x, "table"), {}, store
    yield Col.get_db_converters, (x, x), {}, store
    yield Model.from_db, ("default", [], []), {}, store
    yield ASGIRequest, ({}, io.BytesIO()), {}, front
    yield set_script_prefix, ("/",), {}, front
    yield get_resolver, (), {}, front
    yield SecurityMiddleware.process_response, (x, x, x), {}, front
    yield XFrameOptionsMiddleware.process_response, (x, x, x), {}, front


@pytest.mark.parametrize("func, args, kwargs, user", list(_shapes()),
                         ids=lambda v: getattr(v, "__qualname__", None) if callable(v) else "")
def test_django_internals_take_the_arguments_chatstream_passes(func, args, kwargs, user):
    signature = inspect.signature(func)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        pytest.fail(_why(f"the signature of {func.__module__}.{func.__qualname__} to "
                         f"{signature} ({error})", user))


def test_the_postgres_store_connects_with_djangos_connection_parameters():
    """chatstream/store/_postgres.py opens its pool's connections as Django does."""
    from django.db.backends.postgresql.base import DatabaseWrapper
    from django.db.backends.postgresql.operations import DatabaseOperations

    user = "chatstream/store/_postgres.py (_connector)"
    for name in ("get_connection_params", "timezone_name"):
        assert hasattr(DatabaseWrapper, name), _why(f"DatabaseWrapper.{name}", user)
    assert inspect.signature(DatabaseWrapper.get_connection_params).bind(object()), user
    set_time_zone = DatabaseOperations.set_time_zone_sql(object())  # type: ignore[arg-type]
    assert set_time_zone.count("%s") == 1, _why(
        f"DatabaseOperations.set_time_zone_sql() to {set_time_zone!r}", user)


# --- the statements built by the ORM, against what the ORM sends ----------------------------------


@pytest.fixture(params=["default", pytest.param("postgres", marks=pytest.mark.postgres)],
                ids=["sqlite", "postgres"])
def alias(request: Any, require_service: Callable[..., None]) -> str:
    if request.param == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)",
                        lambda: "postgres" in settings.DATABASES)
    return str(request.param)


pytestmark_db = pytest.mark.django_db(databases=ALIASES)


@contextmanager
def sent(alias: str) -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    """The (sql, params) the ORM sends on ``alias`` in the block (public: execute_wrapper)."""
    statements: list[tuple[str, tuple[Any, ...]]] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        statements.append((sql, tuple(params or ())))
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(record):
        yield statements


def comparable(statements: list[tuple[str, tuple[Any, ...]]]) -> list[tuple[str, tuple[Any, ...]]]:
    """Statements whose parameters compare by value (psycopg's Jsonb wrapper has no ==)."""
    return [(sql, tuple(("Jsonb", p.obj) if type(p).__name__ == "Jsonb" else p for p in params))
            for sql, params in statements]


def make_generation(alias: str, **fields: Any) -> Generation:
    user = get_user_model().objects.db_manager(alias).create_user(
        f"u{uuid.uuid4().hex[:8]}", password="pw")
    conversation = Conversation.objects.using(alias).create(user=user, model="fast")
    prompt = Message.objects.using(alias).create(
        conversation=conversation, role=Message.Role.USER, content="Hi")
    fields.setdefault("status", Status.STREAMING)
    fields.setdefault("created_at", NOW)
    return Generation.objects.using(alias).create(
        conversation=conversation, user=user, prompt_message=prompt, model="fast",
        tool_calls=[{"id": "call_1", "arguments": "{}"}], upstream_params={"temperature": 0.5},
        **fields)


def values_of(instance: Model) -> dict[str, Any]:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def raw_row(alias: str, model: type[Model], pk: Any) -> tuple[Any, ...]:
    """The row as stored, read without the ORM's conversions."""
    connection = connections[alias]
    meta = model._meta
    pk_param = meta.pk.get_db_prep_value(pk, connection)  # type: ignore[union-attr]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in meta.concrete_fields)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {quote(meta.db_table)} "
                       f"WHERE {connection.ops.quote_name(meta.pk.column)} = %s",  # type: ignore[union-attr]
                       [pk_param])
        return tuple(cursor.fetchone())


def _stored(row: tuple[Any, ...], model: type[Model]) -> dict[str, Any]:
    """A raw row by column, without the primary key."""
    columns = [f.column for f in model._meta.concrete_fields]
    return {c: v for c, v in zip(columns, row, strict=True) if c != model._meta.pk.column}  # type: ignore[union-attr]


@pytestmark_db
def test_update_statement_is_the_sql_and_parameters_of_querysets_update(alias):
    generation = make_generation(alias)
    values = {"status": Status.COMPLETED, "content": "Done.", "completed_at": NOW,
              "tool_calls": [{"id": "call_2"}], "prompt_tokens": 12, "cancel_requested": True}
    lookup = {"pk": generation.pk}
    built = _sql.update_statement(alias, Generation, lookup, values)
    with sent(alias) as statements:
        assert Generation.objects.using(alias).filter(**lookup).update(**values) == 1
    assert comparable([built]) == comparable(statements), (
        "update_statement() no longer builds what QuerySet.update() sends: "
        + _why("UpdateQuery / SQLUpdateCompiler", "chatstream/store/_sql.py"))


@pytestmark_db
def test_update_statement_with_a_condition_on_null_is_the_orms(alias):
    """The quota settlement's update: ``settled_at__isnull=True`` in the lookup."""
    generation = make_generation(alias)
    charge = QuotaCharge.objects.using(alias).create(
        user=generation.user, generation_id=generation.pk, model="fast", at=NOW,
        prompt_estimate=10, max_tokens=100, reserved=110)
    lookup = {"pk": charge.pk, "settled_at__isnull": True}
    values = {"charged": 42, "source": QuotaCharge.Source.PROVIDER, "settled_at": NOW}
    built = _sql.update_statement(alias, QuotaCharge, lookup, values)
    with sent(alias) as statements:
        assert QuotaCharge.objects.using(alias).filter(**lookup).update(**values) == 1
    assert comparable([built]) == comparable(statements), _why("UpdateQuery / SQLUpdateCompiler",
                                       "chatstream/store/_sql.py")


def _masked(params: tuple[Any, ...]) -> tuple[Any, ...]:
    """Parameters with their timestamps masked (each build takes its own now())."""
    return tuple("<datetime>" if isinstance(p, datetime | str) and _is_time(p) else p
                 for p in params)


def _is_time(value: Any) -> bool:
    if isinstance(value, datetime):
        return True
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


@pytestmark_db
def test_reply_statement_is_what_bulk_create_with_update_conflicts_sends(alias):
    generation = make_generation(alias)
    sql, params = _sql.reply_statement(alias, generation, "The reply.")
    reply = Message(generation=generation, conversation_id=generation.conversation_id,
                    role=Message.Role.ASSISTANT, content="The reply.")
    with sent(alias) as statements:
        Message.objects.using(alias).bulk_create(
            [reply], update_conflicts=True, unique_fields=["generation"],
            update_fields=["content"])
    [(orm_sql, orm_params)] = statements
    # bulk_create() also asks for the new primary key back where the database can return it.
    orm_sql = orm_sql.partition(" RETURNING ")[0]
    ours, theirs = [(sql, _masked(params))], [(orm_sql, _masked(orm_params))]
    assert comparable(ours) == comparable(theirs), _why(
        "InsertQuery(on_conflict=OnConflict.UPDATE) / SQLInsertCompiler",
        "chatstream/store/_sql.py")
    # Sent again with other text, it updates the same row, as the ORM's upsert does.
    with connections[alias].cursor() as cursor:
        cursor.execute(*_sql.reply_statement(alias, generation, "Changed."))
    assert list(Message.objects.using(alias).filter(generation=generation)
                .values_list("content", flat=True)) == ["Changed."]


@pytestmark_db
def test_insert_statement_is_what_bulk_create_sends(alias):
    generation = make_generation(alias)
    rows = [Attempt(generation_id=generation.pk, number=n, model="fast", status=status,
                    http_status=code, error_type=kind, retry_after=wait, started_at=NOW)
            for n, status, code, kind, wait in ((1, "failed", 429, "http_429", 1.5),
                                                (2, "succeeded", 200, "", None))]
    sql, params = _sql.insert_statement(alias, Attempt, rows)
    with sent(alias) as statements:
        Attempt.objects.using(alias).bulk_create(rows)
    [(orm_sql, orm_params)] = statements
    orm_sql = orm_sql.partition(" RETURNING ")[0]  # bulk_create asks for the keys back
    assert comparable([(sql, params)]) == comparable([(orm_sql, tuple(orm_params))]), _why(
        "InsertQuery / SQLInsertCompiler", "chatstream/store/_sql.py")
    Attempt.objects.using(alias).all().delete()
    with connections[alias].cursor() as cursor:  # and it stores what the ORM stores
        cursor.execute(sql, params)
    assert list(Attempt.objects.using(alias).values_list("number", "status", "retry_after")
                ) == [(1, "failed", 1.5), (2, "succeeded", None)]


# --- the claim (written out) and the rows it returns, against the ORM -----------------------------


@pytestmark_db
def test_the_claim_stores_what_the_orms_update_stores_and_returns_the_row_the_orm_reads(
        alias, monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    ours, theirs = make_generation(alias, status=Status.PENDING), make_generation(
        alias, status=Status.PENDING)
    connection = connections[alias]
    assert _sql.updates_return_rows(connection)
    with connection.cursor() as cursor:
        cursor.execute(*_sql.claim_statement(alias, ours.pk, ours.user_id))
        [row] = cursor.fetchall()
    changes, where = _sql.claim_changes(theirs.pk, theirs.user_id)
    assert Generation.objects.using(alias).filter(
        **where, **_sql.active_user_lookup()).update(**changes) == 1
    # The values were prepared as the ORM prepares them: the same is stored (and the claim
    # found its row: its conditions' values were prepared as the ORM's).
    differ = {"conversation_id", "user_id", "prompt_message_id"}
    stored = [{c: v for c, v in _stored(raw_row(alias, Generation, g.pk), Generation).items()
               if c not in differ} for g in (ours, theirs)]
    assert stored[0] == stored[1]
    # The row returned is converted as the ORM converts what it reads.
    claimed = _sql.built(_sql.generation_from_row, alias, row)
    read = Generation.objects.using(alias).get(pk=ours.pk)
    assert values_of(claimed) == values_of(read), _why(
        "the converters of a column (ops.get_db_converters, Col.get_db_converters) or "
        "Model.from_db", "chatstream/store/_sql.py (instance_from_row)")
    assert claimed._state.db == alias and not claimed._state.adding
    assert isinstance(claimed.pk, uuid.UUID) and claimed.tool_calls == [
        {"id": "call_1", "arguments": "{}"}]


def _holds_of_since() -> Any:
    meta = QuotaCharge._meta
    return QuotaCharge.objects.filter(
        generation_id=_sql.Slot("generation", meta.get_field("generation_id")),
        at__gte=_sql.Slot("since", meta.get_field("at")))


@pytestmark_db
def test_a_statement_built_once_with_slots_reads_what_the_orm_reads(alias):
    """compiled() leaves each Slot among the compiler's parameters, in its place, and the
    statement's rows, converted by instance_from_row(), are what the ORM reads (the final
    save's settlement reads a hold so)."""
    generation = make_generation(alias)
    charge = QuotaCharge.objects.using(alias).create(
        user=generation.user, generation_id=generation.pk, model="fast", at=NOW,
        prompt_estimate=10, max_tokens=100, reserved=110)
    statement = _sql.built(_sql.compiled, alias, _holds_of_since)
    assert statement.sql.count("%s") == 2, _why(
        "a queryset's compiler (get_compiler().as_sql()) or how it compiles an expression",
        "chatstream/store/_sql.py (Slot, Compiled)")
    for since, found in ((NOW + timedelta(seconds=1), 0), (NOW - timedelta(seconds=1), 1)):
        with connections[alias].cursor() as cursor:
            cursor.execute(statement.sql, _sql.built(statement.params, {
                "generation": generation.pk, "since": since}))
            rows = cursor.fetchall()
        assert len(rows) == found
    converted = _sql.built(_sql.instance_from_row, QuotaCharge, alias, rows[0])
    assert values_of(converted) == values_of(
        QuotaCharge.objects.using(alias).get(pk=charge.pk)), _why(
        "the converters of a column or Model.from_db", "chatstream/store/_sql.py")
    assert converted.at == NOW and converted.generation_id == generation.pk


def test_updates_return_rows_where_sqlite_has_returning():
    assert _sql.updates_return_rows(connections["default"]) is (
        sqlite3.sqlite_version_info >= (3, 35))


# --- the ASGI front -------------------------------------------------------------------------------


def _scope(**extra: Any) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "https", "root_path": "/site", "path": "/site/chat/g/x/stream/",
        "raw_path": b"/site/chat/g/x/stream/", "query_string": b"ticket=t&after=3",
        "headers": [(b"host", b"testserver"), (b"cookie", b"sessionid=abc; csrftoken=t0k"),
                    (b"last-event-id", b"7"), (b"accept-language", b"fr")],
        "client": ("127.0.0.1", 1234), "server": ("testserver", 443),
    }
    scope.update(extra)
    return scope


def test_djangos_request_from_a_scope_has_what_the_front_reads(settings):
    """asgi.py makes Django's ASGIRequest from the scope, and reads these from it."""
    from django.core.handlers.asgi import ASGIRequest

    settings.ALLOWED_HOSTS = ["testserver"]
    request = ASGIRequest(_scope(), io.BytesIO())
    read = {"path_info": request.path_info, "last event": request.META.get("HTTP_LAST_EVENT_ID"),
            "cookies": dict(request.COOKIES), "host": request.get_host(),
            "secure": request.is_secure(), "language": request.META.get("HTTP_ACCEPT_LANGUAGE")}
    assert read == {"path_info": "/chat/g/x/stream/", "last event": "7",
                    "cookies": {"sessionid": "abc", "csrftoken": "t0k"}, "host": "testserver",
                    "secure": True, "language": "fr"}, _why("ASGIRequest", "chatstream/asgi.py")


@pytest.mark.parametrize("force_script_name, root_path", [
    (None, ""), (None, "/site"), ("/forced", "/site"), ("/forced/", ""), ("", "/site/")])
def test_the_fronts_script_prefix_is_the_one_djangos_asgi_handler_sets(
        settings, force_script_name, root_path):
    from django.core.handlers import asgi as handler
    from django.urls import get_script_prefix, set_script_prefix

    settings.FORCE_SCRIPT_NAME = force_script_name
    scope = _scope(root_path=root_path)
    before = get_script_prefix()
    try:
        djangos = getattr(handler, "get_script_prefix", None)
        assert djangos is not None, _why("core.handlers.asgi.get_script_prefix (how the "
                                         "handler computes the prefix)", "chatstream/asgi.py")
        set_script_prefix(djangos(scope))
        expected = get_script_prefix()
        set_script_prefix(asgi._script_prefix(scope))
        assert get_script_prefix() == expected
    finally:
        set_script_prefix(before)


def test_the_urlconfs_resolver_is_cached_and_renewed_when_url_caches_are_cleared():
    """asgi.py works out the stream path once per get_resolver() object."""
    from django.urls import clear_url_caches, get_resolver

    first = get_resolver()
    assert get_resolver() is first, _why("get_resolver() (no longer cached)", "chatstream/asgi.py")
    clear_url_caches()
    assert get_resolver() is not first, _why("get_resolver() (not renewed by clear_url_caches)",
                                             "chatstream/asgi.py")


def test_the_fronts_headers_are_the_ones_the_middleware_adds_to_a_view_response(settings):
    """_headers() runs only the response half of SecurityMiddleware and
    XFrameOptionsMiddleware; the headers are those the whole middleware adds."""
    from django.http import HttpResponse
    from django.middleware.clickjacking import XFrameOptionsMiddleware
    from django.middleware.security import SecurityMiddleware

    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_SSL_REDIRECT = False
    settings.MIDDLEWARE = [*settings.MIDDLEWARE]  # clears _headers' cache
    names = ("strict-transport-security", "x-content-type-options", "referrer-policy",
             "cross-origin-opener-policy", "x-frame-options")
    for secure in (True, False):
        request = RequestFactory().get("/", secure=secure)
        response = XFrameOptionsMiddleware(SecurityMiddleware(lambda r: HttpResponse()))(request)
        expected = {n: response.headers[n] for n in names if n in response.headers}
        ours = {n.decode(): v.decode() for n, v in asgi._headers(secure) if n.decode() in names}
        assert ours == expected, _why("SecurityMiddleware / XFrameOptionsMiddleware "
                                      "process_response", "chatstream/asgi.py (_headers)")
        assert ("strict-transport-security" in ours) is secure


def test_setting_changed_is_the_documented_signal():
    """asgi.py imports it from django.core.signals (django.test would be imported otherwise)."""
    from django.core.signals import setting_changed
    from django.test.signals import setting_changed as documented

    assert setting_changed is documented, _why("where setting_changed is defined",
                                               "chatstream/asgi.py")


def test_the_final_render_reads_the_pages_csrf_cookie():
    """The final message's {% csrf_token %} is one the page's CSRF cookie accepts."""
    from django.http import HttpResponse
    from django.middleware.csrf import get_token
    from django.views.decorators.csrf import csrf_protect

    cookie = "A" * 32
    scope = _scope(headers=[(b"host", b"testserver"), (b"cookie", f"csrftoken={cookie}".encode())])
    token = asgi._render_final(lambda request, generation: get_token(request), scope, None)
    post = RequestFactory().post("/", {"csrfmiddlewaretoken": token})
    post.COOKIES["csrftoken"] = cookie
    assert csrf_protect(lambda r: HttpResponse())(post).status_code == 200
    other = RequestFactory().post("/", {"csrfmiddlewaretoken": token})
    other.COOKIES["csrftoken"] = "B" * 32
    assert csrf_protect(lambda r: HttpResponse())(other).status_code == 403
