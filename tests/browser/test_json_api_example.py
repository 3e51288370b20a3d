"""The JSON API's JavaScript example (docs/json-api.md), run as it is in Chromium against the
live app: fetch with the session and its CSRF token, then EventSource, then Stop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from chatstream.models import Conversation, Generation
from chatstream.testing import DEFAULT_TEXT

from .conftest import expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DOC = Path(__file__).resolve().parents[2] / "docs" / "json-api.md"
PAGE = '<p id="reply"></p><p id="notice"></p><button id="stop">Stop</button>'


def example() -> str:
    """The first ``js`` block of the doc's "A complete example in JavaScript"."""
    section = DOC.read_text(encoding="utf-8").split("\n## A complete example in JavaScript\n")[1]
    return section.split("\n```js\n", 1)[1].split("\n```\n", 1)[0]


def run_example(page: Any) -> None:
    page.goto("/chat/")  # the site's origin, with its session and CSRF cookies
    page.evaluate(f"() => {{ document.body.innerHTML = {PAGE!r}; }}")
    page.evaluate(f"async () => {{\n{example()}\n}}")


def test_the_example_streams_a_reply_to_its_end(page, use_model):
    use_model("default?tps=100&first_token_delay=0")
    run_example(page)
    expect(page.locator("#stop")).to_be_disabled(timeout=20_000)
    assert page.locator("#reply").text_content() == DEFAULT_TEXT
    assert page.locator("#notice").text_content() == ""
    generation = Generation.objects.get()
    assert generation.status == "completed" and generation.content == DEFAULT_TEXT
    assert Conversation.objects.get().title == "Weekend plans"


def test_the_examples_stop_button_stops_the_reply(page, use_model):
    use_model("default?tps=10&first_token_delay=0")
    run_example(page)
    expect(page.locator("#reply")).not_to_be_empty()
    page.locator("#stop").click()
    expect(page.locator("#stop")).to_be_disabled()
    expect(page.locator("#notice")).to_have_text("Stopped by you.")
    shown = page.locator("#reply").text_content()
    generation = Generation.objects.get()
    assert generation.status == "cancelled" and generation.content == shown
    assert shown and DEFAULT_TEXT.startswith(shown) and shown != DEFAULT_TEXT
