"""Markdown as it streams, in Chromium: each finished block shows rendered while the reply is
still written, and the reply's end changes nothing of what it shows."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest

from chatstream.models import Generation
from chatstream.testing import Script
from chatstream.testing.scripts import tokenize

from ..netcut import CutProxy
from .conftest import expect, record_stream, send, start_conversation, streamed_states

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Every kind of block, CRLF and LF line ends, characters beyond the BMP, a fence holding ```.
TEXT = (
    "# Streaming Markdown\r\n\r\n"
    "Intro with **bold**, `code` and ünïcödé 你好 🎉 👩\u200d💻.\r\n\r\n"
    "1. First\r\n   - nested *a*\r\n   - nested b\r\n\r\n     more of b\r\n2. Second\r\n\r\n"
    "| Name | Value |\n|------|-------|\n| a | `1` |\n| 🎉 | **2** |\n\n"
    "> A quote\n> > nested 🚀\n\n"
    "```python\ndef f():\n    return \"```\"\n```\n\n"
    "Setext heading\n---\n\n"
    "Done, *finally*."
)

# Reads what a reply's text shows: innerText as laid out, and its HTML; the Copy buttons that
# chatstream.js adds to code blocks (to the finished reply, and to live ones once the page has
# its words) left out. Records both for the live reply just before `done` replaces it.
WATCH = """() => {
  window.__read = (el) => {
    const buttons = [...el.querySelectorAll("button")];
    buttons.forEach((button) => { button.style.display = "none"; });
    const text = el.innerText;
    buttons.forEach((button) => { button.style.display = ""; });
    const copy = el.cloneNode(true);
    copy.querySelectorAll(".cs-stream, button").forEach((node) => node.remove());
    return {text, html: copy.innerHTML};
  };
  window.__beforeDone = null;
  window.__renderedLive = 0;
  document.addEventListener("htmx:sseBeforeMessage", (event) => {
    const live = event.target.closest(".cs-live");
    const shown = live && live.querySelector(".cs-live-text");
    if (!shown) return;
    if (event.detail.type === "done") {
      window.__beforeDone = {...window.__read(shown),
                             tail: shown.querySelector(".cs-stream").textContent};
    } else if (event.detail.type === "delta") {
      window.__renderedLive = Math.max(window.__renderedLive,
                                       shown.querySelectorAll(":scope > :not(.cs-stream)").length);
    }
  });
}"""


def watch(page: Any) -> None:
    page.evaluate(WATCH)


def assert_no_jump(page: Any, final: Any) -> None:
    """The live reply just before `done` showed what the finished reply shows: the same text,
    the same elements, nothing left as plain text."""
    before = page.evaluate("window.__beforeDone")
    assert before is not None, "no done event seen"
    after = page.evaluate("(el) => window.__read(el)", final.locator(".cs-text").element_handle())
    assert before["tail"] == ""
    assert before["text"] == after["text"]
    assert before["html"] == after["html"]


def use_text(simulator: Any, use_model: Any, text: str, tps: float) -> None:
    simulator.register("markdown", Script(text=text, tokens_per_second=tps, first_token_delay=0))
    use_model("markdown")


def test_blocks_show_rendered_while_the_reply_streams_and_its_end_does_not_jump(
        page, simulator, use_model):
    # ~10 s: long enough that every check of the live reply below runs while it streams,
    # on a busy machine too.
    use_text(simulator, use_model, TEXT, tps=12)
    start_conversation(page)
    watch(page)
    send(page, "Show me some Markdown")

    live = page.locator(".cs-live")
    # The heading is rendered while the rest is still being written, outside the live region
    # (what was read out as text is not read out again).
    expect(live.locator(".cs-live-text > h3")).to_have_text("Streaming Markdown")
    expect(live.locator(".cs-stream")).not_to_contain_text("# Streaming")
    expect(live.locator("[aria-live] h3")).to_have_count(0)
    expect(live.locator(".cs-live-text > ol li li").first).to_have_text("nested a")
    expect(live.locator(".cs-live-text > table td").first).to_have_text("a")

    final = page.locator(".cs-assistant.cs-completed")
    expect(final).to_be_visible(timeout=40_000)
    assert Generation.objects.get().content == TEXT
    assert page.evaluate("window.__renderedLive") >= 6
    assert_no_jump(page, final)
    expect(final.locator(".cs-text > pre, .cs-text pre")).to_contain_text('return "```"')


@pytest.mark.parametrize(("text", "cut_at"), [
    ("Here is the code:\n\n```python\n" + "".join(f"print({n})\n" for n in range(200)),
     "print(3)"),
    ("Steps:\n\n" + "".join(f"{n}. Step number {n}\n   - detail {n}\n" for n in range(1, 80)),
     "detail 3"),
], ids=["mid-fence", "mid-list"])
def test_a_reply_stopped_mid_block_ends_as_it_was_shown(page, simulator, use_model, text, cut_at):
    use_text(simulator, use_model, text, tps=20)
    start_conversation(page)
    watch(page)
    send(page, "Go")
    live = page.locator(".cs-live")
    expect(live.locator(".cs-live-text")).to_contain_text(cut_at)
    expect(live.locator(".cs-live-text > p")).to_have_count(1)  # the line before it, rendered
    live.get_by_role("button", name="Stop").click()

    stopped = page.locator(".cs-assistant.cs-cancelled")
    expect(stopped).to_be_visible()
    assert text.startswith(Generation.objects.get().content)
    assert_no_jump(page, stopped)


def test_a_list_shows_rendered_before_the_first_line_after_it_ends(page, simulator, use_model):
    # The model goes silent in the middle of the first line of the paragraph after the list:
    # its first characters alone show that the list has ended.
    text = "Steps:\n\n- one\n- two\n\nA long paragraph, written slowly, after the list"
    pieces = tokenize(text)
    sent = next(count for count in range(len(pieces)) if "".join(pieces[:count]).endswith("A long"))
    simulator.register("markdown", Script(text=text, tokens_per_second=0, first_token_delay=0,
                                          stall_after=sent))
    use_model("markdown")
    start_conversation(page)
    watch(page)
    send(page, "Go")

    live = page.locator(".cs-live")
    expect(live.locator(".cs-live-text > ul > li")).to_have_text(["one", "two"])
    expect(live.locator(".cs-stream")).to_have_text("A long")  # still being written
    live.get_by_role("button", name="Stop").click()
    stopped = page.locator(".cs-assistant.cs-cancelled")
    expect(stopped).to_be_visible()
    assert_no_jump(page, stopped)


@pytest.fixture
def network(site: Any) -> Iterator[CutProxy]:
    with CutProxy(site.port) as proxy:
        yield proxy


@pytest.mark.parametrize("silent", [False, True], ids=["rst", "silent"])
def test_a_reply_resumed_after_a_dropped_connection_renders_each_block_once(
        new_page, network, simulator, use_model, settings, silent):
    settings.CHATSTREAM_PING_INTERVAL = 1  # a page that hears nothing for 3.5 s reconnects
    settings.CHATSTREAM_RECONNECT_GRACE = 30
    use_text(simulator, use_model, TEXT, tps=12)
    page = new_page(base_url=network.url)
    start_conversation(page)
    watch(page)
    record_stream(page)
    send(page, "Show me some Markdown")
    live = page.locator(".cs-live")
    expect(live.locator(".cs-live-text > ol")).to_be_visible(timeout=15_000)  # blocks rendered
    network.cut(silent=silent)
    page.wait_for_timeout(3000)
    network.restore()

    final = page.locator(".cs-assistant.cs-completed")
    expect(final).to_be_visible(timeout=30_000)
    generation = Generation.objects.get()
    assert generation.content == TEXT and len(simulator.requests) == 1
    assert network.connections >= 2, "the page never connected again"
    # The text shown as text only grew; the rendered part only moved forward; no block twice.
    states = streamed_states(page, generation.content)
    assert len(states) >= 3, states
    for before, after in itertools.pairwise(states):
        assert after.startswith(before), (before[-40:], after[-40:])
    assert_no_jump(page, final)


def test_a_page_joining_mid_reply_renders_the_blocks_so_far(new_page, simulator, use_model,
                                                            settings):
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.2
    use_text(simulator, use_model, TEXT, tps=15)
    first = new_page()
    url = start_conversation(first)
    send(first, "Show me some Markdown")
    expect(first.locator(".cs-live .cs-live-text > ol")).to_be_visible(timeout=15_000)
    second = first.context.new_page()
    second.goto(url)
    watch(second)
    shown = second.locator(".cs-live .cs-live-text")
    expect(shown.locator("> h3")).to_have_text("Streaming Markdown")
    expect(shown.locator("> .cs-stream")).not_to_have_text(re.compile(r"^# "))
    final = second.locator(".cs-assistant.cs-completed")
    expect(final).to_be_visible(timeout=20_000)
    assert_no_jump(second, final)
