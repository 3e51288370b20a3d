"""The htmx page's wire: how a stream is written for the chat page (see chatstream/stream/_wire.py
for what every kind of client shares).

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

from django.urls import reverse
from django.utils.html import escape, format_html

from .._loops import in_executor
from ..models import Generation, ToolCall
from ..stream import PING, Render, Sent, Wire, event
from . import rendered
from .markdown_blocks import Block, BlockTracker, Span
from .rendering import render_tool_call


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
        self.following = ""  # the next step's element (see step())

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

    async def tool(self, call: ToolCall) -> bytes:
        size = len(call.arguments) + len(call.result)  # escaped: in a thread when long
        return event("tool", await rendered.off_loop(size, render_tool_call, call)).encode()

    async def step(self, following: Generation, *, ready: bool = True) -> bytes:
        """The next step's URL; its element goes after this one's final form (``done``):
        streaming it, so the page follows the reply without a script of its own, or, not
        ``ready``, saying it waits for the user's decisions (and offering Stop)."""
        # In a thread: a waiting step's element reads what it waits for.
        self.following = await in_executor(self.render)(following)
        if not ready:
            return b""
        return event("step", reverse("chatstream:generation-stream",
                                     args=[following.pk])).encode()

    async def error(self, notice: str) -> bytes:
        return await self._last() + error(
            format_html('<p class="cs-notice" role="alert">{}</p>', notice))

    async def done(self, final: str) -> bytes:
        return await self._last() + done(final + self.following)

    async def _last(self) -> bytes:
        """The rest of the text as its last block (the page then shows it as the final
        message will: nothing moves when that replaces it)."""
        if self.over:
            return b""
        rest = self.tracker.rest()  # with any parse left due: all of it is the last block
        spans = [*self.found, rest] if rest is not None else self.found
        size = sum(len(span.text) for span in spans)
        return await rendered.off_loop(size, self._events, spans) if spans else b""
