"""markdown_blocks.py and the page's ``block`` events: Markdown rendered once per finished block
as a reply streams, adding up to the whole reply's rendering, whatever the pieces."""

from __future__ import annotations

import asyncio
import html
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st
from markdown_it.rules_block.state_block import StateBlock

from chatstream.sse import ServerSentEvent, SSEDecoder
from chatstream.stream import Sent
from chatstream.testing import DEFAULT_TEXT, Script
from chatstream.testing.scripts import MULTIBYTE_TEXT, tokenize
from chatstream.web.markdown_blocks import Block, BlockTracker
from chatstream.web.rendering import _markdown, render_markdown
from chatstream.web.wire import PageWire, delta

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
    "empty-items": "-\n\n  not in it\n\n-\n- b\n\n\n- c\n-\n\n\n- d\n",
    "tabs": "-\tone\n\tcontinued\n\n\tcode\n>\tquote\n\t> more\n\n1.\tx\n \t2. y\n",
    "rules-and-underlines": ("Title\n---\n- - -\n* * *\nPara\n***\nText | x\n--|--\nrow\n\n"
                             "# a | b\n|--|--|\n- one\n---\n"),
    "lazy-lines": "> quote\nlazy\n- item\nlazy too\n\n> > nested\n    1. x\n\n1. a\n   > b\nc\n",
    "fences-in-containers": ("- ```\n  code\n\n  more\n  ```\n- b\n\n> ~~~\n> x\n\nafter\n"
                             "1. x\n   ```\n   y\n   ```\nOut\n"),
    "ordered": "1. a\n2) b\n10. c\n   more\n\n3. d\n\n2 apples\n7. seven\n\n1234567890. no\n",
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


# Lines of every kind, each indented in every way that changes what it is.
INDENTS = ["", "", " ", "  ", "   ", "    ", "\t", " \t", "      "]
LINES = ["text", "more words", "- item", "* item", "+ item", "-", "- ", "1. one", "2. two",
         "1) one", "10. ten", "1.", "> quote", ">", "> > deep", ">text", "```", "```py", "~~~",
         "# head", "#nohead", "---", "***", "- - -", "* * *", "===", "| a | b |", "|---|---|",
         "--|--", "a | b", "[d]: https://example.com/", "'title'", "-x", "**bold**", "`code`",
         "1234567890. x", "-\ttab", "- > q", "- ```", "  - nested", "> - item", "> ```", ""]


@st.composite
def split_markdown(draw: Any) -> tuple[str, list[int]]:
    """A text of lines of any kind (no link to a definition after it), cut anywhere."""
    lines = draw(st.lists(st.tuples(st.sampled_from(INDENTS), st.sampled_from(LINES)),
                          min_size=1, max_size=12))
    text = "\n".join(indent + line for indent, line in lines) + draw(st.sampled_from(["", "\n"]))
    # One definition line at most: of two, the first may be a paragraph's text, a link to the
    # second, defined after it (the one case where blocks and the whole text differ, as
    # markdown_blocks.py says).
    assume(text.count("[d]:") <= 1)
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=len(text)))
    return text, cuts


any_text = st.one_of(split_corpus(), split_markdown())


@given(any_text)
@example(("", []))  # an empty reply: no block at all
def test_blocks_add_up_to_the_whole_reply_rendered_however_it_is_cut(case):
    text, cuts = case
    blocks, _tracker = stream(text, cuts)
    assert "".join(block.html for block in blocks) == render_markdown(text)
    # One after the other, from the first character to the last (as sent: LF line ends).
    assert [block.start for block in blocks] == [0, *(block.end for block in blocks[:-1])][
        :len(blocks)]
    assert (blocks[-1].end if blocks else 0) == len(as_sent(text))


@given(any_text, st.integers(0, 300))
def test_parses_left_to_settle_find_the_same_blocks(case, defer_over):
    """A tracker that leaves each parse of more than ``defer_over`` characters to settle() (as
    the page does, to take a long parse off the event loop) finds the blocks the plain one
    finds, at the same ends, adding up to the same rendering."""
    text, cuts = case
    plain, _tracker = stream(text, cuts)
    tracker, sent, spans, at = BlockTracker(defer_over=defer_over), Sent(), [], 0
    for cut in [*sorted(set(cuts)), len(text)]:
        piece, at = sent.piece(text[at:cut]), cut
        if piece and (found := tracker.finish(piece)):
            spans.append(found)
        if tracker.due:
            assert tracker.due > defer_over
            spans.append(tracker.settle())
        assert not tracker.due
    spans.append(tracker.rest())
    blocks = [tracker.render(span) for span in spans if span is not None]
    assert "".join(block.html for block in blocks) == render_markdown(text)
    assert {block.end for block in plain} <= {block.end for block in blocks}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_block_is_rendered_once_when_the_text_comes_a_character_at_a_time(name):
    text = CORPUS[name]
    blocks, _tracker = stream(text, list(range(len(text))))
    assert "".join(block.html for block in blocks) == render_markdown(text)


def test_a_list_is_finished_by_the_first_character_that_begins_the_next_block():
    tracker = BlockTracker()
    assert tracker.feed("1. a\n\n2") is None  # "2" may yet be "2. b", the same (loose) list
    assert tracker.feed(". b\n") is None
    assert tracker.feed("\n ") is None  # an indented line would go on in "b"
    found = tracker.feed("A")  # a letter, not indented enough: a new block, whatever follows
    assert found == Block(0, 12, str(render_markdown("1. a\n\n2. b\n\n")))
    assert "<p>a</p>" in found.html  # loose, as in the whole reply
    assert tracker.tail == " A" and tracker.start == 12
    assert tracker.feed("fter the list.\n") is None


def test_a_code_fence_is_finished_by_the_line_after_its_closing_line():
    tracker = BlockTracker()
    assert tracker.feed("```py\nx = 1\n") is None
    assert tracker.feed("``") is None
    assert tracker.feed("`\n") is None  # is the line after it blank (it goes with the fence)?
    found = tracker.feed("\n")
    assert found is not None and found.end == len("```py\nx = 1\n```\n\n")
    assert "x" in found.html and tracker.tail == ""
    tracker.feed("```\ny\n```\n")
    assert tracker.feed("  ") is None  # a blank line, maybe
    found = tracker.feed("Next")
    assert found is not None and found.html.count("y") == 1
    assert tracker.tail == "  Next"


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


@given(any_text, st.data())
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
    for at, character in enumerate(text, 1):  # mid-line too: a line's first characters count
        if found := tracker.feed(character):
            ends.add(found.end)
        restarted = BlockTracker()
        again = {block.end for block in restarted.restart(text[:at])}
        assert ends <= again and restarted.start == tracker.start, text[:at]


# Each text, fed a character at a time, finishes its first block (the characters up to END)
# with the character at AT: the first that shows the line there begins a block of its own;
# none before it (a line that may go on in the block).
DECIDED = {
    "list-then-paragraph": ("- one\n- two\n\nA long paragraph", 13, 13),
    "ordered-list-then-number": ("1. one\n2. two\n\n3 apples", 16, 15),
    "ordered-list-then-other-delimiter": ("1. one\n\n2) two", 9, 8),
    "list-then-rule": ("* one\n\n- - -", 7, 7),
    "list-then-dashes": ("- one\n\n--", 8, 7),
    "list-after-an-empty-item": ("- one\n-\n\n  not in it", 11, 9),
    "indented-code-then-text": ("    code\n\n    more\nText", 19, 19),
    "fence-then-text": ("```\ncode\n```\nText", 13, 13),
    "heading-then-text": ("# Title\nText", 8, 8),
    "paragraph-with-a-bracket-then-text": ("See [the docs].\n\nNext", 17, 17),
    # Lines that went on in the block first.
    "list-then-indented-line": ("- one\n\n  more of one\n\nText", 22, 22),
    "list-then-item": ("- one\n\n- two\n\nText", 14, 14),
    "list-then-empty-item": ("- one\n\n-\n\nText", 10, 10),
    "ordered-list-then-item": ("1. one\n\n22. two\n\nText", 17, 17),
    "indented-code-then-more": ("    code\n\n     more\nText", 20, 20),
    "paragraph-then-underline": ("Text\n---\nNext", 9, 9),
    "fence-then-spaces": ("```\ncode\n```\n   X", 16, 13),
}


@pytest.mark.parametrize(("text", "at", "end"), list(DECIDED.values()), ids=list(DECIDED))
def test_a_block_is_given_with_the_first_character_that_ends_it(text, at, end):
    tracker = BlockTracker()
    for character in text[:at]:
        assert tracker.feed(character) is None
    found = tracker.feed(text[at])
    assert found is not None and (found.start, found.end) == (0, end)
    assert found.html == render_markdown(text[:end])


def long(line: Callable[[int], str], size: int = 50_000) -> str:
    lines: list[str] = []
    while sum(map(len, lines)) < size:
        lines.append(line(len(lines)))
    return "".join(lines)


def indent(number: int) -> str:
    return " " * (len(str(number)) + 2)


LONG = {
    "list": long(lambda n: f"- item number {n} of the list, with **bold** text\n"),
    "nested-list": long(lambda n: f"{n + 1}. Step {n}\n{indent(n + 1)}- detail *{n}*\n"
                                  f"{indent(n + 1)}- more `{n}`\n"),
    "paragraph": long(lambda n: f"word{n} and more words, here and there\n"),
    "quote": long(lambda n: f"> quoted line {n}, with *emphasis*\n"),
    "indented-code": long(lambda n: f"    code_line({n})  # a comment\n"),
    "table": "| a | b |\n|---|---|\n" + long(lambda n: f"| cell {n} | value {n} |\n"),
}


def count_parsing(monkeypatch: pytest.MonkeyPatch, bound: int) -> Callable[[], int]:
    """Count the characters handed to markdown-it's block parser (the tracker's parses and the
    renderings of its blocks): over ``bound``, fail at once."""
    parsed = [0]
    start = StateBlock.__init__

    def counting(state: StateBlock, text: str, *args: Any) -> None:
        parsed[0] += len(text)
        assert parsed[0] <= bound, f"{parsed[0]:,} characters parsed, more than {bound:,}"
        start(state, text, *args)

    monkeypatch.setattr(StateBlock, "__init__", counting)
    return lambda: parsed[0]


@pytest.mark.parametrize("shape", sorted(LONG))
def test_a_long_block_costs_a_parse_and_a_rendering_not_one_parse_per_line(shape, monkeypatch):
    text = LONG[shape] + "\nAfter.\n"
    parsed = count_parsing(monkeypatch, 3 * len(text))
    tracker, blocks = BlockTracker(), []
    for piece in tokenize(text):
        if found := tracker.feed(piece):
            blocks.append(found)
    assert blocks[-1].end == len(LONG[shape]) + 1  # given when "After." began
    blocks.append(tracker.flush())
    assert parsed() <= 2.1 * len(text)  # its rendering, and one parse
    monkeypatch.undo()
    assert "".join(block.html for block in blocks) == render_markdown(text)


def test_lines_that_may_end_a_block_but_do_not_back_the_parses_off(monkeypatch):
    # Each "|||" under a line with a "|" could be a table's delimiter row; none is.
    text = long(lambda n: f"cell | {n}\n|||\n") + "\nAfter.\n"
    parsed = count_parsing(monkeypatch, 5 * len(text))
    blocks, _tracker = stream(text, list(range(0, len(text), 4)))
    assert parsed() <= 5 * len(text)
    monkeypatch.undo()
    assert "".join(block.html for block in blocks) == render_markdown(text)


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
    from chatstream.stream import JsonWire, TextWire

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
    # Pages that had some of the text when their connection broke and came back after the
    # reply ended: their blocks again, the rest, its last block, then the final message (as
    # kept from the final save). Nothing is left as text for the final message to replace:
    # whether the page had rendered none of its text, or every block its stream had sent.
    whole = as_sent(text)
    for have in (1, 57, len(whole) // 2, len(whole) - 1, len(whole)):
        plain = Page()
        plain.tail = whole[:have]
        streamed, wire, sent = Page(), PageWire(final), Sent()
        streamed.take(events(piece_out(wire, sent.piece(whole[:have]), sent)))
        got = events(browser.client.get(f"{url.split('?')[0]}?after={have}").content)
        assert got[-1].event == "done"
        assert {e.event for e in got[:-1]} <= {"delta", "block"}
        for resumed in (plain, streamed):
            resumed.take(got)
            assert resumed.tail == "" and "".join(resumed.blocks) == rendered
            assert resumed.final is not None and rendered in resumed.final
    assert len(simulator.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_a_page_that_had_all_of_an_ended_reply_as_text_gets_its_last_block_before_done(
        make_user, browser_for, simulator, use_model):
    # Its connection broke before the reply's end, and came back after it: nothing more to
    # send but what it has not rendered yet.
    text = "# Title\n\nOne paragraph.\n\nThe last one, *unfinished* when the page lost it."
    simulator.register("markdown", Script(text=text, tokens_per_second=0, first_token_delay=0))
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", use_model("markdown"))
    browser.client.get(url)  # the reply, to its end
    page, wire, sent = Page(), PageWire(final), Sent()
    page.take(events(piece_out(wire, sent.piece(text), sent)))  # the page's stream, cut
    assert page.tail == "The last one, *unfinished* when the page lost it."
    got = events(browser.client.get(f"{url.split('?')[0]}?after={len(text)}").content)
    page.take(got)
    assert [e.event for e in got][-2:] == ["block", "done"]
    assert page.tail == "" and "".join(page.blocks) == render_markdown(text)
