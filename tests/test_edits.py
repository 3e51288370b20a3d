"""Editing the last message and sending it again, the versions of an exchange, and Regenerate
with another model: through Django's test client and ``chatstream.domain.sending``."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.test import Client
from django.urls import reverse

from chatstream import api, quota
from chatstream.domain import sending
from chatstream.exceptions import ConversationFull, QuotaExceeded
from chatstream.models import Conversation, Generation, Message
from chatstream.web.transcripts import transcript

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def alice() -> Any:
    return get_user_model().objects.create_user("alice", password="pw")


@pytest.fixture
def client(alice: Any) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def url(name: str, pk: Any) -> str:
    return reverse(f"chatstream:{name}", kwargs={"pk": pk})


def finish(generation: Generation, text: str | None = None) -> Generation:
    """End ``generation`` as the stream does: its text, its reply message, its charge."""
    text = f"Reply to {generation.prompt_message.content}" if text is None else text
    with transaction.atomic():
        Generation.objects.filter(pk=generation.pk).update(status="completed", content=text)
        generation.status, generation.content = Generation.Status.COMPLETED, text
        quota.settle(generation)
    Message.objects.create(conversation=generation.conversation, role=Message.Role.ASSISTANT,
                           content=text, generation=generation)
    return generation


def said(user: Any, text: str, conversation: Conversation | None = None) -> Generation:
    """``text`` sent and answered."""
    return finish(sending.send(user, text, conversation=conversation))


def edited(generation: Generation, text: str) -> Generation:
    """``generation``'s question edited to ``text`` and answered."""
    message = Message.objects.select_related("conversation__user").get(
        pk=generation.prompt_message_id)
    return finish(sending.edit(message, text))


def exchange_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<div class="cs-exchange" id="exchange-(\d+)"', html)]


# --- editing ----------------------------------------------------------------------------------


def test_an_edit_is_a_new_version_that_keeps_the_old_one_and_its_reply(client, alice):
    first = said(alice, "What is 2 + 2?")
    old = first.prompt_message

    response = client.post(url("message-edit", old.pk), {"content": "What is 3 + 3?"}, **HTMX)

    assert response.status_code == 200
    new = Message.objects.get(edit_of=old)
    assert new.content == "What is 3 + 3?" and new.conversation_id == old.conversation_id
    generation = Generation.objects.get(prompt_message=new)
    assert generation.status == Generation.Status.PENDING and generation.retry_of_id is None
    assert Generation.objects.get(pk=first.pk).content == "Reply to What is 2 + 2?"  # kept
    html = response.content.decode()
    # The exchange, swapped in place of the old one: the new version's id, its reply live.
    assert exchange_ids(html) == [new.pk]
    assert 'sse-connect="' in html and f'id="generation-{generation.pk}"' in html
    assert "2 / 2" in html and "Version 2 of 2" in html
    assert f'href="{url("message-version", old.pk)}"' in html
    assert 'aria-label="Previous version"' in html and 'aria-label="Next version"' not in html


def test_the_page_shows_each_exchange_at_its_current_version_with_its_arrows(client, alice):
    first = said(alice, "Old question")
    second = edited(first, "New question")
    conversation = first.conversation

    html = client.get(conversation.get_absolute_url()).content.decode()

    assert exchange_ids(html) == [second.prompt_message_id]
    assert "New question" in html and "Old question" not in html
    assert "Reply to New question" in html and "Reply to Old question" not in html
    assert "Version 2 of 2" in html
    assert html.count('class="cs-edit"') == 1


def test_a_title_taken_from_the_edited_message_follows_it(client, alice):
    first = said(alice, "Old question")
    response = client.post(url("message-edit", first.prompt_message_id),
                           {"content": "New question"}, **HTMX)
    assert Conversation.objects.get().title == "New question"
    assert re.search(r'<h1 id="cs-conversation-title"[^>]*hx-swap-oob="true">New question</h1>',
                     response.content.decode())

    said(alice, "Second", first.conversation)
    Conversation.objects.update(title="Mine")
    edited(Generation.objects.get(prompt_message__content="Second"), "Second, again")
    assert Conversation.objects.get().title == "Mine"  # one the user gave is kept


def test_an_arrow_shows_the_earlier_version_with_its_own_replies(client, alice):
    first = said(alice, "Old question")
    second = edited(first, "New question")
    old, new = first.prompt_message_id, second.prompt_message_id

    html = client.get(url("message-version", old), **HTMX).content.decode()

    assert exchange_ids(html) == [old]
    assert "Old question" in html and "Reply to Old question" in html
    assert "New question" not in html
    assert "1 / 2" in html and "Version 1 of 2" in html
    assert f'href="{url("message-version", new)}"' in html and "Next version" in html
    assert 'class="cs-edit"' not in html  # an earlier version is not edited: the current is

    back = client.get(url("message-version", new), **HTMX).content.decode()
    assert exchange_ids(back) == [new] and "Reply to New question" in back
    assert 'class="cs-edit"' in back


def test_without_javascript_an_arrow_is_the_page_with_that_version_in_place(client, alice):
    first = said(alice, "Old question")
    later = said(alice, "Later question", first.conversation)
    second = edited(later, "Later, edited")

    html = client.get(url("message-version", later.prompt_message_id)).content.decode()

    assert exchange_ids(html) == [first.prompt_message_id, later.prompt_message_id]
    assert "Later question" in html and "Later, edited" not in html
    assert 'id="cs-composer"' in html  # the newest page, with its composer
    assert client.get(url("message-version", second.prompt_message_id)).status_code == 200


def test_without_javascript_an_edit_redirects_to_its_exchange(client, alice):
    first = said(alice, "Old question")

    response = client.post(url("message-edit", first.prompt_message_id),
                           {"content": "New question"})

    new = Message.objects.get(edit_of=first.prompt_message)
    assert response.status_code == 302
    assert response["Location"] == f"{first.conversation.get_absolute_url()}#exchange-{new.pk}"


@pytest.mark.parametrize("which", ["an earlier message", "an earlier version"])
def test_only_the_last_current_message_may_be_edited(client, alice, which):
    first = said(alice, "One")
    second = said(alice, "Two", first.conversation)
    if which == "an earlier version":
        edited(second, "Two, edited")
    target = first if which == "an earlier message" else second

    response = client.post(url("message-edit", target.prompt_message_id), {"content": "X"},
                           **HTMX)

    assert response.status_code == 409
    assert "Only your last message can be edited." in response.content.decode()
    assert not Message.objects.filter(content="X").exists()


def test_a_message_whose_reply_is_live_is_not_edited(client, alice):
    live = sending.send(alice, "Still answering")

    response = client.post(url("message-edit", live.prompt_message_id), {"content": "X"},
                           **HTMX)

    assert response.status_code == 409
    assert "Wait for the reply to end" in response.content.decode()
    assert Message.objects.filter(role="user").count() == 1


def test_an_empty_edit_is_refused_with_a_sentence(client, alice):
    first = said(alice, "One")
    response = client.post(url("message-edit", first.prompt_message_id), {"content": "  "},
                           **HTMX)
    assert response.status_code == 400
    assert 'role="alert"' in response.content.decode()
    assert Message.objects.filter(role="user").count() == 1


def test_another_users_message_and_reply_are_not_found(client, alice):
    bob = get_user_model().objects.create_user("bob", password="pw")
    theirs = said(bob, "Bob's")
    assert client.post(url("message-edit", theirs.prompt_message_id), {"content": "X"},
                       **HTMX).status_code == 404
    assert client.get(url("message-version", theirs.prompt_message_id),
                      **HTMX).status_code == 404
    assert client.post(url("generation-retry", theirs.pk), {"model": "fast"},
                       **HTMX).status_code == 404
    assert Generation.objects.count() == 1


# --- what is sent upstream --------------------------------------------------------------------


def test_later_prompts_carry_only_the_current_version_of_an_edited_message(alice):
    first = said(alice, "Old question")
    edited(first, "New question")

    after = sending.send(alice, "Next", conversation=first.conversation)

    assert after.upstream_messages == [
        {"role": "user", "content": "New question"},
        {"role": "assistant", "content": "Reply to New question"},
        {"role": "user", "content": "Next"},
    ]


def test_an_edit_sends_what_came_before_and_not_the_version_it_replaces(alice):
    first = said(alice, "Before")
    second = said(alice, "Old question", first.conversation)

    message = Message.objects.select_related("conversation__user").get(
        pk=second.prompt_message_id)
    generation = sending.edit(message, "New question")

    assert generation.upstream_messages == [
        {"role": "user", "content": "Before"},
        {"role": "assistant", "content": "Reply to Before"},
        {"role": "user", "content": "New question"},
    ]


# --- the transcript's cost and windows ----------------------------------------------------------


def test_the_transcript_reads_versions_in_one_query_however_many_exchanges(
        alice, django_assert_num_queries):
    conversation = None
    for i in range(6):
        answered = said(alice, f"Question {i}", conversation)
        conversation = answered.conversation
        edited(edited(answered, f"Question {i}, again"), f"Question {i}, third")

    with django_assert_num_queries(3):  # the window, its replies, the conversation's edits
        exchanges, older = transcript(conversation)

    assert [e["message"].content for e in exchanges] == [
        f"Question {i}, third" for i in range(6)]
    assert {(e["version"], e["versions"]) for e in exchanges} == {(3, 3)}
    assert [e["editable"] for e in exchanges] == [False] * 5 + [True]
    assert not older


def test_a_transcript_without_edits_costs_two_queries(alice, django_assert_num_queries):
    conversation = said(alice, "One").conversation
    said(alice, "Two", conversation)
    with django_assert_num_queries(2):
        transcript(conversation)


def test_the_page_window_counts_exchanges_not_versions(client, alice, settings):
    settings.CHATSTREAM_CONVERSATION_PAGE_SIZE = 2
    first = said(alice, "One")
    conversation = first.conversation
    second = said(alice, "Two", conversation)
    third = edited(edited(said(alice, "Three", conversation), "Three b"), "Three c")

    html = client.get(conversation.get_absolute_url()).content.decode()

    assert exchange_ids(html) == [second.prompt_message_id, third.prompt_message_id]
    older = re.search(r'href="\?before=(\d+)"[^>]*rel="prev"', html)
    assert older and int(older.group(1)) == second.prompt_message_id
    earlier = client.get(f"{conversation.get_absolute_url()}?before={older.group(1)}")
    assert exchange_ids(earlier.content.decode()) == [first.prompt_message_id]
    assert re.search(rf'href="{conversation.get_absolute_url()}"[^>]*rel="next"',
                     earlier.content.decode())


def test_the_conversation_limit_counts_every_version_sent(client, alice, settings):
    settings.CHATSTREAM_MAX_CONVERSATION_MESSAGES = 2
    first = said(alice, "One")
    second = edited(first, "One, again")

    response = client.post(url("message-edit", second.prompt_message_id),
                           {"content": "One, third"}, **HTMX)

    assert response.status_code == 409
    assert "limit of 2 messages" in response.content.decode()
    with pytest.raises(ConversationFull):
        sending.edit(Message.objects.select_related("conversation__user").get(
            pk=second.prompt_message_id), "One, third")


# --- Regenerate with another model --------------------------------------------------------------


@pytest.fixture
def two_models(settings: Any, chatstream_simulator: Any) -> None:
    settings.CHATSTREAM_MODELS = {
        "fast": {"PROVIDER": "default", "MODEL": "fast", "LABEL": "Fast"},
        "echo": {"PROVIDER": "default", "MODEL": "echo", "LABEL": "Echo"},
    }


def test_regenerate_is_offered_on_finished_replies_when_there_is_a_choice(
        client, alice, two_models):
    conversation = said(alice, "One").conversation
    html = client.get(conversation.get_absolute_url()).content.decode()
    assert 'class="cs-regenerate"' in html
    assert re.search(r'<option value="fast" selected>Fast</option>', html)
    assert '<option value="echo">Echo</option>' in html


def test_regenerate_is_not_offered_with_one_model(client, alice):
    conversation = said(alice, "One").conversation
    assert 'class="cs-regenerate"' not in client.get(
        conversation.get_absolute_url()).content.decode()


def test_regenerate_with_another_model_is_a_retry_with_that_model(client, alice, two_models):
    original = said(alice, "One")

    response = client.post(url("generation-retry", original.pk), {"model": "echo"}, **HTMX)

    assert response.status_code == 200
    retry = Generation.objects.get(retry_of=original)
    assert retry.model == "echo" and retry.prompt_message_id == original.prompt_message_id
    assert f'id="generation-{retry.pk}"' in response.content.decode()
    assert Conversation.objects.get().model == "fast"  # the conversation keeps its model


@pytest.mark.parametrize("model", ["unknown", "denied"])
def test_regenerate_with_a_model_not_allowed_is_a_400_with_a_sentence(
        client, alice, two_models, settings, model):
    settings.CHATSTREAM_ACCESS = "tests.test_edits.fast_only"
    original = said(alice, "One")
    chosen = "echo" if model == "denied" else "unknown"

    response = client.post(url("generation-retry", original.pk), {"model": chosen}, **HTMX)

    assert response.status_code == 400
    assert "This model is not available to you" in response.content.decode()
    assert Generation.objects.count() == 1


def fast_only(user: Any) -> list[str]:
    return ["fast"]


# --- the one gate: quota, hooks ------------------------------------------------------------------


def test_an_edit_and_a_regenerate_each_count_as_a_request(client, alice, settings, two_models):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"REQUESTS_PER_MINUTE": 1}
    client.defaults.update(HTMX)
    original = said(alice, "One")

    edit = client.post(url("message-edit", original.prompt_message_id), {"content": "Two"})
    regenerate = client.post(url("generation-retry", original.pk), {"model": "echo"})

    assert edit.status_code == regenerate.status_code == 429
    assert int(edit["Retry-After"]) >= 1 and "1 message in the last minute" in (
        edit.content.decode())
    assert Message.objects.filter(role="user").count() == 1  # nothing kept
    assert Generation.objects.count() == 1

    settings.CHATSTREAM_DEFAULT_QUOTA = {"REQUESTS_PER_MINUTE": 3}
    assert client.post(url("message-edit", original.prompt_message_id),
                       {"content": "Two"}).status_code == 200
    finish(Generation.objects.get(prompt_message__content="Two"))
    assert client.post(url("generation-retry", original.pk),
                       {"model": "echo"}).status_code == 200
    with pytest.raises(QuotaExceeded):  # three requests this minute: the first, each
        sending.send(alice, "Three", conversation=original.conversation)


def test_a_request_hook_sees_an_edit_and_may_refuse_it(client, alice, settings):
    settings.CHATSTREAM_REQUEST_HOOKS = ["tests.test_edits.refuse_edits"]
    original = said(alice, "One")

    response = client.post(url("message-edit", original.prompt_message_id),
                           {"content": "Two"}, **HTMX)

    assert response.status_code == 200  # kept: the refused reply says why, in its place
    refused = Generation.objects.get(prompt_message__content="Two")
    assert refused.status == Generation.Status.FAILED and refused.error_type == "refused"
    assert "No edits here." in response.content.decode()


def refuse_edits(call: Any) -> None:
    from chatstream.exceptions import RequestRefused

    if call.generation.prompt_message.edit_of_id is not None:
        raise RequestRefused("No edits here.")


# --- the Python API and the admin ---------------------------------------------------------------


def test_api_edit_sends_the_new_version(alice):
    first = said(alice, "One")
    generation = api.edit(first.prompt_message, "One, again")
    assert generation.prompt_message.edit_of_id == first.prompt_message_id
    assert generation.upstream_messages[-1] == {"role": "user", "content": "One, again"}


def test_the_admin_shows_which_message_is_an_edit_of_which(admin_client, alice):
    first = said(alice, "One")
    second = edited(first, "One, again")
    old, new = first.prompt_message_id, second.prompt_message_id

    html = admin_client.get(reverse("admin:chatstream_conversation_change",
                                    args=[first.conversation_id])).content.decode()
    assert f'<span id="message-{old}">#{old}</span>' in html
    assert f'edit of <a href="#message-{old}">#{old}</a>' in html
    assert f'edited as <a href="#message-{new}">#{new}</a>' in html

    detail = admin_client.get(reverse("admin:chatstream_generation_change",
                                      args=[first.pk])).content.decode()
    assert "answers version 1 of 2 of its message" in detail


def test_the_page_costs_the_same_queries_however_many_exchanges_were_edited(client, alice):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries_for(count: int) -> int:
        conversation = None
        for i in range(count):
            answered = said(alice, f"Question {i}", conversation)
            conversation = answered.conversation
            edited(answered, f"Question {i}, again")
        assert conversation is not None
        with CaptureQueriesContext(connection) as captured:
            assert client.get(conversation.get_absolute_url()).status_code == 200
        return len(captured)

    assert queries_for(2) == queries_for(7)


def test_an_earlier_version_on_an_earlier_page_is_shown_on_that_page(client, alice, settings):
    settings.CHATSTREAM_CONVERSATION_PAGE_SIZE = 2
    first = said(alice, "One")
    conversation = first.conversation
    second = edited(first, "One, again")
    later = [said(alice, text, conversation) for text in ("Two", "Three")]

    html = client.get(url("message-version", first.prompt_message_id)).content.decode()

    assert exchange_ids(html) == [first.prompt_message_id]  # in place of its current version
    assert "Version 1 of 2" in html and "Two" not in html
    # The page ends before "Two": the next one is the newest, "Two" and "Three".
    assert re.search(rf'href="{conversation.get_absolute_url()}"[^>]*rel="next"', html)
    assert exchange_ids(client.get(conversation.get_absolute_url()).content.decode()) == [
        g.prompt_message_id for g in later]
    assert f'href="{url("message-version", second.prompt_message_id)}"' in html


@pytest.mark.parametrize("pk", ["0", "99999999999999999999999"])
def test_a_version_that_does_not_exist_is_not_found(client, pk):
    assert client.get(f"/chat/m/{pk}/").status_code == 404
    assert client.post(f"/chat/m/{pk}/edit/", {"content": "X"}).status_code == 404
