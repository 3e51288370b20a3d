"""A reply's details open from the keyboard and say what the record says."""

from __future__ import annotations

import re

import pytest

from chatstream.models import Generation

from .conftest import expect, send, start_conversation

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_details_open_from_the_keyboard_and_show_the_generation(page, simulator, use_model):
    use_model("default?tps=400")
    start_conversation(page)
    send(page, "Hello")
    reply = page.locator(".cs-assistant.cs-completed")
    expect(reply).to_be_visible(timeout=15_000)
    summary = reply.locator(".cs-details > summary")
    expect(summary).to_have_accessible_name("Details of this reply")
    details = reply.locator(".cs-details-list")
    expect(details).to_be_hidden()

    summary.focus()
    page.keyboard.press("Enter")
    expect(details).to_be_visible()
    generation = Generation.objects.get()
    assert generation.usage_source == "provider"
    expect(details.get_by_role("definition")).to_have_text([
        re.compile(r"^test \(.+\)$"),
        re.compile(rf"^{generation.prompt_tokens}\b"),
        re.compile(rf"^{generation.completion_tokens}$"),
        re.compile(r"^\d+\.\d\d s$"),
        re.compile(r"^\d+\.\d\d s$"),
        "stop (the model finished)",
    ])

    page.keyboard.press("Escape")  # closes the disclosure, the focus back on its summary
    expect(details).to_be_hidden()
    expect(summary).to_be_focused()


def test_estimated_tokens_are_labelled_on_the_page(page, simulator, use_model):
    use_model("no-usage?tps=400")
    start_conversation(page)
    send(page, "Hello")
    reply = page.locator(".cs-assistant.cs-completed")
    expect(reply).to_be_visible(timeout=15_000)
    reply.locator(".cs-details > summary").click()
    expect(reply.locator(".cs-details-list .cs-estimated")).to_have_count(2)
