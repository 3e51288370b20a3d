"""markdown_blocks.py and the page's ``block`` events: Markdown rendered once per finished block
as a reply streams, adding up to the whole reply's rendering, whatever the pieces."""

from __future__ import annotations

import asyncio
import html
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatstream.markdown_blocks import Block, BlockTracker
from chatstream.rendering import _markdown, render_markdown
from chatstream.sse import ServerSentEvent, SSEDecoder
from chatstream.stream._wire import PageWire, Sent, delta
from chatstream.testing import DEFAULT_TEXT, Script
from chatstream.testing.scripts import MULTIBYTE_TEXT

CORPUS = {
    "default": DEFAULT_TEXT,
    "nested-lists": ("Plan:\n\n1. First\n   - nested *a*\n   - nested b\n\n     more of b\n"
                     "2. Second\n   1. deep\n      - deeper\n\n- x\n- y\n\n10. ten\n11. eleven\n"),
    "loose-list": "1. a\n\n2. b\n\n3. c\n",
    "table": ("| Name | Value |\n|:-----|------:|\n| a | `1` |\n| b | **2** |\nrow too\n\n"
              "Text | not\n--|--\nx|y\n\nEnd."),
    "fences": ("Intro:\n\n```python\ndef f():\n    return '```'\n```\nAfter.\n\n~~~~\n~~~\n"
               "still code\n~~~~ \n\n    indented code\n\n    more\n\n````\n```\n````\nend"),
    "headings": "# One\nText\n## Two ##\nSetext\n===\n\nAnother\n---\n\n***\n#### Four\n",
    "blockquotes": ("> quote\ncontinued lazily\n> > nested\n\n> - list in quote\n>\n"
                    "> ```\n> code\n\nOut."),
    "cut-mid-fence": "Code:\n\n```js\nconst a = 1;\n\nconst b",
    "cut-mid-list": "Steps:\n\n1. one\n2. two\n   - two a\n3. thr",
    "multibyte": (MULTIBYTE_TEXT + "\n\n- 你好 🎉\n- «x» 👩\u200d💻\n\n**bold 🚀** ✓\n\n"
                  "| ✓ | 🎉 |\n|---|---|\n| é | 好 |\n"),
    "crlf": ("Para one\r\nline two\r\n\r\n- a\r\n- b\r\n\r\n```\r\ncode\r\n\r\n```\r\n"
             "End\r\rlast\r\n"),
    "references": ("[d]: https://example.com/docs \"Docs\"\n[e]:\n  https://example.com/e\n\n"
                  "See [the docs][d].\n\n- item [e]\n- [d]\n\n> [D]\n"),
    "hostile": ("<script>alert(1)</script>\n\n[x](javascript:alert(1))\n\n"
                "<img src=x onerror=alert(1)>\n\n```\" onclick=\"alert(1)\nx\n```\n\n"
                "![p](https://evil.example/p?q=secret)\n"),
    "paragraph-then-table": "Intro line\n| a | b |\n|---|---|\n| 1 | 2 |\n",
    "blank-start": "\n\n  \nText\n\n\n",
}


def stream(text: str, cuts: list[int], *, end: bool = True) -> tuple[list[Block], BlockTracker]:
    """``text`` (as the provider sent it) fed in pieces cut at ``cuts``, as a stream sends it;
    then, with ``end``, the end."""
    tracker, sent, blocks, at = BlockTracker(), Sent(), [], 0
    for cut in [*sorted(set(cuts)), len(text)]:
        piece = sent.piece(text[at:cut])
        at = cut
        if piece and (found := tracker.feed(piece)):
            blocks.append(found)
    if end and (found := tracker.flush()):
        blocks.append(found)
    return blocks, tracker


def as_sent(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


@st.composite
def split_corpus(draw: Any) -> tuple[str, list[int]]:
    text = CORPUS[draw(st.sampled_from(sorted(CORPUS)))]
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=len(text)))
    return text, cuts


@given(split_corpus())
def test_blocks_add_up_to_the_whole_reply_rendered_however_it_is_cut(case):
    text, cuts = case
    blocks, _tracker = stream(text, cuts)
    assert "".join(block.html for block in blocks) == render_markdown(text)
    # One after the other, from the first character to the last (as sent: LF line ends).
    assert [block.start for block in blocks] == [0, *(block.end for block in blocks[:-1])]
    assert blocks[-1].end == len(as_sent(text))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_block_is_rendered_once_when_the_text_comes_a_character_at_a_time(name):
    text = CORPUS[name]
    blocks, _tracker = stream(text, list(range(len(text))))
    assert "".join(block.html for block in blocks) == render_markdown(text)


def test_a_block_is_finished_when_the_next_one_begins_on_a_complete_line():
    tracker = BlockTracker()
    assert tracker.feed("1. a\n\n2") is None  # "2" may yet be "2. b", the same (loose) list
    assert tracker.feed(". b\n") is None
    assert tracker.feed("\nAfter") is None  # a line being written never finishes a block
    found = tracker.feed(" the list.\n")
    assert found == Block(0, 12, str(render_markdown("1. a\n\n2. b\n\n")))
    assert "<p>a</p>" in found.html  # loose, as in the whole reply
    assert tracker.tail == "After the list.\n" and tracker.start == 12


def test_a_code_fence_is_finished_by_the_line_after_its_closing_line():
    tracker = BlockTracker()
    assert tracker.feed("```py\nx = 1\n") is None
    assert tracker.feed("``") is None
    assert tracker.feed("`\n") is None  # is the line after it blank (it goes with the fence)?
    found = tracker.feed("\n")
    assert found is not None and found.end == len("```py\nx = 1\n```\n\n")
    assert "x" in found.html and tracker.tail == ""
    tracker.feed("```\ny\n```\n")
    assert tracker.feed("Next") is None
    found = tracker.feed(" line\n")
    assert found is not None and found.html.count("y") == 1
    assert tracker.tail == "Next line\n"


def test_a_long_open_code_fence_is_not_parsed_again_for_each_line(monkeypatch):
    md = _markdown()
    parses: list[int] = []
    tokenize = md.block.tokenize
    monkeypatch.setattr(md.block, "tokenize",
                        lambda state, *args: (parses.append(1), tokenize(state, *args))[1])
    tracker = BlockTracker()
    assert tracker.feed("Some code:\n\n") == Block(0, 12, "<p>Some code:</p>\n")
    assert tracker.feed("````python\n") is None
    for number in range(2000):
        assert tracker.feed(f"print({number})  # ``` ~~~\n") is None
    assert tracker.feed("```\n") is None  # too short to close it
    assert len(parses) <= 4  # not one per line: the fence could not close
    assert tracker.feed("````\n") is None
    found = tracker.feed("\n")
    assert found is not None and found.html.count("print(") == 2000


def test_a_reference_defined_earlier_applies_to_later_blocks():
    text = "[site]: https://example.com/\n\nIntro.\n\n- see [site]\n\n> [site] again\n"
    blocks, tracker = stream(text, list(range(len(text))))
    assert len(blocks) == 3  # a definition goes with the block it follows (here, none)
    assert "".join(b.html for b in blocks) == render_markdown(text)
    assert blocks[1].html.count('href="https://example.com/"') == 1
    assert "SITE" in tracker.references  # as markdown-it keeps labels: normalised


def test_a_reference_defined_after_a_finished_block_using_it_leaves_that_block_unlinked():
    # The documented exception: that block was rendered before its definition arrived.
    text = "Use [d].\n\nOther.\n\n[d]: https://example.com/\n"
    blocks, _tracker = stream(text, list(range(len(text))))
    assert blocks[0].html == "<p>Use [d].</p>\n"
    assert 'href="https://example.com/"' in render_markdown(text)
    assert "".join(b.html for b in blocks[1:]) == "<p>Other.</p>\n"


@given(split_corpus(), st.data())
def test_a_restart_gives_every_finished_block_of_the_text_so_far_one_by_one(case, data):
    text, cuts = case
    text = as_sent(text)
    have = data.draw(st.integers(0, len(text)))
    streamed, tracker = stream(text[:have], cuts, end=False)
    # A page that was sent the first `have` characters, and rendered them up to any block's
    # end, finds that end among the restart's blocks, and carries on from there.
    restarted = BlockTracker()
    again = restarted.restart(text[:have])
    assert {block.end for block in streamed} <= {block.end for block in again}
    assert restarted.start == tracker.start  # and no further than the stream had come
    rest = restarted.flush()
    assert "".join(block.html for block in [*again, *([rest] if rest else [])]) \
        == render_markdown(text[:have])


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_blocks_end_in_the_same_places_however_far_the_text_has_come(name):
    text = as_sent(CORPUS[name])
    tracker, ends = BlockTracker(), set()
    for at, character in enumerate(text, 1):
        if found := tracker.feed(character):
            ends.add(found.end)
        if character == "\n":
            restarted = BlockTracker()
            again = {block.end for block in restarted.restart(text[:at])}
            assert ends <= again and restarted.start == tracker.start, text[:at]


def test_a_paragraph_is_finished_by_the_blank_line_after_it():
    tracker = BlockTracker()
    assert tracker.feed("Hello **world**.\n") is None  # "===" could make it a heading
    assert tracker.feed("\n") == Block(0, 18, "<p>Hello <strong>world</strong>.</p>\n")
    assert tracker.tail == ""  # the text being written does not begin with an empty line
    # One that holds a "[" waits for the next block: its link's definition may come first.
    assert tracker.feed("See [the docs].\n\n") is None
    found = tracker.feed("[the docs]: https://example.com/\n\nNext.\n")
    assert found is not None and 'href="https://example.com/"' in found.html


# --- the page's events ----------------------------------------------------------------------------

class Page:
    """What chatstream.js does with a stream's events, in Python: rendered blocks, then the text
    being written."""

    def __init__(self) -> None:
        self.rendered = 0
        self.blocks: list[str] = []
        self.tail = ""
        self.final: str | None = None
        self.last_id = 0

    def take(self, events: list[ServerSentEvent]) -> None:
        for event in events:
            if event.event == "delta":
                self.tail += html.unescape(event.data)
                self.last_id = int(event.id)
            elif event.event == "reset":
                self.blocks, self.rendered, self.tail = [], 0, html.unescape(event.data)
                self.last_id = int(event.id)
            elif event.event == "block":
                head, _, body = event.data.partition("\n")
                start, end = map(int, head.split(" "))
                if start == self.rendered and end > start:
                    self.blocks.append(body)
                    self.tail = self.tail[end - start:]
                    self.rendered = end
            elif event.event == "done":
                self.final = event.data


def events(data: bytes) -> list[ServerSentEvent]:
    decoder = SSEDecoder()
    return decoder.feed(data) + decoder.close()


def final(generation: Any) -> str:
    return f"<final>{generation}</final>"


T = TypeVar("T")


def now(coroutine: Coroutine[Any, Any, T]) -> T:
    """A wire's coroutine run to its end (rendering may take a thread)."""
    return asyncio.run(coroutine)


def piece_out(wire: PageWire, piece: str, sent: Sent) -> bytes:
    """What a stream writes for ``piece``: its delta, then the blocks it finished."""
    out = wire.delta(piece, sent)
    return out + now(wire.blocks()) if wire.pending else out


@given(split_corpus(), st.booleans())
def test_page_events_keep_the_deltas_and_end_with_the_reply_rendered(case, stopped):
    text, cuts = case
    wire, sent, page, at = PageWire(final), Sent(), Page(), 0
    plain = Sent()
    for cut in [*sorted(set(cuts)), len(text)]:
        raw, at = text[at:cut], cut
        piece = sent.piece(raw)
        if not piece:
            continue
        out = piece_out(wire, piece, sent)
        # The delta is the same bytes as ever, first; anything after it is blocks.
        expected = delta(plain.piece(raw), plain)
        assert out.startswith(expected)
        assert {e.event for e in events(out[len(expected):])} <= {"block"}
        page.take(events(out))
    if stopped:
        page.take(events(now(wire.error("Stopped."))))
        assert page.tail == ""  # the rest was rendered before the notice
    page.take(events(now(wire.done("generation"))))
    assert page.final == "generation"
    assert page.tail == "" and page.rendered == len(as_sent(text))
    assert "".join(page.blocks) == render_markdown(text)  # what `done` shows: no jump


@given(split_corpus(), st.data())
def test_a_page_resuming_mid_reply_gets_the_blocks_it_missed(case, data):
    text, cuts = case
    text = as_sent(text)
    have = data.draw(st.integers(0, len(text)))
    # The page's first stream: the text up to `have`; its last block may be lost in transit.
    first, sent, page = PageWire(final), Sent(), Page()
    at = 0
    for cut in [*(c for c in sorted(set(cuts)) if c < have), have]:
        if piece := sent.piece(text[at:cut]):
            got = events(piece_out(first, piece, sent))
            page.take(got if data.draw(st.booleans()) else got[:1])
        at = cut
    assert page.last_id == have
    # It reconnects after `have`: the text before it, then the rest.
    second = PageWire(final)
    page.take(events(now(second.resume(text[:have]))))
    rest = Sent.at(text, have)
    assert rest is not None
    if piece := rest.rest(text):
        page.take(events(piece_out(second, piece, rest)))
    page.take(events(now(second.done("generation"))))
    assert page.tail == "" and "".join(page.blocks) == render_markdown(text)


def test_a_reset_starts_the_rendering_again_from_the_first_character():
    wire, page = PageWire(final), Page()
    sent = Sent()
    page.take(events(piece_out(wire, sent.piece("# Title\n\nOne.\n\nTw"), sent)))
    assert page.blocks and page.rendered > 0
    again = Sent()
    out = events(now(wire.reset(again.piece("# Title\n\nOne.\n\nTwo"), again)))
    assert [e.event for e in out] == ["reset", "block", "block"]  # "Two" may yet go on
    page.take(out)
    page.take(events(now(wire.done("generation"))))
    assert "".join(page.blocks) == render_markdown("# Title\n\nOne.\n\nTwo")


def test_a_block_event_carries_its_counts_then_its_html_on_data_lines():
    wire, sent = PageWire(final), Sent()
    out = piece_out(wire, sent.piece("**Hi** 🎉\n\n```\na\r\n```\n\n"), sent).decode()
    # Both blocks finished by this delta, rendered in one call; counted in characters (the
    # emoji is one), no id (ids count only the reply's text).
    rendered = str(render_markdown("**Hi** 🎉\n\n```\na\n```\n\n"))
    assert out == (delta("**Hi** 🎉\n\n```\na\n```\n\n", sent).decode()
                   + "event: block\ndata: 0 21\ndata: " + rendered.replace("\n", "\ndata: ")
                   + "\n\n")


def test_other_wires_send_no_blocks():
    from chatstream.stream._wire import JsonWire, TextWire

    for wire in (JsonWire(final), TextWire()):
        sent = Sent()
        out = wire.delta(sent.piece("a\n\nb\n\nc\n"), sent)
        assert (b"block" if isinstance(out, bytes) else "block") not in out
        assert not wire.pending and now(wire.resume("a\n\nb\n")) is None


# --- over HTTP ------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_reply_and_its_resumed_streams_add_up_to_its_final_message(make_user, browser_for,
                                                                      simulator, use_model):
    text = CORPUS["nested-lists"] + "\n" + CORPUS["fences"] + "\n\n" + DEFAULT_TEXT
    simulator.register("markdown", Script(text=text, tokens_per_second=0, first_token_delay=0))
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", use_model("markdown"))
    page = Page()
    page.take(events(browser.client.get(url).content))
    rendered = "".join(page.blocks)
    assert page.tail == "" and rendered == render_markdown(text)
    assert page.final is not None and rendered in page.final
    assert len(page.blocks) > 1  # not only the last one, at the end
    # Pages that had some of the text (as text) when their connection broke, after the reply
    # ended: the rest, then the final message, as kept from the final save (nothing is
    # rendered again for them: no block).
    whole = as_sent(text)
    for have in (1, 57, len(whole) // 2, len(whole) - 1, len(whole)):
        resumed = Page()
        resumed.tail = whole[:have]
        resumed.take(got := events(browser.client.get(f"{url.split('?')[0]}?after={have}").content))
        assert resumed.tail == whole and not resumed.blocks
        assert [e.event for e in got if e.event != "delta"] == ["done"]
        assert resumed.final is not None and rendered in resumed.final
    assert len(simulator.requests) == 1
