"""Migrations: every model change ships with its migration."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from .workers import DATABASES


@pytest.mark.django_db
def test_makemigrations_finds_no_model_change_without_a_migration():
    out = io.StringIO()
    try:
        call_command("makemigrations", "chatstream", check=True, dry_run=True, stdout=out,
                     stderr=out)
    except SystemExit:  # --check exits 1 when a migration is missing
        pytest.fail(f"The models changed without a migration:\n{out.getvalue()}")


# --- 0005: what earlier versions stored upstream, trimmed to the context budget -------------------

BEFORE_0005 = [("chatstream", "0004_generation_upstream_messages")]
WITH_0005 = [("chatstream", "0005_bounded_upstream_messages")]


def migrate_to(alias: str, targets: list[tuple[str, str]]) -> Any:
    """Migrate ``alias`` to ``targets``; the app registry of the models as they were then."""
    executor = MigrationExecutor(connections[alias])
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


def tokens(messages: list[dict[str, str]]) -> int:
    from chatstream.quota import estimate_prompt

    return estimate_prompt(messages)


@pytest.fixture(params=DATABASES)
def alias(request: Any, require_service: Any) -> str:
    if request.param == "postgres":
        require_service("PostgreSQL", lambda: "postgres" in django_settings.DATABASES)
    return request.param


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_0005_trims_stored_messages_to_the_budget_their_model_has_now_reversibly(alias, settings):
    settings.CHATSTREAM_CONTEXT_TOKENS = 1000
    settings.CHATSTREAM_MODELS = {"small": {"PROVIDER": "default", "MODEL": "fast",
                                            "CONTEXT_TOKENS": 300}}
    system = [{"role": "system", "content": "Be brief."}]
    turns = [[{"role": "user", "content": f"Question {i} " + "q" * 100},
              *([{"role": "assistant", "content": f"Answer {i} " + "a" * 100}] if i % 3 else [])]
             for i in range(40)]
    earlier = [m for turn in turns for m in turn]
    last = {"role": "user", "content": "The question being answered"}
    huge = {"role": "user", "content": "x" * 20_000}
    try:
        apps = migrate_to(alias, BEFORE_0005)
        user = apps.get_model("auth", "User").objects.using(alias).create(username="alice")
        Conversation = apps.get_model("chatstream", "Conversation")
        Message = apps.get_model("chatstream", "Message")
        Generation = apps.get_model("chatstream", "Generation")
        conversation = Conversation.objects.using(alias).create(user=user, model="small")
        prompt = Message.objects.using(alias).create(conversation=conversation, role="user",
                                                     content=last["content"])

        def row(model: str, status: str, messages: list[dict[str, str]]) -> Any:
            return Generation.objects.using(alias).create(
                conversation=conversation, user=user, prompt_message=prompt, model=model,
                status=status, upstream_messages=messages)

        rows = {
            "pending, own budget": row("small", "pending", [*system, *earlier, last]),
            "finished, model gone": row("gone", "cancelled", [*system, *earlier, last]),
            "no system prompt": row("small", "completed", [*earlier, last]),
            "streaming": row("small", "streaming", [*system, *earlier, last]),
            "within budget": row("small", "pending", [*system, *turns[-1], last]),
            "new message alone too big": row("small", "pending", [*system, *earlier, huge]),
            "before upstream_messages": row("small", "pending", []),
        }

        migrate_to(alias, WITH_0005)

        def read() -> dict[str, Any]:
            return {name: Generation.objects.using(alias).get(pk=g.pk).upstream_messages
                    for name, g in rows.items()}

        stored = read()
        migrate_to(alias, BEFORE_0005)
        assert read() == stored, "reversing 0005 changed rows"
    finally:  # the latest state, as every other test expects
        migrate_to(alias, MigrationExecutor(connections[alias]).loader.graph.leaf_nodes())

    def newest_turns_within(budget: int, head: list[dict[str, str]]) -> list[dict[str, str]]:
        kept: list[dict[str, str]] = []
        for turn in reversed(turns):
            if tokens([*head, *turn, *kept, last]) > budget:
                break
            kept = [*turn, *kept]
        return [*head, *kept, last]

    assert stored["pending, own budget"] == newest_turns_within(300, system)
    assert stored["finished, model gone"] == newest_turns_within(1000, system)
    assert stored["no system prompt"] == newest_turns_within(300, [])
    assert 1 < len(stored["pending, own budget"]) < len(stored["finished, model gone"]) < 60
    assert stored["streaming"] == [*system, *earlier, last]  # in flight: what it was sent
    assert stored["within budget"] == [*system, *turns[-1], last]
    assert stored["new message alone too big"] == [*system, huge]
    assert stored["before upstream_messages"] == []



# --- 0014: conversation search's PostgreSQL indexes on the words of code-like text ------------

BEFORE_0014 = [("chatstream", "0013_search")]


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_0014_remakes_the_postgres_search_indexes_reversibly_and_leaves_sqlite_alone(alias):
    from django.contrib.auth import get_user_model
    from django.core.checks import run_checks

    from chatstream.domain import search, search_index
    from chatstream.models import Conversation, Message

    connection = connections[alias]
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    alice = get_user_model().objects.db_manager(alias).create_user("alice")
    talk = Conversation.objects.using(alias).create(user=alice, title="List<String>")
    Message.objects.using(alias).create(conversation=talk, role="user", content="Center a <div>")

    def search_warnings() -> list[str]:
        return [m.id for m in run_checks(databases=[alias]) if m.id.endswith("037")]

    try:
        migrate_to(alias, BEFORE_0014)
        stale = [search_index.MESSAGE_INDEX, search_index.TITLE_INDEX]
        assert search_index.missing(connection) == (stale if alias == "postgres" else [])
        assert search_warnings() == []  # migrate, not chatstream_rebuild_search, mends it
        migrate_to(alias, latest)
        assert search_index.missing(connection) == [] and search_warnings() == []
        assert [hit.conversation.pk for hit in search.search(alice, "div")] == [talk.pk]
        assert [hit.conversation.pk for hit in search.search(alice, "string")] == [talk.pk]
    finally:
        migrate_to(alias, latest)
