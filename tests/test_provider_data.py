"""What a provider sends is stored safely, on SQLite and on PostgreSQL, and the final save keeps
the reply's text even when it fails.

The provider's metadata (finish_reason, model name, request id) is cut to its column and made
printable; what no database takes (NUL) is stored as U+FFFD; a final save the database refuses,
or whose connection drops, still ends the row with its text and settles its quota hold. Each
reply is run with ``chatstream.api`` against the simulator, on the database under test (a
router sends every model there).
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from chatstream import api, store
from chatstream.models import Conversation, Generation, Message, QuotaCharge
from chatstream.stream import _storable
from chatstream.testing import DEFAULT_TEXT, Script

from .conftest import in_thread
from .workers import ROUTE_TO_POSTGRES

ALIASES = ["default", *(["postgres"] if "postgres" in django_settings.DATABASES else [])]
pytestmark = pytest.mark.django_db(transaction=True, databases=ALIASES)

Status = Generation.Status
REPLACED = _storable.REPLACEMENT


@pytest.fixture(params=["default", pytest.param("postgres", marks=pytest.mark.postgres)],
                ids=["sqlite", "postgres"])
def alias(request: Any, settings: Any, require_service: Any) -> str:
    if request.param == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)",
                        lambda: "postgres" in django_settings.DATABASES)
        settings.DATABASE_ROUTERS = [ROUTE_TO_POSTGRES]
    return str(request.param)


def pending(alias: str) -> Generation:
    """A user's message and the pending generation answering it, with its quota hold."""
    user = get_user_model().objects.db_manager(alias).create_user(f"u{uuid.uuid4().hex[:8]}")
    conversation = Conversation.objects.using(alias).create(user=user, title="t")
    message = Message.objects.using(alias).create(conversation=conversation, role="user",
                                                  content="Hi")
    generation = Generation.objects.using(alias).create(
        conversation=conversation, user=user, prompt_message=message, model="test",
        upstream_messages=[{"role": "user", "content": "Hi"}])
    QuotaCharge.objects.using(alias).create(
        user=user, generation_id=generation.pk, model="test", at=timezone.now(),
        prompt_estimate=4, max_tokens=1000, reserved=100_000)
    return generation


def run(generation: Generation) -> tuple[Generation, str]:
    """Run ``generation`` to its end as ``api.astream`` does, on an event loop of its own
    (whose database pools close after): the row as stored, and the text the stream gave."""
    async def stream() -> str:
        try:
            return "".join([piece async for piece in api.astream(generation)])
        finally:
            await store.aclose()

    shown = in_thread(async_to_sync(stream))
    return Generation.objects.get(pk=generation.pk), shown


def use(settings: Any, spec: str) -> None:
    settings.CHATSTREAM_MODELS = {"test": {"PROVIDER": "default", "MODEL": spec}}


# --- the provider's metadata ----------------------------------------------------------------------


@pytest.mark.parametrize(("option", "sent", "column", "stored"), [
    ("finish_reason", "x" * 41, "finish_reason", "x" * 40),
    ("finish_reason", "stop\ngeneration status=ok", "finish_reason",
     f"stop{REPLACED}generation status=ok"),
    ("response_model", "m" * 201, "provider_model", "m" * 200),
    ("response_model", "gpt\n\x1b[0m\u2028\u202e", "provider_model",
     f"gpt{REPLACED * 2}[0m{REPLACED * 2}"),
    ("request_id", "r" * 201, "request_id", "r" * 200),
    ("request_id", "req\x85\x1b[2J\tend", "request_id", f"req{REPLACED * 2}[2J{REPLACED}end"),
], ids=["long-finish-reason", "finish-reason-with-a-newline", "long-model",
        "model-with-controls", "long-request-id", "request-id-with-controls"])
def test_provider_metadata_is_stored_cut_to_its_column_and_printable(
        alias, settings, simulator, option, sent, column, stored):
    use(settings, "fast?" + urlencode({option: sent}))
    generation, shown = run(pending(alias))
    assert generation.status == Status.COMPLETED, generation.reason
    assert generation.content == shown == DEFAULT_TEXT
    assert getattr(generation, column) == stored


def test_text_no_database_takes_is_stored_as_it_was_shown(alias, settings, simulator):
    """NUL, which PostgreSQL's text and jsonb refuse, in the reply, its reasoning and its tool
    calls: the stream shows U+FFFD in its place (one character for one: the stream's ids hold)
    and stores the same."""
    simulator.register("nul", Script(
        text="Hello\x00world", reasoning="I\x00think", tool_calls=(("get\x00it", '{"q": "\x00"}'),),
        finish_reason="tool_calls", tokens_per_second=0, first_token_delay=0))
    use(settings, "nul")
    generation, shown = run(pending(alias))
    assert generation.status == Status.COMPLETED, generation.reason
    assert generation.content == shown == f"Hello{REPLACED}world"
    assert generation.reasoning == f"I{REPLACED}think"
    assert [(c["name"], c["arguments"]) for c in generation.tool_calls] == [
        (f"get{REPLACED}it", f'{{"q": "{REPLACED}"}}')]
    assert Message.objects.get(generation=generation).content == shown


def test_every_provider_fed_column_takes_whatever_the_provider_sent(alias):
    """The final save's fields as the provider could make them, fitted (chatstream.stream.
    _storable): the store saves them on either database, each within its column."""
    generation = pending(alias)
    Generation.objects.filter(pk=generation.pk).update(status=Status.STREAMING)
    hostile = {
        "status": Status.COMPLETED, "completed_at": timezone.now(), "heartbeat_at": None,
        "content": "a\x00b\ud800c", "reasoning": "\udfff\x00",
        "finish_reason": "f\x00\n" * 100, "provider_model": "\ud83d" * 300,
        "request_id": "\x00" * 300, "usage_source": Generation.UsageSource.PROVIDER,
        "tool_calls": [{"id": "\x00", "type": "\ud800", "name": "n" * 10_000,
                        "arguments": "\x00", "\x00": [math.nan, math.inf, 2**70]}],
        "http_status": 99_999, "prompt_tokens": 2**40, "completion_tokens": -1,
        "cached_tokens": 2**31, "reasoning_tokens": 7,
    }

    async def save() -> None:
        try:
            await store.for_alias(alias).finish(generation, _storable.fit(Generation, hostile))
        finally:
            await store.aclose()

    in_thread(async_to_sync(save))
    stored = Generation.objects.get(pk=generation.pk)
    assert stored.status == Status.COMPLETED
    assert (stored.content, stored.reasoning) == (f"a{REPLACED}b{REPLACED}c", REPLACED * 2)
    assert stored.finish_reason == f"f{REPLACED * 2}" * 13 + "f"
    assert (stored.provider_model, stored.request_id) == (REPLACED * 200, REPLACED * 200)
    assert stored.tool_calls == [{"id": REPLACED, "type": REPLACED, "name": "n" * 10_000,
                                  "arguments": REPLACED, REPLACED: [None, None, 2**70]}]
    assert (stored.http_status, stored.prompt_tokens, stored.completion_tokens) == (None,) * 3
    assert (stored.cached_tokens, stored.reasoning_tokens) == (None, 7)


# --- when the final save fails anyway -------------------------------------------------------------

REFUSED = "refused-model"  # the provider's model name that makes the database refuse the save


@pytest.fixture
def refusing(alias: str) -> Iterator[None]:
    """A trigger that refuses to save a generation naming the model REFUSED (which the fallback
    save does not write)."""
    table = Generation._meta.db_table
    with connections[alias].cursor() as cursor:
        if alias == "postgres":
            cursor.execute("CREATE FUNCTION cs_refuse() RETURNS trigger AS $$ BEGIN "
                           "RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql")
            cursor.execute(f"CREATE TRIGGER cs_refuse BEFORE UPDATE ON {table} FOR EACH ROW "
                           f"WHEN (NEW.provider_model = '{REFUSED}') "
                           "EXECUTE FUNCTION cs_refuse()")
        else:
            cursor.execute(f"CREATE TRIGGER cs_refuse BEFORE UPDATE ON {table} "
                           f"WHEN NEW.provider_model = '{REFUSED}' "
                           "BEGIN SELECT RAISE(ABORT, 'refused'); END")
    try:
        yield
    finally:
        with connections[alias].cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS cs_refuse" + (
                f" ON {table}" if alias == "postgres" else ""))
            if alias == "postgres":
                cursor.execute("DROP FUNCTION IF EXISTS cs_refuse()")


def assert_kept(generation: Generation, shown: str, caplog: pytest.LogCaptureFixture) -> None:
    """The reply ended with its outcome and text, its hold settled, the failure logged (in our
    words only)."""
    assert generation.status == Status.COMPLETED and generation.content == shown == DEFAULT_TEXT
    assert generation.completed_at is not None and generation.heartbeat_at is None
    assert generation.provider_model == "" and generation.finish_reason == ""  # not saved
    assert Message.objects.get(generation=generation).content == shown
    charge = QuotaCharge.objects.get(generation_id=generation.pk)
    assert charge.settled_at is not None and generation.usage_source == "provider"
    assert charge.charged == generation.prompt_tokens + generation.completion_tokens
    failures = [r for r in caplog.records if r.name == "chatstream.lifecycle"
                and r.levelno == logging.ERROR and str(generation.pk) in r.getMessage()]
    assert len(failures) == 1 and "the final save failed" in failures[0].getMessage()
    assert REFUSED not in failures[0].getMessage() and failures[0].exc_info is None


def test_a_final_save_the_database_refuses_still_keeps_the_text_and_settles_the_hold(
        alias, settings, simulator, refusing, caplog):
    use(settings, f"fast?response_model={REFUSED}")
    generation, shown = run(pending(alias))
    assert_kept(generation, shown, caplog)


@pytest.mark.postgres
def test_a_final_save_whose_connection_drops_still_keeps_the_text_and_settles_the_hold(
        settings, simulator, caplog, require_service):
    require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)",
                    lambda: "postgres" in django_settings.DATABASES)
    settings.DATABASE_ROUTERS = [ROUTE_TO_POSTGRES]
    table = Generation._meta.db_table
    with connections["postgres"].cursor() as cursor:
        # The final save's own connection is ended by the server in the middle of its update.
        cursor.execute("CREATE FUNCTION cs_drop() RETURNS trigger AS $$ BEGIN "
                       "PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NEW; END $$ "
                       "LANGUAGE plpgsql")
        cursor.execute(f"CREATE TRIGGER cs_drop BEFORE UPDATE ON {table} FOR EACH ROW "
                       f"WHEN (NEW.provider_model = '{REFUSED}') EXECUTE FUNCTION cs_drop()")
    try:
        use(settings, f"fast?response_model={REFUSED}")
        generation, shown = run(pending("postgres"))
    finally:
        with connections["postgres"].cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS cs_drop ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS cs_drop()")
    assert_kept(generation, shown, caplog)
