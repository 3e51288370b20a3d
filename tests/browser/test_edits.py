"""Editing the last message, the arrows between versions, and Regenerate with another model, in
headless Chromium against the real server and the simulated upstream."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from chatstream.models import Generation, Message

from .conftest import composer_box, expect, open_edit, screenshot, send, start_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

OTHER = "A reply from the other model."


@pytest.fixture
def two_models(settings: Any) -> None:
    """Echo first (the default: its reply is the question, so each version's reply is known),
    and another model with a reply of its own."""
    settings.CHATSTREAM_MODELS = {
        "echo": {"PROVIDER": "default", "MODEL": "echo?tps=40", "LABEL": "Echo"},
        "other": {"PROVIDER": "default", "MODEL": "fast?text=A%20reply%20from%20the%20other"
                  "%20model.", "LABEL": "Other"},
    }


def last_exchange(page: Any) -> Any:
    return page.locator("#cs-transcript > .cs-exchange").last


def finished(page: Any, count: int) -> None:
    expect(page.locator(".cs-assistant:not(.cs-live)")).to_have_count(count, timeout=15_000)


def watch_the_live_reply(page: Any) -> None:
    """Record, at each change of the page while the last exchange holds a live reply, whether
    its Edit is disabled and the composer's box too (window.__whileLive): a short reply can end
    before a test looking at the page sees it live."""
    page.evaluate("""() => {
        window.__whileLive = [];
        new MutationObserver(() => {
            const exchange = [...document.querySelectorAll("#cs-transcript > .cs-exchange")].pop();
            if (!exchange || !exchange.querySelector(".cs-live")) return;
            const edit = exchange.querySelector(".cs-edit > summary");
            const box = document.querySelector("#cs-composer textarea");
            window.__whileLive.push([edit && edit.getAttribute("aria-disabled"),
                                     Boolean(box && box.disabled)]);
        }).observe(document.body, {childList: true, subtree: true, attributes: true});
    }""")


def test_edit_streams_a_new_version_and_the_arrows_show_both(page, simulator, two_models):
    start_conversation(page)
    send(page, "First question")
    finished(page, 1)
    send(page, "Old question")
    finished(page, 2)
    # Only the last message offers Edit.
    expect(page.locator(".cs-edit")).to_have_count(1)
    exchange = last_exchange(page)

    box = open_edit(exchange)
    expect(box).to_be_focused()
    expect(box).to_have_value("Old question")
    page.keyboard.press("Escape")  # closes without sending
    expect(box).to_be_hidden()
    open_edit(exchange).fill("New question")
    screenshot(page, "editing-a-message")
    watch_the_live_reply(page)
    exchange.get_by_role("button", name="Send again").click()

    # The exchange is swapped in place, its new reply streaming at once: while it streamed,
    # Edit and the composer were disabled (seen as the page changed, however short the reply).
    exchange = last_exchange(page)
    expect(exchange.locator(".cs-user .cs-text")).to_have_text("New question")
    finished(page, 2)
    assert ["true", True] in page.evaluate("window.__whileLive")
    expect(exchange.locator(".cs-user .cs-text")).to_have_text("New question")
    expect(exchange.locator(".cs-assistant .cs-text")).to_have_text("New question")
    versions = exchange.get_by_role("navigation", name="Versions of this message")
    expect(versions).to_contain_text("2 / 2")
    expect(versions).to_contain_text("Version 2 of 2")
    expect(page.locator("#cs-transcript > .cs-exchange")).to_have_count(2)
    expect(exchange.locator(".cs-edit > summary")).to_have_attribute("aria-disabled", "false")
    screenshot(page, "edited-message")

    versions.get_by_role("link", name="Previous version").click()
    exchange = last_exchange(page)
    versions = exchange.get_by_role("navigation", name="Versions of this message")
    expect(versions).to_contain_text("1 / 2")
    expect(exchange.locator(".cs-user .cs-text")).to_have_text("Old question")
    expect(exchange.locator(".cs-assistant .cs-text")).to_have_text("Old question")
    expect(exchange.locator(".cs-edit")).to_have_count(0)
    expect(versions.get_by_role("link", name="Next version")).to_be_focused()

    versions.get_by_role("link", name="Next version").click()
    exchange = last_exchange(page)
    expect(exchange.get_by_role("navigation", name="Versions of this message")).to_contain_text(
        "2 / 2")
    expect(exchange.locator(".cs-user .cs-text")).to_have_text("New question")
    expect(exchange.locator(".cs-assistant .cs-text")).to_have_text("New question")

    page.reload()
    exchange = last_exchange(page)
    expect(exchange.locator(".cs-user .cs-text")).to_have_text("New question")
    expect(exchange).to_contain_text("2 / 2")
    expect(page.get_by_text("Old question")).to_have_count(0)

    send(page, "Next message")
    finished(page, 3)
    # The next prompt carries only the current version of the edited message.
    sent = simulator.last_request.body["messages"]
    assert [m["content"] for m in sent] == [
        "First question", "First question", "New question", "New question", "Next message"]
    # The edited exchange is no longer the last: its Edit went with it.
    expect(page.locator(".cs-edit")).to_have_count(1)
    expect(last_exchange(page).locator(".cs-edit")).to_have_count(1)


def test_regenerate_with_another_model_shows_its_reply(page, simulator, two_models):
    start_conversation(page)
    send(page, "Which model are you?")
    finished(page, 1)

    reply = page.locator(".cs-assistant").first
    reply.get_by_label("Regenerate with").select_option(label="Other")
    reply.get_by_role("button", name="Regenerate").click()

    finished(page, 2)
    second = page.locator(".cs-assistant").nth(1)
    expect(second.locator(".cs-text")).to_have_text(OTHER)
    expect(second).to_contain_text("Retry")
    regenerated = Generation.objects.get(retry_of__isnull=False)
    assert regenerated.model == "other"
    assert simulator.last_request.body["model"].startswith("fast")


def test_a_refused_edit_says_why_and_keeps_the_message(page, simulator, two_models, settings):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"REQUESTS_PER_MINUTE": 1}
    start_conversation(page)
    send(page, "Only one")
    finished(page, 1)

    exchange = last_exchange(page)
    open_edit(exchange).fill("One more")
    exchange.get_by_role("button", name="Send again").click()

    expect(page.locator("#cs-notice")).to_contain_text(
        re.compile(r"1 message in the last minute"))
    expect(exchange.locator(".cs-user .cs-text")).to_have_text("Only one")
    assert list(Message.objects.filter(role="user").values_list("content", flat=True)) == [
        "Only one"]


def test_a_hostile_edit_is_shown_as_text_in_every_version(page, simulator, two_models):
    hostile = '</textarea><img src=x onerror="window.__pwned = 1"><script>window.__pwned = 2'
    page.add_init_script("window.__pwned = 0")
    start_conversation(page)
    send(page, '<b onmouseover="window.__pwned = 3">Old</b>')
    finished(page, 1)

    exchange = last_exchange(page)
    box = open_edit(exchange)
    expect(box).to_have_value('<b onmouseover="window.__pwned = 3">Old</b>')  # as text
    box.fill(hostile)
    exchange.get_by_role("button", name="Send again").click()
    exchange = last_exchange(page)
    expect(exchange.locator(".cs-user .cs-text")).to_have_text(hostile)
    expect(page.locator(".cs-live")).to_have_count(0, timeout=15_000)
    expect(composer_box(page)).to_be_enabled()
    exchange.locator(".cs-edit > summary").click()
    expect(exchange.get_by_role("textbox", name="Edit your message")).to_have_value(hostile)
    exchange.get_by_role("link", name="Previous version").click()
    expect(last_exchange(page).locator(".cs-user .cs-text")).to_have_text(
        '<b onmouseover="window.__pwned = 3">Old</b>')
    last_exchange(page).locator(".cs-user .cs-text").hover()

    assert page.evaluate("window.__pwned") == 0
    expect(page.locator(".cs-user img, .cs-user script, .cs-user b")).to_have_count(0)


def test_a_messages_earlier_replies_swap_in_and_a_retry_past_the_limit_says_why(
    page, simulator, two_models, settings
):
    settings.CHATSTREAM_MAX_REPLIES_PER_MESSAGE = 12
    start_conversation(page)
    send(page, "Ask me again")
    finished(page, 1)
    first = Generation.objects.get()
    Generation.objects.bulk_create(
        Generation(conversation_id=first.conversation_id, user_id=first.user_id,
                   prompt_message_id=first.prompt_message_id, model="echo",
                   status=Generation.Status.CANCELLED, error_type="stopped_by_user",
                   content=f"Stopped reply {i}", retry_of=first,
                   created_at=first.created_at + timedelta(seconds=i))
        for i in range(1, 12))
    page.reload()
    exchange = last_exchange(page)
    replies = exchange.locator(".cs-assistant .cs-text")
    expect(replies).to_have_count(10)
    expect(replies.last).to_have_text("Stopped reply 11")

    exchange.get_by_role("link", name="Earlier replies").click()
    exchange = last_exchange(page)
    expect(exchange.locator(".cs-assistant .cs-text")).to_have_text(
        ["Ask me again", "Stopped reply 1"])
    expect(exchange.get_by_role("link", name="Earlier replies")).to_have_count(0)
    exchange.get_by_role("link", name="Later replies").click()
    expect(last_exchange(page).locator(".cs-assistant .cs-text").last).to_have_text(
        "Stopped reply 11")

    last_exchange(page).locator(".cs-assistant").last.get_by_role("button", name="Retry").click()
    expect(page.locator("#cs-notice")).to_contain_text(
        "This message already has 12 replies, the most it may have.")
    expect(last_exchange(page).locator(".cs-assistant")).to_have_count(10)
    assert Generation.objects.count() == 12
