"""Screenshots of the main pages, saved to test-artifacts/screenshots/ on every run.

With ``CHATSTREAM_DOCS_SCREENSHOTS=1`` (scripts/screenshots.sh) they are also copied to
docs/screenshots/ for the README.
"""

from __future__ import annotations

import os
import re
import shutil
from datetime import timedelta

import pytest
from django.utils import timezone

from chatstream.models import Conversation

from .conftest import (
    PHONE,
    ROOT,
    SCREENSHOTS,
    expect,
    open_edit,
    screenshot,
    send,
    start_conversation,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOCS = ROOT / "docs" / "screenshots"
EARLIER = [
    ("Plan a three-day trip to Lisbon", timedelta(hours=2)),
    ("Explain the GIL in simple terms", timedelta(hours=26)),
    ("Draft a polite reminder about the invoice", timedelta(days=3)),
    ("A regular expression for ISO 8601 dates", timedelta(days=9)),
    ("Compare PostgreSQL and SQLite for a small app", timedelta(days=40)),
]


def test_screenshots_of_the_main_pages(new_page, user, simulator, use_model):
    now = timezone.now()
    for title, ago in EARLIER:
        Conversation.objects.create(user=user, title=title, model="test", updated_at=now - ago)
    shots = []
    use_model("default?tps=40")
    page = new_page()
    url = start_conversation(page)
    send(page, "How does streaming work with the Chat Completions API?")
    # Streaming: a finished block already rendered (the list), the next one still being written.
    expect(page.locator(".cs-live .cs-live-text > ol")).to_be_visible(timeout=15_000)
    expect(page.locator(".cs-live .cs-stream")).to_have_text(re.compile(r"\S"))
    shots.append(screenshot(page, "reply-streaming"))
    expect(page.locator(".cs-assistant.cs-completed")).to_be_visible(timeout=15_000)
    shots.append(screenshot(page, "conversation"))
    shots.append(element_shot(page.locator(".cs-code").first, "code-block"))

    reply = page.locator(".cs-assistant.cs-completed").last
    reply.locator(".cs-details > summary").click()
    expect(reply.locator(".cs-details-list")).to_be_visible()
    shots.append(element_shot(reply, "details-open"))
    reply.locator(".cs-details > summary").click()

    reply.get_by_role("button", name="Good reply").click()
    expect(reply.get_by_role("button", name="Good reply")).to_have_attribute("aria-pressed", "true")
    reply.locator(".cs-feedback-more > summary").click()
    reply.get_by_role("textbox").fill("Clear, and the code runs as is.")
    shots.append(element_shot(reply, "feedback"))

    use_model("thinking?tps=80")
    send(page, "Which is better for a small app: PostgreSQL or SQLite?")
    thinking = page.locator(".cs-assistant").last.locator(".cs-thinking")
    expect(thinking).to_be_visible(timeout=15_000)
    thinking.locator("summary").click()
    expect(page.locator(".cs-assistant.cs-completed")).to_have_count(2, timeout=20_000)
    expect(page.locator(".cs-assistant").last.locator(".cs-thinking")).to_have_attribute("open", "")
    shots.append(element_shot(page.locator(".cs-assistant").last, "thinking-open"))

    use_model("default?tps=200")
    exchange = page.locator("#cs-transcript > .cs-exchange").last
    open_edit(exchange).fill("Which is better for a small app with a few users: "
                             "PostgreSQL or SQLite?")
    exchange.get_by_role("button", name="Send again").click()
    exchange = page.locator("#cs-transcript > .cs-exchange").last
    expect(exchange.get_by_role("navigation", name="Versions of this message")).to_contain_text(
        "2 / 2")
    expect(exchange.locator(".cs-assistant.cs-completed")).to_be_visible(timeout=15_000)
    shots.append(element_shot(exchange, "edit-versions"))

    use_model("stall")
    send(page, "Can you also show how to stop a reply halfway?")
    expect(page.locator(".cs-live .cs-stream")).to_have_text(re.compile(r"\S"))
    page.locator(".cs-live").get_by_role("button", name="Stop").click()
    expect(page.locator(".cs-assistant.cs-cancelled")).to_be_visible()
    shots.append(screenshot(page, "reply-stopped"))

    page.goto("/chat/")
    expect(page.locator(".cs-conversation-link")).to_have_count(len(EARLIER) + 1)
    shots.append(screenshot(page, "conversation-list"))

    phone = new_page(viewport=PHONE)
    phone.goto(url)
    expect(phone.locator(".cs-assistant")).to_have_count(3)
    shots.append(screenshot(phone, "phone-conversation"))

    dark = new_page(color_scheme="dark")
    dark.goto(url)
    expect(dark.locator(".cs-assistant")).to_have_count(3)
    dark.locator(".cs-code").first.scroll_into_view_if_needed()
    shots.append(screenshot(dark, "conversation-dark"))

    if os.environ.get("CHATSTREAM_DOCS_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        for shot in shots:
            shutil.copyfile(shot, DOCS / shot.name)


def element_shot(locator, name: str):
    """Save one element (with a little of the page around it) like ``screenshot``."""
    path = SCREENSHOTS / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    locator.evaluate("element => element.scrollIntoView({block: 'start'})")
    locator.screenshot(path=str(path), animations="disabled", caret="hide")
    return path
