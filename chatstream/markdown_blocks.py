"""The Markdown blocks a growing reply has finished, each rendered once, as the reply streams.

A top-level Markdown block (a paragraph, a list, a table, a fenced code block...) is finished
once nothing still to come can change it: once a complete line, not blank and not its own,
follows it (until then ``---`` under a paragraph makes it a heading, an indented line continues
a list); a code fence once the line after its closing line has come; a paragraph, heading,
table, rule or quote once a blank line follows it (unless it holds a ``[``, which may be a link
whose ``[label]: url`` definition is still to come). :class:`BlockTracker` holds the unfinished
tail of the text; fed each piece as it is sent, it gives back the blocks that piece finished,
rendered by :func:`chatstream.rendering.render_markdown` (the same sanitiser as the whole
reply), and at the end the rest, as the last block.

**Guarantee**: the HTML of every block given, in order, is ``render_markdown(text)`` of the
whole text, with one exception: a link reference definition that comes after a block using it
was finished (that block shows ``[label]`` as text). Definitions already seen, before or after
a block, apply to it, as in the whole text.

**Where blocks end** does not depend on how the text was cut into pieces: after a block's last
line and the blank line after it, if any (more blank lines go with the next block). So a client
that rendered up to some block, then resumes the stream, finds that block's end among those
:meth:`BlockTracker.restart` gives.

**Cost**: each block is rendered once; the tail's complete lines are parsed (block level
only) when a piece brings a line end, and not at all while the tail ends with a code fence that
no new line could close. A long reply costs about one more rendering of its text, not one per
piece.

Counts are characters (code points) of the text as sent: ``Sent.count`` in
``chatstream/stream/_wire.py``, whose text has LF line ends only.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from markdown_it.rules_block import StateBlock
from markdown_it.token import Token

from .rendering import _markdown, render_markdown

__all__ = ["Block", "BlockTracker", "Span"]

# Blocks that no later line can change once a blank line follows them (a list can go on after
# one, an indented code block too).
_ENDED_BY_A_BLANK_LINE = {"paragraph_open", "heading_open", "table_open", "hr",
                          "blockquote_open"}


class Block(NamedTuple):
    """Characters ``start`` to ``end`` of the text, finished, as sanitised HTML."""

    start: int
    end: int
    html: str


class Span(NamedTuple):
    """Characters ``start`` to ``end`` of the text, finished, not rendered yet: ``text``."""

    start: int
    end: int
    text: str


class BlockTracker:
    """One reply's text as it grows: its finished blocks, each rendered once."""

    __slots__ = ("_closer", "_scanned", "references", "start", "tail")

    def __init__(self) -> None:
        self.start = 0  # where the unfinished tail begins
        self.tail = ""
        self.references: dict[str, Any] = {}  # link reference definitions seen, settled
        # While the tail ends with a code fence left open: a pattern for the line that could
        # close it, and up to which character of the text its lines were searched for one.
        self._closer: re.Pattern[str] | None = None
        self._scanned = 0

    def feed(self, text: str) -> Block | None:
        """``text`` more: the blocks it finished, rendered together; None if it finished none."""
        span = self.finish(text)
        return self.render(span) if span is not None else None

    def flush(self) -> Block | None:
        """The text has ended: the rest, as its last block (None if there is no rest)."""
        span = self.rest()
        return self.render(span) if span is not None else None

    def restart(self, text: str = "") -> list[Block]:
        """Start again from the first character, ``text`` so far: its finished blocks, one by one
        (a client resuming the stream may have rendered up to any one of them)."""
        return [self.render(span) for span in self.again(text)]

    # The same in two steps, finding then rendering, for a caller that renders elsewhere (in a
    # thread: see chatstream/stream/_wire.py). Spans are rendered in the order they are found,
    # each before the tracker is fed again (a block uses the link definitions of those before).

    def finish(self, text: str) -> Span | None:
        """``text`` more: the text of the blocks it finished, None if it finished none."""
        self.tail += text
        if "\n" not in text:  # only a complete line can begin the next block, or end one
            return None
        ends = self._ends()
        return self._take(ends[-1]) if ends else None

    def rest(self) -> Span | None:
        """The text has ended: the rest, as its last block (None if there is no rest)."""
        return self._take(len(self.tail)) if self.tail else None

    def again(self, text: str = "") -> list[Span]:
        """:meth:`restart`, not rendered."""
        self.start, self.tail, self.references, self._closer = 0, text, {}, None
        return [self._take(end - self.start) for end in self._ends()]

    def render(self, span: Span) -> Block:
        """``span`` as sanitised HTML, with the link definitions known."""
        return Block(span.start, span.end,
                     str(render_markdown(span.text, references=self.references)))

    def _take(self, length: int) -> Span:
        text, self.tail = self.tail[:length], self.tail[length:]
        span = Span(self.start, self.start + length, text)
        self.start += length
        return span

    def _ends(self) -> list[int]:
        """Where each finished top-level block of the tail ends (offsets in the tail, in order):
        after its last line."""
        complete = self.tail[:self.tail.rfind("\n") + 1]
        if self._closer is not None:
            if not self._closer.search(complete, self._scanned - self.start):
                self._scanned = self.start + len(complete)
                return []  # still one code block, open
            self._closer = None
        md = _markdown()
        tokens: list[Token] = []
        env: dict[str, Any] = {}
        state = StateBlock(complete, md, env, tokens)
        md.block.tokenize(state, 0, state.lineMax)
        self._learn(env, state.lineMax)
        top = [token for token in tokens
               if token.level == 0 and token.map is not None and token.nesting >= 0]
        def end(after: int) -> int:
            """Where a block ending before line ``after`` ends: with the blank line after it,
            if there is one (so the text being written does not begin with an empty line)."""
            return state.bMarks[after + (after < state.lineMax and state.isEmpty(after))]

        ends = [end(token.map[1]) for token in top[:-1] if token.map is not None]
        if not top or top[-1].map is None:
            return ends
        last, (first, after) = top[-1], top[-1].map
        if complete[state.bMarks[after]:].strip():
            # Lines that are not its own follow it (link reference definitions: no token).
            ends.append(end(after))
        elif last.type == "fence":
            closer = _closer(last.markup)
            if not (after - 1 > first and closer.fullmatch(complete, state.bMarks[after - 1],
                                                           state.eMarks[after - 1])):
                # Open: parse no more until a line that could close it.
                self._closer, self._scanned = closer, self.start + len(complete)
            elif after < state.lineMax:  # closed, and the line after it is known
                ends.append(end(after))
        elif (last.type in _ENDED_BY_A_BLANK_LINE and after < state.lineMax
              and state.isEmpty(after)
              and "[" not in complete[state.bMarks[first]:state.bMarks[after]]):
            ends.append(end(after))
        return ends

    def _learn(self, env: dict[str, Any], lines: int) -> None:
        """Keep the link reference definitions of a parse that no later line can change (one
        with a line after it: a title may still come on the next), the first of each label."""
        for label, definition in env.get("references", {}).items():
            if definition["map"][1] < lines:
                self.references.setdefault(label, definition)


def _closer(markup: str) -> re.Pattern[str]:
    """A line closing a code fence opened with ``markup``: the same character, at least as many
    times, indented by at most three spaces, nothing after but spaces and tabs (CommonMark)."""
    return re.compile(rf"^ {{0,3}}{re.escape(markup[0])}{{{len(markup)},}}[ \t]*$", re.MULTILINE)
