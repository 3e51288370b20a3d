"""A reasoning model's thinking in the page: a collapsed disclosure above the reply that fills as
the model thinks, says how long it thought once the reply begins, and stays as it was when the
finished reply replaces the live one. Hostile reasoning is text, streamed or stored."""

from __future__ import annotations

import re

import pytest

from chatstream.models import Generation
from chatstream.testing import Script

from .conftest import expect, screenshot, send, start_conversation
from .test_xss import DETECTOR, _assert_nothing_ran_or_loaded, corpus, exfil  # noqa: F401

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

THOUGHT = ("The user asks why the sky is blue.\n"
           "Rayleigh scattering: shorter wavelengths scatter more.\n\n"
           "So I should explain scattering, then why not violet.")
ANSWER = "Because air scatters blue light more than red."

# Any element inside the thinking, at any moment, is a violation: it is plain text.
NO_ELEMENTS = """
window.__thinkingElements = [];
(() => {
  const report = (node) => window.__thinkingElements.push(node.outerHTML.slice(0, 120));
  new MutationObserver((records) => {
    for (const record of records) {
      for (const node of record.addedNodes) {
        if (!(node instanceof Element)) continue;
        if (node.parentElement && node.parentElement.closest(".cs-thinking-text")) report(node);
        node.querySelectorAll(".cs-thinking-text *").forEach(report);
      }
    }
  }).observe(document, {subtree: true, childList: true});
})();
"""


def test_thinking_streams_into_a_collapsed_disclosure_that_says_how_long_it_took(
    page, simulator, use_model
):
    simulator.register("thinker", Script(reasoning=THOUGHT, text=ANSWER, tokens_per_second=12,
                                         first_token_delay=0))
    use_model("thinker")
    start_conversation(page)
    send(page, "Why is the sky blue?")

    live = page.locator(".cs-live")
    thinking = live.locator(".cs-thinking")
    summary = thinking.locator("summary")
    expect(thinking).to_be_visible()
    expect(summary).to_have_text("Thinking…")
    expect(thinking).not_to_have_attribute("open", "")  # collapsed
    expect(live.locator(".cs-typing")).to_be_visible()  # nothing of the reply yet
    # A keyboard user opens it from its summary.
    summary.focus()
    page.keyboard.press("Enter")
    expect(thinking).to_have_attribute("open", "")
    expect(thinking.locator(".cs-thinking-text")).to_contain_text("Rayleigh")
    screenshot(page, "thinking-live")

    expect(live.locator(".cs-stream")).not_to_be_empty(timeout=15_000)
    expect(summary).to_have_text(re.compile(r"^Thought for \d+ s$"))
    shown_live = thinking.locator(".cs-thinking-text").text_content()
    assert shown_live == THOUGHT

    final = page.locator(".cs-assistant.cs-completed")
    expect(final).to_be_visible(timeout=15_000)
    final_thinking = final.locator(".cs-thinking")
    expect(final_thinking).to_have_attribute("open", "")  # as the reader left it
    expect(final_thinking.locator("summary")).to_have_text(re.compile(r"^Thought for \d+ s$"))
    assert final_thinking.locator(".cs-thinking-text").text_content() == shown_live
    assert final_thinking.bounding_box()["y"] < final.locator(".cs-text").bounding_box()["y"]
    generation = Generation.objects.get()
    assert generation.reasoning == THOUGHT and generation.content == ANSWER
    screenshot(page, "thinking-final")

    page.reload()  # collapsed again, with the stored text
    stored = page.locator(".cs-assistant .cs-thinking")
    expect(stored).not_to_have_attribute("open", "")
    stored.locator("summary").click()
    assert stored.locator(".cs-thinking-text").text_content() == THOUGHT


def test_a_reply_without_thinking_shows_no_disclosure(page, use_model):
    use_model("default?tps=40&first_token_delay=0")
    start_conversation(page)
    send(page, "Hello")
    expect(page.locator(".cs-live .cs-stream")).not_to_be_empty(timeout=15_000)
    expect(page.locator(".cs-thinking")).to_be_hidden()
    expect(page.locator(".cs-assistant.cs-completed")).to_be_visible(timeout=15_000)
    expect(page.locator(".cs-thinking")).to_have_count(0)


def test_hostile_reasoning_runs_nothing_and_loads_nothing_while_streaming_and_after(
    page, site, simulator, use_model, exfil  # noqa: F811
):
    text = corpus(exfil.server_address[1])
    simulator.register("xss-thinker", Script(reasoning=text, text="A plain answer.",
                                             tokens_per_second=150, first_token_delay=0))
    use_model("xss-thinker")
    dialogs: list[str] = []
    requests: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("request", lambda request: requests.append(request.url))
    page.add_init_script(DETECTOR)
    page.add_init_script(NO_ELEMENTS)
    start_conversation(page)
    send(page, "Think about it")

    thinking = page.locator(".cs-live .cs-thinking")
    thinking.locator("summary").click()  # open: what is shown is shown as text
    expect(thinking.locator(".cs-thinking-text")).to_contain_text(
        "<script>window.__pwned = 1")
    final = page.locator(".cs-assistant.cs-completed")
    expect(final).to_be_visible(timeout=15_000)
    assert Generation.objects.get().reasoning == text  # stored raw; escaped only when shown
    shown = final.locator(".cs-thinking-text")
    assert shown.text_content() == text
    expect(shown.locator("*")).to_have_count(0)
    assert page.evaluate("window.__thinkingElements") == []
    _assert_nothing_ran_or_loaded(page, dialogs, requests, exfil, site.url)

    page.reload()  # the server-rendered transcript
    expect(page.locator(".cs-assistant .cs-thinking-text")).to_have_count(1)
    assert page.locator(".cs-assistant .cs-thinking-text").text_content() == text
    page.wait_for_load_state("networkidle")
    expect(page.locator(".cs-thinking-text *")).to_have_count(0)
    assert page.evaluate("window.__thinkingElements") == []
    _assert_nothing_ran_or_loaded(page, dialogs, requests, exfil, site.url)
