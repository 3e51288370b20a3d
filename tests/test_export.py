"""The user's data out and back in: a conversation's export (JSON, Markdown), all of a user's
data streamed, the admin's export action, and the import of the format (history only)."""

from __future__ import annotations

import json
import re
import tracemalloc
from datetime import timedelta
from io import StringIO
from typing import Any

import orjson
import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone, translation

from chatstream.domain import exports, imports
from chatstream.models import (
    Attempt,
    Conversation,
    Feedback,
    Generation,
    Message,
    QuotaCharge,
    ToolCall,
)

from .history import rich_history, user_in
from .workers import DATABASES


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def streamed(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def export_of(user: Any, using: str = "default") -> dict[str, Any]:
    return orjson.loads(b"".join(exports.iter_export(exports.of_user(user, using), user)))


def canonical(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The export's conversations with their ids replaced by their places: what a round trip
    must keep."""
    out = []
    for conversation in sorted(document["conversations"], key=lambda c: c["created_at"]):
        messages = {m["id"]: i for i, m in enumerate(conversation["messages"])}
        generations = {g["id"]: i for i, g in enumerate(conversation["generations"])}
        out.append({
            **{k: v for k, v in conversation.items() if k not in ("id", "messages",
                                                                    "generations")},
            "messages": [{**m, "id": None, "edit_of": messages.get(m["edit_of"]),
                          "generation": generations.get(m["generation"])}
                         for m in conversation["messages"]],
            "generations": [{
                **g, "id": None, "prompt_message": messages[g["prompt_message"]],
                "retry_of": generations.get(g["retry_of"]),
                "follows": generations.get(g["follows"]),
                "tool_calls": [{**c, "id": None} for c in g["tool_calls"]],
            } for g in conversation["generations"]],
        })
    return out


# --- the format ----------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_the_export_holds_every_row_of_the_history(database: str) -> None:
    alice = user_in(database)
    rich_history(alice, database)
    document = export_of(alice, database)
    assert document["format"] == "chatstream-export" and document["version"] == 1
    [conversation] = document["conversations"]
    assert len(conversation["messages"]) == 5 and len(conversation["generations"]) == 5
    edited = next(m for m in conversation["messages"] if m["edit_of"] is not None)
    assert edited["content"] == "And by train, from Paris?"
    answer = next(g for g in conversation["generations"] if g["attempts"])
    assert answer["cost"] == "0.0001234567" and answer["currency"] == "USD"
    assert answer["usage"] == {"prompt_tokens": 12, "cached_tokens": 2,
                               "completion_tokens": 30, "reasoning_tokens": 8,
                               "source": "provider"}
    assert answer["reasoning"] == "Paris to Lyon by road."
    assert [a["status"] for a in answer["attempts"]] == ["failed", "succeeded"]
    assert answer["attempts"][0]["retry_after"] == 1.5
    assert answer["feedback"]["rating"] == "good"
    assert answer["feedback"]["comment"] == "Right > wrong"
    [call] = [c for g in conversation["generations"] for c in g["tool_calls"]]
    assert call["status"] == "succeeded" and call["result"] == "2h01, every hour"
    assert "decided_by" not in call  # no user id of anyone's in the file
    statuses = sorted(g["status"] for g in conversation["generations"])
    assert statuses == ["completed"] * 4 + ["failed"]


@pytest.mark.django_db
def test_a_conversation_downloads_as_json_and_markdown_for_its_owner_only() -> None:
    alice, mallory = user_in("default"), user_in("default", "mallory")
    conversation = rich_history(alice, title='Lyon: "plans" / ../../etc')
    url = reverse("chatstream:conversation-export", kwargs={"pk": conversation.pk})
    response = logged_in(alice).get(url, {"format": "json"})
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    disposition = response["Content-Disposition"]
    assert disposition == f'attachment; filename="lyon-plans-etc-{str(conversation.pk)[:8]}.json"'
    assert orjson.loads(response.content)["conversations"][0]["title"] == conversation.title
    markdown = logged_in(alice).get(url, {"format": "markdown"})
    assert markdown.status_code == 200 and markdown["Content-Disposition"].endswith('.md"')
    assert logged_in(alice).get(url, {"format": "pdf"}).status_code == 400
    for other in ({"format": "json"}, {"format": "markdown"}):
        assert logged_in(mallory).get(url, other).status_code == 404
    assert Client().get(url).status_code == 302  # to the login page


@pytest.mark.django_db
def test_markdown_text_cannot_forge_the_exports_headings() -> None:
    alice = user_in("default")
    conversation = rich_history(alice, title="# Title\n## You")
    text = exports.conversation_markdown(
        exports.with_history(Conversation.objects.filter(pk=conversation.pk)).get())
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings[0] == r"# \# Title \#\# You"
    # Only the export's own: one per user message (three versions), one per reply (five).
    assert [h.rsplit(" (", 1)[0] for h in headings[1:]] == [
        "## You", "### Reply from fast, failed", "### Reply from fast, completed",
        "## You (a version edited later)", "### Reply from fast, completed",
        "## You", "### Reply from fast, completed", "### Reply from fast, completed"]
    # The user's text, its own headings and its carriage return, stays quoted.
    assert "> # Forged heading\n> How far is Lyon?\n> ## Reply from evil" in text
    assert "> About **470 km**." in text and "> Right > wrong" in text
    assert "*Tool call timetable, succeeded*" in text and "> 2h01, every hour" in text


@pytest.mark.django_db
def test_the_markdown_export_speaks_the_users_language() -> None:
    conversation = rich_history(user_in("default"))
    with translation.override("de"):
        text = exports.conversation_markdown(
            exports.with_history(Conversation.objects.filter(pk=conversation.pk)).get())
    facts = [line.split(":")[0] for line in text.splitlines() if line.startswith("- ")][:3]
    assert facts == ["- Modell", "- Erstellt", "- Exportiert"]
    assert "## Sie (" in text
@pytest.mark.django_db
def test_the_pages_link_to_the_exports() -> None:
    alice = user_in("default")
    conversation = rich_history(alice)
    client = logged_in(alice)
    listing = client.get(reverse("chatstream:conversation-list")).content.decode()
    assert f'href="{reverse("chatstream:data-export")}"' in listing
    assert "Export all my data" in listing
    page = client.get(conversation.get_absolute_url()).content.decode()
    export = reverse("chatstream:conversation-export", kwargs={"pk": conversation.pk})
    assert f'href="{export}?format=markdown"' in page and f'href="{export}?format=json"' in page


# --- all of a user's data, streamed --------------------------------------------------------

@pytest.mark.django_db
def test_all_data_is_streamed_as_one_file_of_the_users_conversations_only() -> None:
    alice, bob = user_in("default"), user_in("default", "bob")
    for i in range(exports.BATCH_SIZE + 3):
        rich_history(alice, title=f"mine {i}")
    rich_history(bob, title="not yours")
    response = logged_in(alice).get(reverse("chatstream:data-export"))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Disposition"].startswith('attachment; filename="chatstream-export-')
    chunks = list(response.streaming_content)
    assert len(chunks) == 4  # the opening, two batches, the closing
    document = orjson.loads(b"".join(chunks))
    titles = {c["title"] for c in document["conversations"]}
    assert len(titles) == exports.BATCH_SIZE + 3 and "not yours" not in titles
    assert document["user"] == {"username": "alice"}


def many_conversations(user: Any, count: int) -> None:
    """``count`` conversations of 10 questions and 10 replies each, cheaply."""
    now = timezone.now()
    conversations = Conversation.objects.bulk_create(
        Conversation(user=user, title=f"c{i}") for i in range(count))
    prompts = Message.objects.bulk_create(
        Message(conversation=c, role="user", content="question " * 40,
                created_at=now + timedelta(seconds=j))
        for c in conversations for j in range(10))
    Generation.objects.bulk_create(
        Generation(conversation_id=m.conversation_id, user=user, prompt_message=m,
                   model="fast", status="completed", content="answer " * 60)
        for m in prompts)


def measured(user: Any) -> tuple[list[int], int]:
    """The sizes of the export's chunks, and the most memory its generator held at once."""
    tracemalloc.start()
    try:
        sizes = [len(chunk) for chunk in exports.iter_export(exports.of_user(user), user)]
        return sizes, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.django_db
def test_the_streamed_export_holds_one_batch_at_a_time() -> None:
    """Thousands of messages: each chunk is one batch's, and the memory the export takes
    stays that of one batch whatever the size of the history (8 times more history, the
    same peak)."""
    small, large = user_in("default", "small"), user_in("default", "large")
    many_conversations(small, 40)
    many_conversations(large, 320)
    small_sizes, small_peak = measured(small)
    sizes, peak = measured(large)
    assert len(sizes) == 320 // exports.BATCH_SIZE + 2
    assert max(sizes) < sum(sizes) / 10
    assert sum(sizes) > 7 * sum(small_sizes)
    assert peak < 1.5 * small_peak, (peak, small_peak)


@pytest.mark.django_db(transaction=True)
def test_the_streamed_export_under_asgi(django_asgi_server: Any) -> None:
    import httpx

    from .conftest import Browser

    alice = user_in("default")
    for i in range(exports.BATCH_SIZE + 1):
        rich_history(alice, title=f"t{i}")
    browser = Browser(django_asgi_server.url, alice)
    try:
        with browser.client.stream("GET", reverse("chatstream:data-export")) as response:
            assert response.status_code == 200
            body = b"".join(response.iter_bytes())
    finally:
        browser.close()
    assert isinstance(response, httpx.Response)
    assert len(orjson.loads(body)["conversations"]) == exports.BATCH_SIZE + 1


# --- the admin's action --------------------------------------------------------------------

def staff_with(*codenames: str) -> Client:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user(f"staff{len(codenames)}", password="pw",
                                                is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(content_type__app_label="chatstream",
                                                         codename=codename))
    return logged_in(user)


@pytest.mark.django_db
def test_the_admin_exports_selected_conversations_with_the_content_permission(
        caplog: Any) -> None:
    alice = user_in("default")
    chosen, other = rich_history(alice, title="chosen"), rich_history(alice, title="other")
    url = reverse("admin:chatstream_conversation_changelist")
    data = {"action": "export_selected", "_selected_action": [str(chosen.pk)]}
    reader = staff_with("view_conversation", "view_generation_content")
    assert "Export selected conversations" in reader.get(url).content.decode()
    with caplog.at_level("INFO", logger="chatstream.admin"):
        response = reader.post(url, data)
    document = orjson.loads(streamed(response))
    assert [c["title"] for c in document["conversations"]] == ["chosen"]
    assert "content exported" in caplog.text and other.title not in caplog.text

    blind = staff_with("view_conversation")
    assert "Export selected conversations" not in blind.get(url).content.decode()
    refused = blind.post(url, data)
    assert refused.status_code in (200, 302) and not refused.streaming
    assert b"How far is Lyon" not in refused.content


# --- import --------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_a_round_trip_keeps_everything_but_ids_and_user(database: str, simulator: Any) -> None:
    alice, bob = user_in(database), user_in(database, "bob")
    rich_history(alice, database)
    first = export_of(alice, database)
    charges = QuotaCharge.objects.using(database).count()
    imported = imports.import_export(orjson.dumps(first), bob, using=database)
    assert imported.counts == {"conversations": 1, "messages": 5, "generations": 5,
                               "tool_calls": 1, "attempts": 2, "feedback": 1}
    again = export_of(bob, database)
    assert canonical(again) == canonical(first)
    assert again["user"] == {"username": "bob"}
    assert QuotaCharge.objects.using(database).count() == charges  # no charge for history
    assert simulator.requests == []
    assert Conversation.objects.using(database).filter(user=bob).count() == 1
    assert not Generation.objects.using(database).filter(user=bob, status__in=Generation.LIVE)
    # What the app reads besides the rows: the step's calls, the later step's exchange.
    step = Generation.objects.using(database).get(user=bob, finish_reason="tool_calls")
    assert step.tool_calls == [{"id": "c1", "type": "function", "name": "timetable",
                                "arguments": '{"from": "Paris"}'}]
    after = Generation.objects.using(database).get(user=bob, step=2)
    assert [m["role"] for m in after.upstream_messages] == ["user", "assistant", "tool"]
    assert ToolCall.objects.using(database).get(generation__user=bob).decided_by is None


@pytest.mark.django_db
def test_the_imported_conversation_opens_and_continues(simulator: Any) -> None:
    alice, bob = user_in("default"), user_in("default", "bob")
    rich_history(alice)
    imports.import_export(orjson.dumps(export_of(alice)), bob)
    conversation = Conversation.objects.get(user=bob)
    page = logged_in(bob).get(conversation.get_absolute_url())
    assert page.status_code == 200 and "About two hours by TGV." in page.content.decode()


def live_export() -> bytes:
    alice = user_in("default", "exporter")
    conversation = rich_history(alice)
    Generation.objects.filter(conversation=conversation, step=2).update(status="streaming",
                                                                        completed_at=None)
    ToolCall.objects.update(status=ToolCall.Status.PENDING_APPROVAL)
    generation = Generation.objects.get(conversation=conversation, step=2)
    ToolCall.objects.create(generation=generation, position=0, name="run",
                            status=ToolCall.Status.RUNNING)
    ToolCall.objects.create(generation=generation, position=1, name="later",
                            status=ToolCall.Status.APPROVED)
    return orjson.dumps(export_of(alice))


@pytest.mark.django_db
def test_an_import_ends_whatever_was_live_in_the_file() -> None:
    bob = user_in("default", "bob")
    imports.import_export(live_export(), bob)
    mine = Generation.objects.filter(user=bob)
    interrupted = mine.get(step=2)
    assert interrupted.status == "interrupted" and interrupted.error_type == "imported_live"
    assert interrupted.completed_at is not None
    assert interrupted.content == "About two hours by TGV."  # its text kept
    calls = dict(ToolCall.objects.filter(generation__user=bob).values_list("name", "status"))
    assert calls == {"timetable": "cancelled", "run": "lost", "later": "cancelled"}
    assert not QuotaCharge.objects.filter(user=bob).exists()


def document_with(change: Any) -> bytes:
    alice = user_in("default", "source")
    rich_history(alice)
    document = export_of(alice)
    change(document)
    return orjson.dumps(document)


def first_generation(document: dict[str, Any]) -> dict[str, Any]:
    return document["conversations"][0]["generations"][0]


HOSTILE = [
    pytest.param(lambda d: d.update(format="other"), "file.format: expected", id="format"),
    pytest.param(lambda d: d.update(version=2), "file.version: this version", id="version"),
    pytest.param(lambda d: d.update(version=True), "file.version", id="version-bool"),
    pytest.param(lambda d: d.update(conversations={}), "file.conversations: expected a list",
                 id="not-a-list"),
    pytest.param(lambda d: d["conversations"].append(7), "file.conversations[1]: expected an "
                 "object", id="not-an-object"),
    pytest.param(lambda d: d["conversations"][0].update(title="x" * 201),
                 "conversations[0].title: longer than 200", id="too-long"),
    pytest.param(lambda d: d["conversations"][0]["messages"][0].update(role="system\x00"),
                 "messages[0].role: expected one of", id="bad-role"),
    pytest.param(lambda d: d["conversations"][0]["messages"][0].update(content="a\x00b"),
                 "messages[0].content: a string may not hold a NUL", id="nul"),
    pytest.param(lambda d: first_generation(d).update(status="hacked"),
                 "generations[0].status: expected one of", id="bad-status"),
    pytest.param(lambda d: first_generation(d).update(cost="NaN"),
                 "generations[0].cost: expected a decimal", id="nan-cost"),
    pytest.param(lambda d: first_generation(d).update(cost=0.1),
                 "generations[0].cost: expected a decimal number as a string", id="float-cost"),
    pytest.param(lambda d: first_generation(d)["usage"].update(prompt_tokens=-1),
                 "usage.prompt_tokens: expected a whole number", id="negative-tokens"),
    pytest.param(lambda d: first_generation(d).update(created_at="yesterday"),
                 "generations[0].created_at: expected a date", id="bad-date"),
    # Dates the database stores in UTC: these pass the year's bounds only in their own offset.
    pytest.param(lambda d: first_generation(d).update(created_at="0001-01-01T00:00:00+01:00"),
                 "generations[0].created_at: expected a date and time from year 1 to 9999",
                 id="before-year-1-in-utc"),
    pytest.param(lambda d: d["conversations"][0].update(updated_at="9999-12-31T23:59:59-05:00"),
                 "conversations[0].updated_at: expected a date and time from year 1 to 9999",
                 id="after-year-9999-in-utc"),
    pytest.param(lambda d: d.update(version=1.0), "file.version", id="version-float"),
    pytest.param(lambda d: first_generation(d).update(step=0),
                 "generations[0].step: expected a step from 1", id="step-0"),
    pytest.param(lambda d: first_generation(d).update(prompt_message=10**6),
                 "generations[0].prompt_message: names no user message", id="dangling"),
    pytest.param(lambda d: first_generation(d).update(retry_of=first_generation(d)["id"]),
                 "generations[0].retry_of: names no other generation", id="self-retry"),
    pytest.param(lambda d: first_generation(d).pop("status"),
                 "generations[0].status: missing", id="missing"),
    pytest.param(lambda d: first_generation(d).update(feedback={"rating": "meh"}),
                 "feedback.rating: expected one of", id="bad-rating"),
    pytest.param(lambda d: d["conversations"][0]["messages"].reverse(),
                 "edit_of: names no earlier message", id="edit-before-original"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("change", "says"), HOSTILE)
def test_a_hostile_file_is_refused_whole_saying_what_and_where(change: Any, says: str) -> None:
    data = document_with(change)
    bob = user_in("default", "bob")
    with pytest.raises(imports.InvalidExport, match=re.escape(says)):
        imports.import_export(data, bob)
    assert not Conversation.objects.filter(user=bob).exists()
    assert not Message.objects.filter(conversation__user=bob).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("data", "says"), [
    (b"not json", "Not JSON"), (b"[]", "file: expected an object"),
    (b'{"format": "chatstream-export", "version": 1}', "file.conversations: missing"),
    (b" " * (imports.MAX_BYTES + 1), "the largest accepted"),
], ids=["not-json", "a-list", "no-conversations", "too-big"])
def test_a_file_that_is_not_an_export_is_refused(data: bytes, says: str) -> None:
    with pytest.raises(imports.InvalidExport, match=re.escape(says)):
        imports.import_export(data, user_in("default"))


@pytest.mark.django_db
def test_the_import_command(tmp_path: Any) -> None:
    source = tmp_path / "export.json"
    source.write_bytes(document_with(lambda d: None))
    bob = user_in("default", "bob")
    out = StringIO()
    call_command("chatstream_import", str(source), "--user", "bob", stdout=out)
    assert "1 conversation, 5 messages, 5 generations, 1 tool call, 2 attempts, 1 feedback" \
        in out.getvalue()
    assert Conversation.objects.filter(user=bob).count() == 1
    assert Attempt.objects.filter(generation__user=bob).count() == 2
    assert Feedback.objects.filter(user=bob).count() == 1
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "chatstream-export", "version": 9}))
    with pytest.raises(CommandError, match=r"bad\.json: nothing imported: file\.version"):
        call_command("chatstream_import", str(bad), "--user", "bob")
    with pytest.raises(CommandError, match="No user"):
        call_command("chatstream_import", str(source), "--user", "nobody")
    with pytest.raises(CommandError, match=r"missing\.json"):
        call_command("chatstream_import", str(tmp_path / "missing.json"), "--user", "bob")
