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

from .conftest import PHONE, ROOT, expect, screenshot, send, start_conversation

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
    use_model("default?tps=60")
    page = new_page()
    url = start_conversation(page)
    send(page, "How does streaming work with the Chat Completions API?")
    expect(page.locator('.cs-live [aria-live="polite"]')).to_have_text(re.compile(r"\n\n.{20}"))
    shots.append(screenshot(page, "reply-streaming"))
    expect(page.locator(".cs-assistant.cs-completed")).to_be_visible(timeout=15_000)
    shots.append(screenshot(page, "conversation"))

    use_model("stall")
    send(page, "Can you also show how to stop a reply halfway?")
    expect(page.locator('.cs-live [aria-live="polite"]')).to_have_text(re.compile(r"\S"))
    page.locator(".cs-live").get_by_role("button", name="Stop").click()
    expect(page.locator(".cs-assistant.cs-cancelled")).to_be_visible()
    shots.append(screenshot(page, "reply-stopped"))

    page.goto("/chat/")
    expect(page.locator(".cs-conversation-link")).to_have_count(len(EARLIER) + 1)
    shots.append(screenshot(page, "conversation-list"))

    phone = new_page(viewport=PHONE)
    phone.goto(url)
    expect(phone.locator(".cs-assistant")).to_have_count(2)
    shots.append(screenshot(phone, "phone-conversation"))

    dark = new_page(color_scheme="dark")
    dark.goto(url)
    expect(dark.locator(".cs-assistant")).to_have_count(2)
    shots.append(screenshot(dark, "conversation-dark"))

    if os.environ.get("CHATSTREAM_DOCS_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        for shot in shots:
            shutil.copyfile(shot, DOCS / shot.name)
