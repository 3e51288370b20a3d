"""The Markdown blocks a growing reply has finished, each rendered once, as the reply streams.

A top-level Markdown block (a paragraph, a list, a table, a fenced code block...) is finished
once nothing still to come can change it, and is given as soon as the text shows that: a list,
indented code, a heading or a rule once the first characters of a line show that it begins a
block of its own (after a list and a blank line, a letter at the start of a line; until then an
indented line would continue the list); a paragraph, table or quote once a blank line follows
it (until then ``---`` under a paragraph makes it a heading), or the next block begins; a code
fence once the line after its closing line has begun (a blank one goes with it). One that holds
a ``[`` waits for the next block: its link's ``[label]: url`` definition may come first.
:class:`BlockTracker` holds the unfinished tail of the text; fed each piece as it is sent, it
gives back the blocks that piece finished, rendered by
:func:`chatstream.web.rendering.render_markdown` (the same sanitiser as the whole reply), and at the
end the rest, as the last block.

**Guarantee**: the HTML of every block given, in order, is ``render_markdown(text)`` of the
whole text, with one exception: a link reference definition that comes after a block using it
was finished (that block shows ``[label]`` as text). Definitions already seen, before or after
a block, apply to it, as in the whole text.

**Where blocks end** does not depend on how the text was cut into pieces: after a block's last
line and the blank line after it, if any (more blank lines go with the next block). So a client
that rendered up to some block, then resumes the stream, finds that block's end among those
:meth:`BlockTracker.restart` gives, for any text so far (a partial last line included): every
line is judged the same way whether it came in one piece or many.

**Cost**, linear in the reply: each block is rendered once, and each line is looked at once, on
its own (how it begins: an item at the list's marker, an indented line, a ``>`` line, a table
row...). markdown-it alone says where blocks end, by a block-level parse of the tail, done only
where a line may end the open block: at a real end that costs about one more rendering of the
finished block. A parse that finds no end makes the next wait until the tail has grown by half,
so odd shapes cost a few parses of their length in all, at the price of a later decision. A
long reply costs about one more rendering of its text, not one per line or piece.

Counts are characters (code points) of the text as sent: ``Sent.count`` in
``chatstream/stream/_wire.py``, whose text has LF line ends only.
"""

from __future__ import annotations

import enum
import re
from functools import lru_cache
from typing import Any, NamedTuple

from markdown_it.rules_block import StateBlock
from markdown_it.token import Token

from .rendering import _markdown, render_markdown

__all__ = ["Block", "BlockTracker", "Span"]

# Blocks that no later line can change once a blank line follows them (a list can go on after
# one, an indented code block too).
_ENDED_BY_A_BLANK_LINE = {"paragraph_open", "heading_open", "table_open", "hr",
                          "blockquote_open"}
# How many characters of a line, after its indentation, can show that it begins a new block
# (an ordered list's marker: nine digits, its delimiter and a space).
_HEAD = 12
# After a parse that found no end, none for a line that only may end the block until the tail
# has grown this much: the parses of one growing block then add up to a few times its length.
_GROWTH = 1.5
# What a container holding nothing but paragraphs has inside it (besides its own close).
_PARAGRAPHS = {"paragraph_open", "inline", "paragraph_close", "list_item_close",
               "bullet_list_close", "ordered_list_close", "blockquote_close"}


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
    """One reply's text as it grows: its finished blocks, each rendered once.

    :meth:`feed`, :meth:`flush` and :meth:`restart` find blocks and render them. A caller that
    keeps long work elsewhere (in a thread: see chatstream/stream/_wire.py) takes the two steps
    apart: :meth:`finish`, :meth:`rest` and :meth:`again` find the blocks' text (a
    :class:`Span`), :meth:`render` renders one. With ``defer_over``, :meth:`finish` also leaves a
    parse of a tail longer than that many characters, and the text after the line that called
    for it, to :meth:`settle` (``due`` says so); nothing may be fed before it is settled. Spans
    are rendered in the order they are found (a block uses the link definitions of those
    before it).
    """

    __slots__ = ("_defer_over", "_doubt", "_due", "_head", "_length", "_lines", "_partial",
                 "_quiet", "_ready", "_shape", "_skip", "_unread", "references", "start")

    def __init__(self, *, defer_over: int | None = None) -> None:
        self.start = 0  # where the unfinished tail begins
        self.references: dict[str, Any] = {}  # link reference definitions seen, settled
        self._ready: list[str] = []  # blocks found finished, not given yet (within one call)
        self._defer_over = defer_over
        self._begin()

    def _begin(self) -> None:
        """An empty tail."""
        self._lines: list[str] = []  # the tail's complete lines, with their line ends
        self._length = 0  # their characters
        self._skip = 0  # parses begin here: before it, blank lines and settled definitions
        self._partial: list[str] = []  # the line being written, as it came
        self._head = _Head()
        self._shape: _Shape = _Empty()
        self._quiet = 0  # no parse for a line that only may end the block below this length
        self._doubt = False  # a line said to end the block did not: none is trusted again
        self._due: tuple[_Verdict, bool] | None = None  # a parse left to settle()
        self._unread = ""  # the text after the line that called for it

    @property
    def tail(self) -> str:
        """The text not given yet."""
        return "".join(self._lines) + "".join(self._partial) + self._unread

    @property
    def due(self) -> int:
        """The characters of the parse left to :meth:`settle` (0: none)."""
        return self._length - self._skip if self._due is not None else 0

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

    def finish(self, text: str) -> Span | None:
        """``text`` more: the text of the blocks it finished, together; None if none."""
        assert self._due is None, "settle() the parse left due first"
        if self._head.settled and "\n" not in text:  # more of a line already judged
            self._partial.append(text)
            return None
        self._read(text)
        return self._take()

    def settle(self) -> Span | None:
        """Do the parse :meth:`finish` left due, and read on: the blocks found, together."""
        if self._due is not None:
            (verdict, partial), self._due = self._due, None
            self._parse(verdict, partial=partial, now=True)
            unread, self._unread = self._unread, ""
            self._read(unread, now=True)
        return self._take()

    def rest(self) -> Span | None:
        """The text has ended: the rest, as its last block (None if there is no rest)."""
        rest = self.tail
        self._begin()
        return self._span(rest) if rest else None

    def again(self, text: str = "") -> list[Span]:
        """:meth:`restart`, not rendered (and nothing left due)."""
        self.start, self.references, self._ready = 0, {}, []
        self._begin()
        self._read(text, now=True)
        finished, self._ready = self._ready, []
        return [self._span(block) for block in finished]

    def render(self, span: Span) -> Block:
        """``span`` as sanitised HTML, with the link definitions known."""
        return Block(span.start, span.end,
                     str(render_markdown(span.text, references=self.references)))

    def _take(self) -> Span | None:
        if not self._ready:
            return None
        finished, self._ready = "".join(self._ready), []
        return self._span(finished)

    def _span(self, text: str) -> Span:
        span = Span(self.start, self.start + len(text), text)
        self.start += len(text)
        return span

    def _read(self, text: str, *, now: bool = False) -> None:
        """Take ``text`` in, line by line: each line is first judged by its first characters
        (as they come), then, once complete, as a whole. Unless ``now``, it stops after a
        parse left due, keeping the text after it for :meth:`settle`."""
        *complete, partial = text.split("\n")
        for at, part in enumerate(complete):
            self._write(part, now=now)
            if self._due is not None:  # the line is to be completed after the parse
                self._unread = "\n" + "".join(p + "\n" for p in complete[at + 1:]) + partial
                return
            line, self._partial = "".join(self._partial), []
            self._complete(line, now=now)
            if self._due is not None:
                self._unread = "".join(p + "\n" for p in complete[at + 1:]) + partial
                return
        if partial:
            self._write(partial, now=now)

    def _write(self, part: str, *, now: bool) -> None:
        """More of the line being written: does it now surely begin a new block?"""
        self._partial.append(part)
        head = self._head
        if head.settled:
            return
        head.add(part)
        if not head.content or self._doubt:
            return
        if self._shape.ends_before(head):
            head.settled = True
            self._parse(_Verdict.ENDS, partial=True, now=now)
        elif len(head.content) >= _HEAD:
            head.settled = True  # no more characters could tell

    def _complete(self, text: str, *, now: bool) -> None:
        """A complete line (``text``, without its line end) joins the tail."""
        self._lines.append(text + "\n")
        self._length += len(text) + 1
        self._head = _Head()
        verdict, shape = self._shape.line(_Line(text))
        if verdict is _Verdict.CONTINUES:
            self._shape = shape
        elif (verdict is _Verdict.ENDS and not self._doubt) or self._length >= self._quiet:
            self._parse(verdict, now=now)
        else:
            self._shape = _Unknown()  # until a parse says what the block has become

    def _parse(self, verdict: _Verdict, *, partial: bool = False, now: bool) -> None:
        """Parse the tail (block level only), take the blocks it finished, learn what the open one
        is. ``partial``: the line being written surely begins a new block; it is parsed as if it
        ended there, and only the blocks before it are taken. Unless ``now``, a long tail's
        parse is left due (see ``defer_over``)."""
        if not now and self._defer_over is not None and (
                self._length - self._skip > self._defer_over):
            self._due = (verdict, partial)
            return
        complete = "".join(self._lines)
        skip = self._skip
        text = complete[skip:] + ("".join(self._partial) + "\n" if partial else "")
        md = _markdown()
        tokens: list[Token] = []
        env: dict[str, Any] = {}
        state = StateBlock(text, md, env, tokens)
        md.block.tokenize(state, 0, state.lineMax)
        self._learn(env, state.lineMax - partial)
        ends, last = _ends(tokens, state, text)
        ends = [skip + end for end in ends if not partial or skip + end <= len(complete)]
        taken = 0
        for end in ends:
            self._ready.append(complete[taken:end])
            taken = end
        rest = complete[taken:]
        if ends:
            self._lines, self._length = [rest] if rest else [], len(rest)
            self._skip, self._quiet, self._doubt = 0, 0, False
        elif isinstance(self._shape, _Empty):
            # No block before: this parse found the first one, or none. Then the next begins
            # at the first definition that a line still to come could change.
            if last is None:
                self._skip = skip + state.bMarks[_unsettled(env, state.lineMax)]
        else:
            self._quiet = skip + int((self._length - skip) * _GROWTH)
            self._doubt = self._doubt or verdict is _Verdict.ENDS
        if partial and not ends:
            self._shape = _Unknown()  # the line being written was counted in: start afresh
        elif partial or last is None:
            self._shape = _Empty()
        else:
            self._shape = _shape(tokens, last, state, text)

    def _learn(self, env: dict[str, Any], lines: int) -> None:
        """Keep the link reference definitions of a parse that no later line can change (one
        with a line after it: a title may still come on the next), the first of each label."""
        for label, definition in env.get("references", {}).items():
            if definition["map"][1] < lines:
                self.references.setdefault(label, definition)


def _unsettled(env: dict[str, Any], lines: int) -> int:
    """The first line of the first link reference definition of a parse that a later line
    could change (its last line is the last), or ``lines`` if none."""
    definitions = [*env.get("references", {}).values(), *env.get("duplicate_refs", ())]
    return min((definition["map"][0] for definition in definitions
                if definition["map"][1] >= lines), default=lines)


def _ends(tokens: list[Token], state: StateBlock, text: str) -> tuple[list[int], int | None]:
    """Where each finished top-level block of a parse of ``text`` ends (offsets, in order),
    after its last line; and the index of the last block's token if it is not finished."""
    top = [index for index, token in enumerate(tokens)
           if token.level == 0 and token.map is not None and token.nesting >= 0]

    def end(after: int) -> int:
        """Where a block ending before line ``after`` ends: with the blank line after it, if
        there is one (so the text being written does not begin with an empty line)."""
        return state.bMarks[after + (after < state.lineMax and state.isEmpty(after))]

    ends = [end(tokens[index].map[1]) for index in top[:-1]]  # type: ignore[index]
    if not top:
        return ends, None
    last = tokens[top[-1]]
    first, after = last.map  # type: ignore[misc]
    if text[state.bMarks[after]:].strip():
        # Lines that are not its own follow it (link reference definitions: no token).
        ends.append(end(after))
    elif last.type == "fence":
        if after < state.lineMax and _closed(last, state, text):
            ends.append(end(after))
        else:
            return ends, top[-1]
    elif (last.type in _ENDED_BY_A_BLANK_LINE and after < state.lineMax
          and state.isEmpty(after) and "[" not in text[state.bMarks[first]:state.bMarks[after]]):
        ends.append(end(after))
    else:
        return ends, top[-1]
    return ends, None


def _closed(fence: Token, state: StateBlock, text: str) -> bool:
    """Whether ``fence``'s last line closes it."""
    first, after = fence.map  # type: ignore[misc]
    return after - 1 > first and _closer(fence.markup).fullmatch(
        text, state.bMarks[after - 1], state.eMarks[after - 1]) is not None


@lru_cache(maxsize=64)
def _closer(markup: str) -> re.Pattern[str]:
    """A line closing a code fence opened with ``markup``: the same character, at least as many
    times, indented by at most three spaces, nothing after but spaces and tabs (CommonMark)."""
    return re.compile(rf" {{0,3}}{re.escape(markup[0])}{{{len(markup)},}}[ \t]*")


# --- how lines begin --------------------------------------------------------------------------
# Each answers for a line's text after its indentation (at most three columns, or it would be
# indented code), as markdown-it's block rules of the same names judge it.

_FENCE = re.compile(r"(`{3,}|~{3,})(.*)")
_HEADING = re.compile(r"#{1,6}(?:[ \t]|$)")
_ORDERED = re.compile(r"([0-9]{1,9})([.)])(?=[ \t]|$)")
_SETEXT = re.compile(r"(?:=+|-+)[ \t]*")
_DELIMITER = re.compile(r"[|:-][|: \t-]*")  # what a table's delimiter row may be


def _fence(content: str) -> bool:
    match = _FENCE.match(content)
    return match is not None and not (match[1][0] == "`" and "`" in match[2])


def _hr(content: str) -> bool:
    mark = content[:1]
    return (mark in ("*", "-", "_") and content.count(mark) >= 3
            and not content.strip(mark + " \t"))


def _bullet(content: str) -> str | None:
    """The marker of the bullet list item ``content`` begins, if it begins one."""
    if content[:1] in ("*", "-", "+") and content and content[1:2] in ("", " ", "\t"):
        return content[0]
    return None


def _starts(content: str) -> bool:
    """Whether it begins a quote, a code fence, a thematic break or an ATX heading: what ends a
    paragraph, a list or a table row on the line before it (list items aside)."""
    return (content[:1] == ">" or _fence(content) or _hr(content)
            or _HEADING.match(content) is not None)


def _plain(content: str) -> bool:
    """Whether, after a paragraph's line, it can only be more of that paragraph: it can begin
    no block, and change none before it (``---`` under a paragraph makes a heading, a delimiter
    row under a line with a ``|`` a table)."""
    return bool(content) and not (
        _starts(content) or _bullet(content) is not None or _ORDERED.match(content)
        or _SETEXT.fullmatch(content) or _DELIMITER.fullmatch(content))


def _lazy(content: str) -> bool:
    """Whether, after a line of a paragraph open in a list item or a quote, it goes on in that
    paragraph when not indented enough for the container (a lazy line): it begins no block that
    ends a paragraph (an underline or a delimiter row there is text)."""
    return bool(content) and not (_starts(content) or _bullet(content) is not None
                                  or _ORDERED.match(content))


def _columns(spaces: str, column: int = 0) -> int:
    """The column after ``spaces`` (spaces and tabs) from ``column``: a tab goes on to the next
    multiple of four, as markdown-it counts indentation."""
    if "\t" not in spaces:
        return column + len(spaces)
    for char in spaces:
        column += 4 - column % 4 if char == "\t" else 1
    return column


class _Line:
    """A complete line of the tail, without its line end: its indentation in columns, and its
    text after it."""

    __slots__ = ("blank", "col", "content", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.content = text.lstrip(" \t")
        self.col = _columns(text[:len(text) - len(self.content)])
        self.blank = not self.content


class _Head:
    """The first characters of the line being written: the width of its indentation, and up to
    ``_HEAD`` characters of its text after it."""

    __slots__ = ("col", "content", "settled")

    def __init__(self) -> None:
        self.col = 0
        self.content = ""
        self.settled = False  # it was found to begin a new block, or never can be

    def add(self, part: str) -> None:
        if len(self.content) >= _HEAD:
            return
        if not self.content:
            rest = part.lstrip(" \t")
            self.col = _columns(part[:len(part) - len(rest)], self.col)
            part = rest
        self.content += part[:_HEAD - len(self.content)]


class _Item(NamedTuple):
    """A list item's first line."""

    marker: str  # its bullet, or its number's delimiter
    number: int | None
    width: int  # the column a line must reach to go on in it
    text: str  # its first line's text ("": the item begins with a blank line)
    code: bool  # that text is indented code (five spaces or more after the marker)


def _item(line: _Line) -> _Item | None:
    """The list item ``line`` begins, if it begins one (markdown-it's list rule)."""
    content = line.content
    if ordered := _ORDERED.match(content):
        marker, number, after = ordered[2], int(ordered[1]), ordered.end()
    elif bullet := _bullet(content):
        marker, number, after = bullet, None, 1
    else:
        return None
    initial = line.col + after
    rest = content[after:]
    text = rest.lstrip(" \t")
    spaces = _columns(rest[:len(rest) - len(text)], initial) - initial if text else 1
    code = spaces > 4
    return _Item(marker, number, initial + (1 if code else spaces), text, code)


def _inside(para: bool, simple: bool, indent: int, content: str) -> tuple[bool, bool]:
    """``(para, simple)`` of a container (a list item, a quote) after a line of its own whose
    text is ``content``, indented ``indent`` columns past the container's.

    ``para``: a paragraph is open at the line's end (a lazy line, not indented enough for the
    container, would go on in it); ``simple``: the container holds paragraphs only. Either is
    False when unsure: a line that only they would show to continue the block is then parsed.
    """
    if not content:
        return False, simple
    if para and _plain(content):
        return True, simple
    if (para or simple) and indent < 4:
        if simple and _plain(content):
            return True, True
        # A list item in it: its first line is a paragraph (or, not interrupting one, more of
        # it). Tabs would need the line's own columns: unsure.
        item = None if "\t" in content[:_HEAD + 4] else _item(_Line(content))
        if item is not None and not item.code and _plain(item.text) and not _hr(content):
            return True, False
    return False, False


# --- what the open block is -------------------------------------------------------------------

class _Verdict(enum.Enum):
    CONTINUES = enum.auto()  # the line surely goes on in the open block: nothing to parse
    ENDS = enum.auto()  # it surely ends the open block: parse now
    MAYBE = enum.auto()  # it may (or begins the first block): parse, unless backing off


class _Shape:
    """What the tail's open block is, as far as the lines since the last parse show: which lines
    surely go on in it, which surely end it. Unknown: every line is parsed (backing off)."""

    __slots__ = ()

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        """The verdict on the next complete line, and the shape after it if it continues."""
        return _Verdict.MAYBE, self

    def ends_before(self, head: _Head) -> bool:
        """Whether a line that begins with ``head`` surely begins a new block, whatever comes
        after it (and changes nothing before it). It stays so as the line grows."""
        return False


class _Unknown(_Shape):
    __slots__ = ()


class _Empty(_Shape):
    """No block yet: blank lines, link reference definitions."""

    __slots__ = ()

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        return (_Verdict.CONTINUES if line.blank else _Verdict.MAYBE), self


class _Done(_Shape):
    """A block that the next line not blank ends (one that holds a ``[``, after a blank line;
    a list whose last item is empty, after two)."""

    __slots__ = ()

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        return (_Verdict.CONTINUES if line.blank else _Verdict.ENDS), self

    def ends_before(self, head: _Head) -> bool:
        return True


class _FenceClosed(_Shape):
    """A code fence closed on the last line: the next one ends it (with it, if blank)."""

    __slots__ = ()

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        return _Verdict.ENDS, self

    def ends_before(self, head: _Head) -> bool:
        return True


class _FenceOpen(_Shape):
    __slots__ = ("closer",)

    def __init__(self, markup: str) -> None:
        self.closer = _closer(markup)

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        if self.closer.fullmatch(line.text):
            return _Verdict.CONTINUES, _FenceClosed()
        return _Verdict.CONTINUES, self


class _Code(_Shape):
    """Indented code: lines indented by four columns or more, and blank lines, go on in it."""

    __slots__ = ()

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        if line.blank or line.col >= 4:
            return _Verdict.CONTINUES, self
        return _Verdict.ENDS, self

    def ends_before(self, head: _Head) -> bool:
        return head.col < 4


class _Bracketed(_Shape):
    """A block that a blank line ends, unless it holds a ``[``."""

    __slots__ = ("bracket",)

    def __init__(self, *, bracket: bool) -> None:
        self.bracket = bracket

    def blank(self) -> tuple[_Verdict, _Shape]:
        return (_Verdict.CONTINUES, _Done()) if self.bracket else (_Verdict.ENDS, self)

    def goes_on(self, line: _Line) -> tuple[_Verdict, _Shape]:
        self.bracket = self.bracket or "[" in line.text
        return _Verdict.CONTINUES, self


class _Single(_Bracketed):
    """A heading or a thematic break: one line, which any next one ends."""

    __slots__ = ()

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        return self.blank() if line.blank else (_Verdict.ENDS, self)

    def ends_before(self, head: _Head) -> bool:
        # A delimiter row would make an ATX heading with a "|" a table's header row.
        return head.content[0] not in "|-:"


class _Paragraph(_Bracketed):
    """A paragraph; ``pipe``: its last line holds a ``|``, not indented as code (a delimiter row
    under it would make that line a table's header row)."""

    __slots__ = ("pipe",)

    def __init__(self, *, bracket: bool, pipe: bool) -> None:
        super().__init__(bracket=bracket)
        self.pipe = pipe

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        if line.blank:
            return self.blank()
        content = line.content
        pipe, self.pipe = self.pipe, line.col < 4 and "|" in line.text
        if line.col >= 4 or _plain(content):
            return self.goes_on(line)
        if pipe and content[0] in "|-:":
            return _Verdict.MAYBE, self  # a table's delimiter row, maybe
        if _SETEXT.fullmatch(content):
            return _Verdict.CONTINUES, _Single(bracket=self.bracket)  # a heading, underlined
        if _starts(content):
            return _Verdict.ENDS, self
        item = _item(line)
        if item is not None and item.text and item.number in (None, 1):
            return _Verdict.ENDS, self  # a list item that can interrupt a paragraph
        return self.goes_on(line)  # an item that cannot, or a delimiter row: text


class _Table(_Bracketed):
    """Any line not blank goes on in a table as a row, but one that begins another block."""

    __slots__ = ()

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        if line.blank:
            return self.blank()
        if line.col >= 4 or _starts(line.content) or _item(line) is not None:
            return _Verdict.ENDS, self
        return self.goes_on(line)


class _Quote(_Bracketed):
    """A block quote: its ``>`` lines, and lazy lines (more of a paragraph open in it)."""

    __slots__ = ("para", "simple")

    def __init__(self, *, bracket: bool, para: bool, simple: bool) -> None:
        super().__init__(bracket=bracket)
        self.para, self.simple = para, simple

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        if line.blank:
            return self.blank()
        content = line.content
        if content[0] == ">":  # however indented: markdown-it asks that of a quote's first only
            inner = content[1:]
            inner = inner[1:] if inner[:1] == " " else inner
            text = inner.lstrip(" \t")
            if "\t" in inner[:len(inner) - len(text)]:  # columns that depend on the '>'
                self.para = self.simple = False
            else:
                self.para, self.simple = _inside(self.para, self.simple,
                                                 len(inner) - len(text), text)
            return self.goes_on(line)
        # Lazy. Indented lines only in a quote holding paragraphs alone: in one within it, a
        # lazy line loses its indentation to markdown-it, and an indented "1. x" ends both.
        if self.para and (_lazy(content) or (self.simple and line.col >= 4)):
            return self.goes_on(line)
        if line.col < 4 and (_starts(content) or _item(line) is not None):
            return _Verdict.ENDS, self
        return _Verdict.MAYBE, self


class _List(_Shape):
    """A list: lines indented as far as its last item's text go on in that item, items with the
    list's marker begin more of it; after a blank line, any other line ends it."""

    __slots__ = ("blank", "empty", "marker", "para", "simple", "width")

    def __init__(self, item: _Item) -> None:
        self.marker = item.marker
        self.begin(item)

    def begin(self, item: _Item) -> None:
        """Its last item is now ``item``."""
        self.width, self.empty, self.blank = item.width, not item.text, False
        self.para = bool(item.text) and not item.code and _plain(item.text)
        self.simple = self.para or not item.text

    def line(self, line: _Line) -> tuple[_Verdict, _Shape]:
        if line.blank:
            if self.empty and self.blank:
                # markdown-it ends a list after an empty item and two blank lines.
                return _Verdict.CONTINUES, _Done()
            self.blank, self.para = True, False
            return _Verdict.CONTINUES, self
        # An item that began empty, then a blank line: markdown-it ends the item there.
        if line.col >= self.width and not (self.empty and self.blank):
            self.para, self.simple = _inside(self.para, self.simple, line.col - self.width,
                                             line.content)
            self.blank = self.empty = False
            return _Verdict.CONTINUES, self
        item = _item(line) if line.col < 4 else None
        if item is not None and item.marker == self.marker and not _hr(line.content):
            self.begin(item)
            return _Verdict.CONTINUES, self
        # Not indented enough for the item, it can begin no block of the item's own either.
        if self.blank or item is not None or _starts(line.content):
            return _Verdict.ENDS, self
        if self.para and _lazy(line.content):
            return _Verdict.CONTINUES, self  # lazy: more of the paragraph open in the item
        return _Verdict.MAYBE, self

    def ends_before(self, head: _Head) -> bool:
        if not self.blank or (head.col >= self.width and not self.empty):
            return False
        if head.col >= 4:
            return True
        content = head.content
        if self.marker in "*-+":
            return content[0] != self.marker or content[1:2] not in ("", " ", "\t")
        digits = len(content) - len(content.lstrip("0123456789"))
        if not 0 < digits < 10:
            return True
        after = content[digits:]
        return bool(after) and (after[0] != self.marker or after[1:2] not in ("", " ", "\t"))


def _shape(tokens: list[Token], index: int, state: StateBlock, text: str) -> _Shape:
    """The shape of the open block whose token is ``tokens[index]``, the last of a parse of
    ``text`` (whose last line is the tail's)."""
    block = tokens[index]
    first, after = block.map  # type: ignore[misc]
    lines = state.lineMax
    if block.type == "code_block":
        return _Code()
    if after < lines:  # the lines after it are blank (another would have ended it)
        return _Done()
    bracket = "[" in text[state.bMarks[first]:]
    inner = tokens[index + 1:]
    para = any(token.type == "paragraph_open" and token.map is not None
               and token.map[1] == lines for token in inner)
    if block.type == "fence":
        return _FenceClosed() if _closed(block, state, text) else _FenceOpen(block.markup)
    if block.type in ("heading_open", "hr"):
        return _Single(bracket=bracket)
    if block.type == "paragraph_open":
        last_line = _Line(text[state.bMarks[lines - 1]:state.eMarks[lines - 1]])
        return _Paragraph(bracket=bracket, pipe=last_line.col < 4 and "|" in last_line.text)
    if block.type == "table_open":
        return _Table(bracket=bracket)
    if block.type == "blockquote_open":
        return _Quote(bracket=bracket, para=para,
                      simple={token.type for token in inner} <= _PARAGRAPHS)
    if block.type not in ("bullet_list_open", "ordered_list_open"):
        return _Unknown()
    last = max(number for number, token in enumerate(inner)
               if token.type == "list_item_open" and token.level == 1)
    start = inner[last].map[0]  # type: ignore[index]
    item = _item(_Line(text[state.bMarks[start]:state.eMarks[start]]))
    if item is None or item.marker != block.markup:
        return _Unknown()
    shape = _List(item)
    shape.blank = state.isEmpty(lines - 1)
    shape.empty = not item.text and lines - start - shape.blank == 1
    shape.para = para
    shape.simple = {token.type for token in inner[last + 1:]} <= _PARAGRAPHS
    return shape
