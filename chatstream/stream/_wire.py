"""What goes to the client: the server-sent events of a stream, whose names are part of the
public contract (README.md, "Public contract"), written by a :class:`Wire` for each kind of
client: :class:`PageWire` for the htmx page (HTML), :class:`JsonWire` for the JSON API (raw
text in JSON), :class:`TextWire` for ``chatstream.api.astream`` (Python strings). All three
carry the same text with the same counts (:class:`Sent`); only the encoding differs.

The page's events:

``delta`` carries HTML-escaped reply text, and an ``id:`` counting the reply's characters as
sent so far, which a reconnecting client sends back to get only the rest; ``reset`` the whole
text so far, for a client that claims more than the reply has; ``error`` an HTML notice;
``done`` the final message HTML. In silences a ``: ping`` comment keeps idle proxies from
closing the connection, followed by a ``ping`` event that a page can see (comments never reach
its scripts) and so tell a silent connection from a dead one. A newline in the text becomes a
new ``data:`` line, so model output can never start a field or an event of its own.

``block`` is Markdown rendered as the reply streams (see chatstream/web/markdown_blocks.py): a
finished block, or several, sent in the same write right after the ``delta`` that finished
them, and the rest of the text as a last block just before the first of ``error`` and ``done``.
Its first data line is ``START END``, the characters of the reply it covers as ``id:`` counts
them (the first is 0); the lines after it are its sanitised HTML, which stands for those
characters. It has no ``id:`` (ids count only the reply's text). A stream that starts again
after a client's ``id:``, or with a ``reset``, first sends again, one by one, the blocks of the
text before it: a client takes only the one that starts where its own rendering ends, and the
ones after it. A client that knows only ``delta``, ``error`` and ``done`` ignores ``block``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django.utils.html import escape, format_html

from ..models import Generation
from ..web import rendered
from ..web.markdown_blocks import Block, BlockTracker, Span

T = TypeVar("T", bytes, str)

HEADERS = {
    "Cache-Control": "no-store",
    # nginx: pass each event on at once instead of buffering the response.
    "X-Accel-Buffering": "no",
    # GZipMiddleware (and similar) skip a response that already has an encoding.
    "Content-Encoding": "identity",
}
CONTENT_TYPE = "text/event-stream; charset=utf-8"
PING = b": ping\n\nevent: ping\ndata:\n\n"

Render = Callable[[Generation], str]  # a finished generation's final form, for a client


class Sent:
    """How much of a reply's text one client has been sent.

    The text goes out with its line ends as LF (a CR, or a CR and LF, is one LF, even when the
    two arrive in different pieces), and ``count`` counts it so: the ``id:`` of each ``delta``.
    ``raw`` is how much of the text as the provider sent it (and as it is stored) that covers.
    """

    __slots__ = ("count", "cr", "raw")

    def __init__(self) -> None:
        self.count = 0
        self.raw = 0
        self.cr = False  # the last character covered is a CR: an LF right after it is its own

    def piece(self, raw: str) -> str:
        """The text to send for the next ``raw`` characters of the reply."""
        self.raw += len(raw)
        if self.cr and raw[:1] == "\n":
            raw = raw[1:]
            self.cr = False
        if raw:
            self.cr = raw[-1] == "\r"
            if "\r" in raw:
                raw = raw.replace("\r\n", "\n").replace("\r", "\n")
        self.count += len(raw)
        return raw

    def rest(self, text: str) -> str:
        """What ``text`` (the reply so far, as stored) holds beyond what was sent."""
        return self.piece(text[self.raw:]) if len(text) > self.raw else ""

    @classmethod
    def at(cls, text: str, count: int) -> Sent | None:
        """A client that was sent the first ``count`` characters of ``text`` (the reply as
        stored); None if ``text`` is shorter than that as sent."""
        sent = cls()
        if "\r" not in text:  # the common case: no line end changes
            if count > len(text):
                return None
            sent.count = sent.raw = count
            return sent
        for char in text:
            if sent.count == count and not (sent.cr and char == "\n"):
                return sent
            sent.piece(char)
        return sent if sent.count == count else None


def event(name: str, data: str, id: int | None = None) -> str:
    """One event; ``data`` may hold any text (CR, LF and CRLF each start a new data line)."""
    if "\r" in data:
        data = data.replace("\r\n", "\n").replace("\r", "\n")
    head = f"event: {name}\n" if id is None else f"event: {name}\nid: {id}\n"
    return head + "data: " + data.replace("\n", "\ndata: ") + "\n\n"


def delta(text: str, sent: Sent) -> bytes:
    """One ``delta`` event carrying ``text`` (already passed through ``sent``)."""
    return event("delta", escape(text), sent.count).encode()


def reset(text: str, sent: Sent) -> bytes:
    """The reply's whole text so far (passed through ``sent``), to replace what is shown."""
    return event("reset", escape(text), sent.count).encode()


def error(html: str) -> bytes:
    return event("error", html).encode()


def done(html: str) -> bytes:
    return event("done", html).encode()


def block(found: Block | None) -> bytes:
    """A ``block`` event for ``found``, finished Markdown (nothing for None)."""
    if found is None:
        return b""
    return event("block", f"{found.start} {found.end}\n{found.html}").encode()


class Wire(Generic[T]):
    """How one kind of client is written to: its deltas, its notices, its end.

    ``render`` makes the generation's final form (the page's message HTML, the API's JSON), in
    the same call as the final save; ``done`` carries it. What may render Markdown is a
    coroutine (it may take a thread: see chatstream/web/rendered.py); ``delta``, for every piece
    of a reply, is not: it notes the blocks a piece finished (``pending``), and the caller
    awaits :meth:`blocks` only then.
    """

    ping: T
    empty: T
    pending = False  # the last delta finished blocks, which blocks() renders

    def __init__(self, render: Render) -> None:
        self.render = render

    def delta(self, text: str, sent: Sent) -> T:
        raise NotImplementedError

    async def blocks(self) -> T:
        """The events of the blocks the last deltas finished."""
        return self.empty

    async def reset(self, text: str, sent: Sent) -> T:
        raise NotImplementedError

    async def resume(self, text: str) -> T | None:
        """The client has ``text``, the reply's first characters as sent, from an earlier
        stream: what to send before the rest (None: nothing)."""
        return None

    def ended(self) -> None:
        """The reply had ended before this client was sent any of it: its final message is
        all it needs (no block is worth rendering)."""

    def thinking(self, text: str) -> T:
        """More of the reply's reasoning (a reasoning model's thinking), never counted in ids."""
        raise NotImplementedError

    async def error(self, notice: str) -> T:
        raise NotImplementedError

    async def done(self, final: str) -> T:
        raise NotImplementedError


class PageWire(Wire[bytes]):
    """The htmx page's events: escaped text, its Markdown blocks once each is finished, an HTML
    notice, the final message HTML. One per stream: it follows the text it sends.

    Blocks are found here as the text comes (cheap), and rendered where the length of their
    text says (see ``rendered.off_loop``): each in the order found, before the next piece.
    """

    ping = PING
    empty = b""

    def __init__(self, render: Render) -> None:
        super().__init__(render)
        # A long tail's parse (where its open block ends) is left to blocks(), as rendering is.
        self.tracker = BlockTracker(defer_over=rendered.INLINE_LIMIT)
        self.found: list[Span] = []
        self.over = False  # ended(): no block is rendered

    def delta(self, text: str, sent: Sent) -> bytes:
        if not self.over:
            if (span := self.tracker.finish(text)) is not None:
                self.found.append(span)
                self.pending = True
            elif self.tracker.due:
                self.pending = True
        return delta(text, sent)

    async def blocks(self) -> bytes:
        size = self.tracker.due + sum(len(span.text) for span in self.found)
        return await rendered.off_loop(size, self._blocks)

    def _blocks(self) -> bytes:
        if self.tracker.due and (span := self.tracker.settle()) is not None:
            self.found.append(span)
        return self._events(self.found)

    def _events(self, spans: list[Span]) -> bytes:
        self.found, self.pending = [], False
        return b"".join(block(self.tracker.render(span)) for span in spans)

    async def reset(self, text: str, sent: Sent) -> bytes:
        return reset(text, sent) + await self._again(text)

    async def resume(self, text: str) -> bytes:
        return await self._again(text)

    async def _again(self, text: str) -> bytes:
        return await rendered.off_loop(len(text), self._again_now, text)

    def _again_now(self, text: str) -> bytes:
        return self._events(self.tracker.again(text))

    def ended(self) -> None:
        self.over = True

    def thinking(self, text: str) -> bytes:
        return event("thinking", escape(text)).encode()

    async def error(self, notice: str) -> bytes:
        return await self._last() + error(
            format_html('<p class="cs-notice" role="alert">{}</p>', notice))

    async def done(self, final: str) -> bytes:
        return await self._last() + done(final)

    async def _last(self) -> bytes:
        """The rest of the text as its last block (the page then shows it as the final
        message will: nothing moves when that replaces it)."""
        if self.over:
            return b""
        rest = self.tracker.rest()  # with any parse left due: all of it is the last block
        spans = [*self.found, rest] if rest is not None else self.found
        size = sum(len(span.text) for span in spans)
        return await rendered.off_loop(size, self._events, spans) if spans else b""


class JsonWire(Wire[bytes]):
    """The JSON API's events: the same names and ids, each ``data`` one JSON object (the text
    as it is, never HTML): ``{"text"}`` for ``delta`` and ``reset``, ``{"message"}`` for
    ``error``, the generation for ``done``."""

    ping = PING
    empty = b""

    def delta(self, text: str, sent: Sent) -> bytes:
        return event("delta", _json({"text": text}), sent.count).encode()

    async def reset(self, text: str, sent: Sent) -> bytes:
        return event("reset", _json({"text": text}), sent.count).encode()

    def thinking(self, text: str) -> bytes:
        return event("thinking", _json({"text": text})).encode()

    async def error(self, notice: str) -> bytes:
        return event("error", _json({"message": notice})).encode()

    async def done(self, final: str) -> bytes:
        return event("done", final).encode()


class TextWire(Wire[str]):
    """Python code's view: the text pieces, nothing else ("" for every other event)."""

    ping = ""
    empty = ""

    def __init__(self, render: Render = lambda generation: "", *, after: int = 0) -> None:
        super().__init__(render)
        self.after = after

    def delta(self, text: str, sent: Sent) -> str:
        return text

    async def reset(self, text: str, sent: Sent) -> str:
        raise ValueError(f"after={self.after!r} is past the {sent.count} characters the "
                         "reply has so far.")

    def thinking(self, text: str) -> str:
        return ""

    async def error(self, notice: str) -> str:
        return ""

    async def done(self, final: str) -> str:
        return ""


def _json(value: Any) -> str:
    # One line: JSON escapes every line end inside strings, so the data is one data: field.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
