"""The conversation pages through Django's test client: list, titles, rename, delete, fragments."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import unquote

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.template.loader import render_to_string
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chatstream.domain import sending
from chatstream.exceptions import ConversationFull, QuotaExceeded
from chatstream.models import Conversation, Generation, Message
from chatstream.stream import ticket_user_id

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password="pw")


@pytest.fixture
def client(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def conversation_for(user, title="", **fields) -> Conversation:
    return Conversation.objects.create(user=user, title=title, model="fast", **fields)


def exchange(conversation, prompt="Hello", **generation_fields) -> Generation:
    message = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                     content=prompt)
    return Generation.objects.create(conversation=conversation, user=conversation.user,
                                     prompt_message=message, model="fast", **generation_fields)


def url(name: str, pk) -> str:
    return reverse(f"chatstream:{name}", kwargs={"pk": pk})


# --- the list -------------------------------------------------------------------------------------


def test_list_shows_own_conversations_newest_activity_first(client, alice):
    now = timezone.now()
    conversation_for(alice, "Older", updated_at=now - timedelta(days=2))
    conversation_for(alice, "Newest", updated_at=now - timedelta(minutes=5))
    conversation_for(alice, "Middle", updated_at=now - timedelta(hours=3))
    bob = get_user_model().objects.create_user("bob")
    conversation_for(bob, "Not yours", updated_at=now)

    html = client.get(reverse("chatstream:conversation-list")).content.decode()

    titles = re.findall(r'class="cs-conversation-title">([^<]+)<', html)
    assert titles == ["Newest", "Middle", "Older"]
    assert "5\xa0minutes ago" in html
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT', html)


def test_list_is_paginated_twenty_at_a_time(client, alice):
    now = timezone.now()
    for i in range(25):
        conversation_for(alice, f"Conversation {i:02}", updated_at=now - timedelta(minutes=i))

    first = client.get(reverse("chatstream:conversation-list")).content.decode()
    second = client.get(reverse("chatstream:conversation-list") + "?page=2").content.decode()

    assert first.count('class="cs-conversation-link"') == 20
    assert "Conversation 00" in first and "Conversation 19" in first
    assert 'href="?page=2" rel="next"' in first and "Page 1 of 2" in first
    assert second.count('class="cs-conversation-link"') == 5
    assert "Conversation 24" in second and 'rel="prev"' in second and 'rel="next"' not in second


def test_empty_list_invites_a_first_conversation(client):
    html = client.get(reverse("chatstream:conversation-list")).content.decode()
    assert "No conversations yet." in html and "New conversation" in html


def test_pages_need_a_login():
    response = Client().get(reverse("chatstream:conversation-list"))
    assert response.status_code == 302 and "/login/" in response["Location"]


# --- titles, rename, delete -----------------------------------------------------------------------


def test_title_comes_from_the_first_message_only(client, alice):
    conversation = conversation_for(alice)
    client.post(url("message-create", conversation.pk), {"content": "  How do\n tides   work? "})
    client.post(url("message-create", conversation.pk), {"content": "And waves?"})
    conversation.refresh_from_db()
    assert conversation.title == "How do tides work?"


def test_long_first_message_is_shortened_to_a_title(client, alice):
    conversation = conversation_for(alice)
    client.post(url("message-create", conversation.pk), {"content": "word " * 40})
    conversation.refresh_from_db()
    assert len(conversation.title) <= 60 and conversation.title.endswith("…")


def test_first_message_updates_the_page_heading_out_of_band(client, alice):
    conversation = conversation_for(alice)
    first = client.post(url("message-create", conversation.pk), {"content": "Tides"}, **HTMX)
    second = client.post(url("message-create", conversation.pk), {"content": "Waves"}, **HTMX)
    assert re.search(r'<h1 id="cs-conversation-title"[^>]*hx-swap-oob="true">Tides</h1>',
                     first.content.decode())
    assert "hx-swap-oob" not in second.content.decode()


def test_rename_sets_the_title(client, alice):
    conversation = conversation_for(alice, "Old")
    response = client.post(url("conversation-rename", conversation.pk), {"title": " New name "})
    assert response.status_code == 302 and response["Location"] == conversation.get_absolute_url()
    conversation.refresh_from_db()
    assert conversation.title == "New name"
    assert "New name" in client.get(conversation.get_absolute_url()).content.decode()


def test_rename_to_nothing_brings_back_the_title_from_the_first_message(client, alice):
    conversation = conversation_for(alice, "Custom")
    exchange(conversation, "What is a good name for a cat?")
    client.post(url("conversation-rename", conversation.pk), {"title": ""})
    conversation.refresh_from_db()
    assert conversation.title == "What is a good name for a cat?"


def test_rename_with_a_too_long_title_shows_the_error_and_keeps_the_title(client, alice):
    conversation = conversation_for(alice, "Kept")
    response = client.post(url("conversation-rename", conversation.pk), {"title": "x" * 201})
    assert response.status_code == 400
    html = response.content.decode()
    assert 'class="cs-rename" open' in html and "at most 200 characters" in html
    conversation.refresh_from_db()
    assert conversation.title == "Kept"


def test_delete_asks_for_confirmation_before_deleting(client, alice):
    conversation = conversation_for(alice, "Precious")
    exchange(conversation)
    page = client.get(url("conversation-delete", conversation.pk))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Delete this conversation?" in html and "“Precious”" in html
    assert '<form method="post"' in html and "Cancel" in html
    assert Conversation.objects.filter(pk=conversation.pk).exists()

    response = client.post(url("conversation-delete", conversation.pk), follow=True)

    assert response.redirect_chain == [(reverse("chatstream:conversation-list"), 302)]
    assert "The conversation was deleted." in response.content.decode()
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert not Generation.objects.exists()


@pytest.mark.parametrize(("name", "method"), [
    ("conversation-detail", "get"), ("conversation-rename", "post"),
    ("conversation-delete", "get"), ("conversation-delete", "post"),
    ("message-create", "post"),
])
def test_another_users_conversation_is_not_found(client, name, method):
    bob = get_user_model().objects.create_user("bob")
    conversation = conversation_for(bob, "Bob's")
    response = getattr(client, method)(url(name, conversation.pk), {"title": "x", "content": "x"})
    assert response.status_code == 404
    conversation.refresh_from_db()
    assert conversation.title == "Bob's" and not conversation.messages.exists()


# --- the conversation page and its fragments ------------------------------------------------------


def test_composer_has_a_labelled_box_a_send_button_and_no_model_picker_for_one_model(
    client, alice
):
    html = client.get(conversation_for(alice).get_absolute_url()).content.decode()
    assert re.search(r'<label[^>]*for="id_content"[^>]*>Message</label>', html)
    assert re.search(r'<textarea[^>]*name="content"', html)
    assert re.search(r'<button type="submit" class="[^"]*cs-send[^"]*">Send</button>', html)
    assert 'name="model"' not in html


def test_model_picker_lists_the_allow_list_when_there_is_a_choice(client, alice, settings):
    settings.CHATSTREAM_MODELS = {
        "fast": {"PROVIDER": "default", "MODEL": "fast", "LABEL": "Fast"},
        "careful": {"PROVIDER": "default", "MODEL": "slow", "LABEL": "Careful"},
    }
    html = client.get(conversation_for(alice).get_absolute_url()).content.decode()
    assert re.search(r'<label for="id_model">Model</label>', html)
    assert '<option value="fast" selected>Fast</option>' in html
    assert '<option value="careful">Careful</option>' in html


def assert_stream_url_with_ticket(html: str, generation: Generation, client: Client) -> None:
    """The page connects to the stream with a ticket for this user and this session only."""
    found = re.search(r'sse-connect="([^"?]+)\?ticket=([^"&]+)"', html)
    assert found, html
    assert found.group(1) == url("generation-stream", generation.pk)
    session_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    ticket = unquote(found.group(2))
    assert ticket_user_id(generation.pk, ticket, session_key) == str(generation.user_id)
    assert ticket_user_id(generation.pk, ticket, session_key + "x") is None
    assert ticket_user_id(uuid.uuid4(), ticket, session_key) is None


def test_message_create_returns_a_live_reply_that_streams_and_closes_on_done(client, alice):
    conversation = conversation_for(alice)
    response = client.post(url("message-create", conversation.pk), {"content": "Hi"}, **HTMX)
    assert response.status_code == 200
    html = response.content.decode()
    generation = Generation.objects.get()
    assert_stream_url_with_ticket(html, generation, client)
    assert 'sse-close="done"' in html
    assert re.search(r'aria-live="polite" sse-swap="delta" hx-swap="beforeend"', html)
    assert re.search(r'sse-swap="done" hx-target="#generation-[0-9a-f-]+" hx-swap="outerHTML"',
                     html)
    assert ">Stop</button>" in html and "cs-typing" in html


def test_a_message_post_counts_sent_messages_with_the_conversation_and_reads_no_history_first(
        client, alice):
    conversation = conversation_for(alice)

    def post(content: str) -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            response = client.post(url("message-create", conversation.pk), {"content": content},
                                   **HTMX)
        assert response.status_code == 200
        return [query["sql"] for query in captured.captured_queries]

    def reads_of_messages(statements: list[str]) -> int:
        return sum(sql.startswith("SELECT") and 'FROM "chatstream_message"' in sql
                   for sql in statements)

    first = post("Hi")
    assert reads_of_messages(first) == 0  # neither a count nor a history: none came before
    generation = Generation.objects.get()
    Generation.objects.filter(pk=generation.pk).update(status="completed", content="Hello back")
    Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT,
                           content="Hello back", generation=generation)
    second = post("Again")
    assert reads_of_messages(second) == 2  # the history (questions, replies); not the count
    sent = Generation.objects.latest("created_at").upstream_messages
    assert [(m["role"], m["content"]) for m in sent if m["role"] != "system"] == [
        ("user", "Hi"), ("assistant", "Hello back"), ("user", "Again")]
    # The account row: created by the first admission, then locked by one update each time.
    assert sum('"chatstream_quotaaccount"' in sql for sql in second) == 1


def test_a_conversation_read_with_its_count_is_full_at_its_limit(alice, settings):
    settings.CHATSTREAM_MAX_CONVERSATION_MESSAGES = 2
    conversation = conversation_for(alice)
    counted = lambda: sending.counting_sent(Conversation.objects.all()).get(pk=conversation.pk)  # noqa: E731
    exchange(conversation)
    assert not sending.is_full(counted())
    exchange(conversation)
    with pytest.raises(ConversationFull):
        sending.send(alice, "Third", conversation=counted())
    assert conversation.messages.count() == 2


def test_message_create_without_htmx_redirects_to_the_conversation(client, alice):
    conversation = conversation_for(alice)
    response = client.post(url("message-create", conversation.pk), {"content": "Hi"})
    assert response.status_code == 302 and response["Location"] == conversation.get_absolute_url()


def test_empty_message_shows_the_form_again_with_its_error(client, alice):
    conversation = conversation_for(alice)
    response = client.post(url("message-create", conversation.pk), {"content": "  "}, **HTMX)
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="cs-composer"' in html and "This field is required." in html
    assert not Message.objects.exists()


@pytest.mark.parametrize("status", ["completed", "cancelled", "interrupted", "failed"])
def test_finished_reply_renders_without_an_event_source(client, alice, status):
    conversation = conversation_for(alice)
    exchange(conversation, status=status, content="Partial **text**")
    html = client.get(conversation.get_absolute_url()).content.decode()
    assert "sse-connect" not in html and "cs-live" not in html
    assert "<strong>text</strong>" in html
    assert (">Retry</button>" in html.replace('<span aria-hidden="true">↻</span> ', "")) == (
        status != "completed")


@pytest.mark.parametrize("status", ["pending", "streaming"])
def test_live_reply_on_page_load_connects_to_its_stream(client, alice, status):
    conversation = conversation_for(alice)
    generation = exchange(conversation, status=status, content="So far")
    html = client.get(conversation.get_absolute_url()).content.decode()
    if status == "pending":
        assert_stream_url_with_ticket(html, generation, client)
    else:  # a ticket only ever starts a reply: one already started is the session's
        assert f'sse-connect="{url("generation-stream", generation.pk)}"' in html
    assert 'sse-close="done"' in html


def test_final_rendering_sent_with_done_has_no_event_source(alice):
    conversation = conversation_for(alice)
    generation = exchange(conversation, status="streaming", content="Almost")
    generation.status = Generation.Status.COMPLETED
    html = render_to_string("chatstream/includes/generation.html",
                            {"generation": generation, "final": True})
    assert "sse-connect" not in html and f'id="generation-{generation.pk}"' in html
    generation.status = Generation.Status.STREAMING  # e.g. a replay racing the final save
    html = render_to_string("chatstream/includes/generation.html",
                            {"generation": generation, "final": True})
    assert "sse-connect" not in html


def test_stopped_reply_keeps_its_text_with_a_label_and_retry(client, alice):
    conversation = conversation_for(alice)
    exchange(conversation, status="cancelled", error_type="stopped_by_user",
             content="The first half")
    html = client.get(conversation.get_absolute_url()).content.decode()
    assert "The first half" in html
    assert re.search(r'role="status">.*Stopped by you\.</p>', html)


def test_retry_renders_a_new_live_generation_marked_as_a_retry(client, alice):
    conversation = conversation_for(alice)
    failed = exchange(conversation, status="failed", http_status=500)
    response = client.post(url("generation-retry", failed.pk), **HTMX)
    assert response.status_code == 200
    retry = Generation.objects.get(retry_of=failed)
    html = response.content.decode()
    assert f'id="generation-{retry.pk}"' in html and "sse-connect" in html
    assert '<span class="cs-chip">Retry</span>' in html
    page = client.get(conversation.get_absolute_url()).content.decode()
    assert page.index(f"generation-{failed.pk}") < page.index(f"generation-{retry.pk}")


def test_retry_of_a_reply_still_being_written_is_refused_with_a_sentence(client, alice):
    live = exchange(conversation_for(alice), status="streaming")
    response = client.post(url("generation-retry", live.pk), **HTMX)
    assert response.status_code == 409
    assert 'role="alert">This reply is still being written.</p>' in response.content.decode()
    # Without JavaScript: the conversation's page, the sentence in its notice slot.
    page = client.post(url("generation-retry", live.pk))
    assert page.status_code == 409 and 'id="cs-notice"' in page.text
    assert "This reply is still being written." in page.text and "<textarea" in page.text
    assert Generation.objects.count() == 1


def test_quota_refusal_is_a_sentence_with_retry_after(client, alice, monkeypatch):
    def refuse(generation, **kwargs):
        raise QuotaExceeded("You have used all 20 messages for today.", limit="requests_per_day",
                            retry_after=120)

    monkeypatch.setattr("chatstream.quota.admit", refuse)
    conversation = conversation_for(alice)
    response = client.post(url("message-create", conversation.pk), {"content": "More"}, **HTMX)
    assert response.status_code == 429 and response["Retry-After"] == "120"
    assert response.content.decode().strip() == (
        '<p class="cs-notice cs-refusal" role="alert">You have used all 20 messages for today.</p>')
    assert not Message.objects.exists()

    page = client.post(url("message-create", conversation.pk), {"content": "More"})
    html = page.content.decode()
    assert page.status_code == 429 and page["Retry-After"] == "120"
    assert "You have used all 20 messages for today." in html and "\nMore</textarea>" in html


# --- templates: no inline script, no unsafe output ------------------------------------------------

TEMPLATES = sorted([*(ROOT / "chatstream" / "templates" / "chatstream").rglob("*.html"),
                    *(ROOT / "templates").rglob("*.html")])


@pytest.mark.parametrize("path", TEMPLATES, ids=[p.relative_to(ROOT).as_posix() for p in TEMPLATES])
def test_template_has_no_inline_script_handlers_or_unsafe_output(path):
    source = path.read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", source), "inline <script>"
    assert not re.search(r"\son[a-z]+\s*=", source, re.I), "inline event handler"
    assert not re.search(r"javascript:", source, re.I)
    assert "|safe" not in source and "autoescape off" not in source
    assert "style=" not in source, "inline style (blocked by a strict CSP)"


def test_app_base_template_works_without_the_host_sites_override(client, alice, settings):
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": []}]  # only the app's templates
    html = client.get(conversation_for(alice, "Standalone").get_absolute_url()).content.decode()
    assert '<main id="cs-main" class="cs-main">' in html and 'href="#cs-main"' in html
    assert "<title>Standalone</title>" in html
    assert '<meta name="htmx-config"' in html and "hx-sse-2" in html
    assert "chatstream/chatstream.css" in html and "chatstream/chatstream.js" in html
    assert "site-header" not in html
