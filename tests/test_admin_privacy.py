"""What the admin shows of users' text to staff without ``chatstream.view_generation_content``.

Every Django admin page that can name a chatstream object (autocomplete, history, delete
confirmation, lists, the recent actions on the index) names it with ``str()``, and LogEntry
keeps that ``str()`` for good. So no model's ``str()`` holds text, and the pages that show text
to those allowed to read it do so through their own, permission-guarded columns and fields.
Each test plants ``TOPSECRET`` in every place a user or a model writes text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models import Model
from django.http import HttpResponse, StreamingHttpResponse
from django.urls import reverse
from django.utils import timezone

from chatstream.models import (
    Attempt,
    Conversation,
    Cooldown,
    Feedback,
    Generation,
    GroupQuota,
    Message,
    QuotaAccount,
    QuotaCharge,
    ToolCall,
    UserQuota,
)

pytestmark = pytest.mark.django_db

SECRET = "TOPSECRET"
TITLE = "TOPSECRET-TITLE of a chat about plans"
PROMPT = "TOPSECRET-PROMPT what is the plan?"
REPLY = "TOPSECRET-REPLY the plan is to wait."
TOOL_ARGUMENTS = '{"query": "TOPSECRET-TOOL"}'
SENT_UPSTREAM = "TOPSECRET-UPSTREAM what is the plan?"
COMMENT = "TOPSECRET-COMMENT waiting is not a plan"

# Every view permission on chatstream's models, and then the one that opens the text.
METADATA = ("chatstream.view_conversation", "chatstream.view_message",
            "chatstream.view_generation", "chatstream.view_feedback", "chatstream.view_userquota",
            "chatstream.view_groupquota", "chatstream.view_quotaaccount",
            "chatstream.view_quotacharge")
CONTENT = (*METADATA, "chatstream.view_generation_content")


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user("alice", "alice@example.com", "pw")


@pytest.fixture
def exchange(alice: Any) -> Generation:
    """One question and its reply, with text in every field that can hold it."""
    conversation = Conversation.objects.create(user=alice, title=TITLE, model="fast")
    prompt = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                    content=PROMPT)
    now = timezone.now()
    generation = Generation.objects.create(
        conversation=conversation, user=alice, prompt_message=prompt, model="fast",
        status=Generation.Status.COMPLETED, content=REPLY, request_id="req-1",
        tool_calls=[{"id": "call_1", "type": "function",
                     "function": {"name": "lookup", "arguments": TOOL_ARGUMENTS}}],
        upstream_messages=[{"role": "user", "content": SENT_UPSTREAM}],
        created_at=now, started_at=now, first_token_at=now, completed_at=now,
    )
    Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT,
                           content=REPLY, generation=generation)
    Feedback.objects.create(generation=generation, user=alice, rating=Feedback.Rating.BAD,
                            comment=COMMENT)
    return generation


@pytest.fixture
def staff() -> Callable[..., Any]:
    """A staff member holding exactly the given permissions (``app_label.codename``)."""
    made = iter(range(1000))

    def make(*perms: str) -> Any:
        user = get_user_model().objects.create_user(f"reviewer{next(made)}", password="pw",
                                                    is_staff=True)
        for perm in perms:
            app_label, codename = perm.split(".")
            user.user_permissions.add(Permission.objects.get(
                content_type__app_label=app_label, codename=codename))
        return get_user_model().objects.get(pk=user.pk)  # no stale permission cache

    return make


@pytest.fixture
def login(client: Any, staff: Callable[..., Any]) -> Callable[..., Any]:
    def as_staff(*perms: str) -> Any:
        client.force_login(staff(*perms))
        return client

    return as_staff


def body(response: HttpResponse | StreamingHttpResponse) -> str:
    if isinstance(response, StreamingHttpResponse):
        return b"".join(response.streaming_content).decode()  # type: ignore[arg-type]
    return response.content.decode()


# --- str() ---------------------------------------------------------------------------------------


def every_record(exchange: Generation) -> Iterator[Model]:
    """One saved instance of each chatstream model, around ``exchange``."""
    alice = exchange.user
    yield exchange
    yield exchange.conversation
    yield from exchange.conversation.messages.all()
    yield exchange.feedback.get()
    yield UserQuota.objects.create(user=alice, note="raised for the pilot")
    yield GroupQuota.objects.create(group=Group.objects.create(name="pilots"))
    yield QuotaAccount.objects.create(user=alice)
    yield QuotaCharge.objects.create(user=alice, generation_id=exchange.pk, model="fast",
                                     at=timezone.now(), prompt_estimate=10, max_tokens=100,
                                     reserved=110)
    yield ToolCall.objects.create(generation=exchange, position=0, name=SECRET,
                                  arguments=SECRET, result=SECRET, error=SECRET,
                                  status=ToolCall.Status.FAILED)
    yield Attempt.objects.create(generation=exchange, number=1, model="fast",
                                 status=Attempt.Status.SUCCEEDED, http_status=200,
                                 error_type=SECRET[:50])
    yield Cooldown.objects.create(model="fast", until=timezone.now(), error_type="http_error")


def test_no_models_str_holds_conversation_text(exchange: Generation) -> None:
    records = list(every_record(exchange))
    assert {type(record) for record in records} == set(
        apps.get_app_config("chatstream").get_models())  # a new model must be listed here
    for record in records:
        assert SECRET not in str(record), type(record).__name__


def test_conversation_and_message_are_named_by_id(exchange: Generation) -> None:
    conversation = exchange.conversation
    assert str(conversation) == f"Conversation {str(conversation.pk)[:8]}"
    prompt = exchange.prompt_message
    assert str(prompt) == f"Message {prompt.pk} (user)"


def test_admin_log_entries_keep_no_text(exchange: Generation, staff: Callable[..., Any]
                                        ) -> None:
    # LogEntry stores str() when the action happens: whoever logs it, it must hold no text.
    reviewer = staff(*CONTENT)
    objects = [exchange.conversation, exchange.prompt_message, exchange]
    for obj in objects:
        LogEntry.objects.log_actions(reviewer.pk, [obj], CHANGE, single_object=True)
    reprs = list(LogEntry.objects.values_list("object_repr", flat=True))
    assert len(reprs) == len(objects)
    assert not [text for text in reprs if SECRET in text]


# --- autocomplete ----------------------------------------------------------------------------


def autocomplete_pairs() -> list[tuple[str, str, str]]:
    """Every (app, model, field) the autocomplete view resolves to a chatstream model.

    The view takes a relation of any installed model and answers with the related model's
    admin search and ``str()``; the source model need not be registered. (Django fails on a
    reverse relation before it runs a query, so only forward ones answer.)
    """
    pairs = []
    for model in apps.get_models():
        for field in model._meta.get_fields():
            remote = getattr(getattr(field, "remote_field", None), "model", None)
            if not field.concrete or not (isinstance(remote, type) and issubclass(remote, Model)):
                continue
            if remote._meta.app_label == "chatstream":
                pairs.append((model._meta.app_label, model._meta.model_name or "", field.name))
    return pairs


PAIRS = autocomplete_pairs()


def autocomplete(client: Any, pair: tuple[str, str, str], term: str = "") -> Any:
    app_label, model_name, field_name = pair
    return client.get(reverse("admin:autocomplete"), {
        "app_label": app_label, "model_name": model_name, "field_name": field_name,
        "term": term})


def test_autocomplete_pairs_include_the_conversation_fields() -> None:
    assert {("chatstream", "generation", "conversation"),
            ("chatstream", "message", "conversation"),
            ("chatstream", "generation", "retry_of"),
            ("chatstream", "message", "generation")} <= set(PAIRS)


@pytest.mark.parametrize("pair", PAIRS, ids=[".".join(pair) for pair in PAIRS])
def test_autocomplete_shows_no_text_without_content_permission(
    login: Callable[..., Any], exchange: Generation, pair: tuple[str, str, str]
) -> None:
    client = login(*METADATA)
    response = autocomplete(client, pair)
    assert SECRET not in body(response)
    assert response.status_code in (200, 403)
    if pair[2] == "conversation":  # answers, and with this conversation
        results = response.json()["results"]
        assert str(exchange.conversation_id) in {result["id"] for result in results}


@pytest.mark.parametrize("pair", PAIRS, ids=[".".join(pair) for pair in PAIRS])
@pytest.mark.parametrize("term", ["TOPSECRET-TITLE", "TOPSECRET-PROMPT", "TOPSECRET-REPLY",
                                  "TOPSECRET-TOOL", "TOPSECRET-UPSTREAM"])
def test_autocomplete_search_does_not_match_text_without_content_permission(
    login: Callable[..., Any], exchange: Generation, pair: tuple[str, str, str], term: str
) -> None:
    response = autocomplete(login(*METADATA), pair, term)
    if response.status_code == 200:
        assert response.json()["results"] == []


def test_autocomplete_finds_conversations_by_title_with_content_permission(
    login: Callable[..., Any], exchange: Generation
) -> None:
    client = login(*CONTENT)
    for pair in [("chatstream", "generation", "conversation"),
                 ("chatstream", "message", "conversation")]:
        results = autocomplete(client, pair, "TOPSECRET-TITLE").json()["results"]
        assert [result["id"] for result in results] == [str(exchange.conversation_id)]


def test_autocomplete_finds_conversations_by_user_without_content_permission(
    login: Callable[..., Any], exchange: Generation
) -> None:
    response = autocomplete(login(*METADATA), ("chatstream", "generation", "conversation"),
                            "alice@")
    results = response.json()["results"]
    assert results == [{"id": str(exchange.conversation_id),
                        "text": f"Conversation {str(exchange.conversation_id)[:8]}"}]


# --- pages -----------------------------------------------------------------------------------


def pages(exchange: Generation) -> dict[str, str]:
    """Every admin page that can show something of ``exchange``."""
    conversation, generation = exchange.conversation_id, exchange.pk
    return {
        "index": reverse("admin:index"),
        "app index": reverse("admin:app_list", args=["chatstream"]),
        "conversation list": reverse("admin:chatstream_conversation_changelist"),
        "conversation": reverse("admin:chatstream_conversation_change", args=[conversation]),
        "conversation history": reverse("admin:chatstream_conversation_history",
                                        args=[conversation]),
        "generation list": reverse("admin:chatstream_generation_changelist"),
        "generation list by conversation": (
            reverse("admin:chatstream_generation_changelist")
            + f"?conversation__id__exact={conversation}"),
        "generation": reverse("admin:chatstream_generation_change", args=[generation]),
        "generation history": reverse("admin:chatstream_generation_history",
                                      args=[generation]),
        "summary": reverse("admin:chatstream_generation_summary"),
        "csv": reverse("admin:chatstream_generation_export_csv"),
        "jsonl": reverse("admin:chatstream_generation_export_jsonl"),
        "quota accounts": reverse("admin:chatstream_quotaaccount_changelist"),
        "quota charges": reverse("admin:chatstream_quotacharge_changelist"),
        "user quotas": reverse("admin:chatstream_userquota_changelist"),
        "feedback list": reverse("admin:chatstream_feedback_changelist"),
        "feedback": reverse("admin:chatstream_feedback_change",
                            args=[exchange.feedback.get().pk]),
    }


PAGE_NAMES = ["index", "app index", "conversation list", "conversation", "conversation history",
              "generation list", "generation list by conversation", "generation",
              "generation history", "summary", "csv", "jsonl", "quota accounts", "quota charges",
              "user quotas", "feedback list", "feedback"]


@pytest.fixture
def logged(exchange: Generation, staff: Callable[..., Any]) -> Any:
    """Log entries on every chatstream object of ``exchange``, as a host site's code may write.

    The entries belong to a reviewer who once could read the text: they appear on the
    objects' history pages and in that reviewer's recent actions.
    """
    reviewer = staff(*METADATA)
    for obj in [exchange.conversation, *exchange.conversation.messages.all(), exchange]:
        LogEntry.objects.log_actions(reviewer.pk, [obj], CHANGE, single_object=True)
    return reviewer


@pytest.mark.parametrize("name", PAGE_NAMES)
def test_admin_pages_show_no_text_without_content_permission(
    client: Any, exchange: Generation, logged: Any, name: str
) -> None:
    assert set(pages(exchange)) == set(PAGE_NAMES)
    client.force_login(logged)  # their own recent actions name these objects on the index
    response = client.get(pages(exchange)[name])
    assert response.status_code in (200, 403), name
    assert SECRET not in body(response)


def test_conversation_history_is_refused_without_content_permission(
    client: Any, exchange: Generation, logged: Any
) -> None:
    client.force_login(logged)
    assert client.get(pages(exchange)["conversation history"]).status_code == 403
    assert client.get(pages(exchange)["generation history"]).status_code == 200


def test_recent_actions_name_objects_by_id(client: Any, exchange: Generation, logged: Any
                                           ) -> None:
    client.force_login(logged)
    html = body(client.get(reverse("admin:index")))
    assert f"Conversation {str(exchange.conversation_id)[:8]}" in html
    assert f"Message {exchange.prompt_message_id} (user)" in html


@pytest.mark.parametrize(("name", "texts"), [
    ("conversation list", [TITLE]),
    ("conversation", [TITLE, PROMPT, REPLY]),
    ("conversation history", [TITLE]),
    ("generation", [SENT_UPSTREAM, REPLY, "TOPSECRET-TOOL", COMMENT]),
    ("jsonl", [TITLE, PROMPT, REPLY, "TOPSECRET-TOOL", COMMENT]),
    ("feedback list", [COMMENT]),
    ("feedback", [COMMENT]),
])
def test_admin_pages_still_show_text_with_content_permission(
    login: Callable[..., Any], exchange: Generation, name: str, texts: list[str]
) -> None:
    response = login(*CONTENT).get(pages(exchange)[name])
    assert response.status_code == 200
    html = body(response)
    if name == "jsonl":
        html = json.dumps(json.loads(html.splitlines()[0]), ensure_ascii=False)
    for text in texts:
        assert text in html, text


def test_conversation_list_with_titles_is_audited(
    login: Callable[..., Any], exchange: Generation, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="chatstream.admin")
    url = pages(exchange)["conversation list"]
    login(*METADATA).get(url)
    assert "content" not in caplog.text
    login(*CONTENT).get(url, {"q": "alice"})
    assert "content listed by 'reviewer1'" in caplog.text and "q=alice" in caplog.text
    assert SECRET not in caplog.text


@pytest.mark.parametrize(("url_name", "lookup"), [
    ("conversation", "title__icontains"),
    ("conversation", "messages__content__icontains"),
    ("conversation", "generations__content__icontains"),
    ("generation", "content__icontains"),
    ("generation", "tool_calls__icontains"),
    ("generation", "upstream_messages__icontains"),
    ("generation", "conversation__title__icontains"),
    ("generation", "prompt_message__content__icontains"),
    ("generation", "reply__content__icontains"),
])
def test_text_lookups_in_the_url_are_refused_without_content_permission(
    login: Callable[..., Any], exchange: Generation, url_name: str, lookup: str
) -> None:
    url = reverse(f"admin:chatstream_{url_name}_changelist")
    assert login(*METADATA).get(url, {lookup: SECRET}).status_code == 400


@pytest.mark.parametrize("url_name", ["conversation", "generation"])
@pytest.mark.parametrize("term", ["TOPSECRET-TITLE", "TOPSECRET-PROMPT", "TOPSECRET-REPLY"])
def test_list_search_does_not_match_text_without_content_permission(
    login: Callable[..., Any], exchange: Generation, url_name: str, term: str
) -> None:
    response = login(*METADATA).get(reverse(f"admin:chatstream_{url_name}_changelist"),
                                    {"q": term})
    assert list(response.context["cl"].result_list) == []


# --- deleting: the confirmation page lists every related object by str() --------------------------


@pytest.fixture
def deletable(monkeypatch: pytest.MonkeyPatch) -> None:
    """chatstream's records as a host site may let its staff delete them."""
    for model in (Conversation, Generation):
        monkeypatch.setattr(admin.site.get_model_admin(model), "has_delete_permission",
                            lambda request, obj=None: True)


def test_conversation_delete_page_lists_no_text(
    login: Callable[..., Any], exchange: Generation, deletable: None
) -> None:
    url = reverse("admin:chatstream_conversation_delete", args=[exchange.conversation_id])
    response = login(*METADATA).get(url)
    assert response.status_code == 200
    html = body(response)
    assert SECRET not in html
    assert f"Message {exchange.prompt_message_id} (user)" in html  # the list is there


def test_user_delete_page_lists_no_text(login: Callable[..., Any], exchange: Generation,
                                        deletable: None) -> None:
    url = reverse("admin:auth_user_delete", args=[exchange.user_id])
    response = login(*METADATA, "auth.view_user", "auth.delete_user").get(url)
    assert response.status_code == 200
    html = body(response)
    assert SECRET not in html
    assert f"Conversation {str(exchange.conversation_id)[:8]}" in html  # the list is there


def test_deleting_a_conversation_leaves_no_text_in_the_log_or_recent_actions(
    client: Any, staff: Callable[..., Any], exchange: Generation, deletable: None
) -> None:
    reviewer = staff(*CONTENT)
    client.force_login(reviewer)
    url = reverse("admin:chatstream_conversation_delete", args=[exchange.conversation_id])
    done = client.post(url, {"post": "yes"}, follow=True)
    assert not Conversation.objects.exists()
    assert SECRET not in body(done)  # the "was deleted" message
    assert SECRET not in LogEntry.objects.get(user=reviewer).object_repr
    reviewer.user_permissions.remove(
        Permission.objects.get(codename="view_generation_content"))
    client.force_login(get_user_model().objects.get(pk=reviewer.pk))
    assert SECRET not in body(client.get(reverse("admin:index")))


# --- the user's own pages keep the title -------------------------------------------------------


@pytest.mark.parametrize("title", [TITLE, ""], ids=["titled", "untitled"])
def test_users_pages_show_the_title_or_new_conversation(client: Any, alice: Any,
                                                        title: str) -> None:
    conversation = Conversation.objects.create(user=alice, title=title, model="fast")
    client.force_login(alice)
    shown = title or "New conversation"
    for name in ("conversation-list", "conversation-detail", "conversation-delete"):
        args = [] if name == "conversation-list" else [conversation.pk]
        html = body(client.get(reverse(f"chatstream:{name}", args=args)))
        assert shown in html, name
        assert f"Conversation {str(conversation.pk)[:8]}" not in html, name
