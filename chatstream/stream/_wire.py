"""What goes to the client: the server-sent events of a stream, whose names are part of the
public contract (README.md, "Public contract"), written by a :class:`Wire` for each kind of
client: ``PageWire`` for the htmx page (HTML, in the web layer: chatstream/web/wire.py),
:class:`JsonWire` for the JSON API (raw text in JSON), :class:`TextWire` for
``chatstream.api.astream`` (Python strings). All three
carry the same text with the same counts (:class:`Sent`); only the encoding differs.

The page's events, and how :class:`~chatstream.web.wire.PageWire` writes them, are described in
chatstream/web/wire.py; in silences each kind of client gets its ``ping``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from django.urls import reverse

from .. import tools
from ..models import Generation, ToolCall

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
        """The reply had ended before this client was sent any of it, and it shows none of it
        from an earlier stream (no ``after``): its final message is all it needs (no block is
        worth rendering). A client that shows some text gets its blocks and its last block
        even then: nothing it shows may be left as text for ``done`` to replace."""

    def thinking(self, text: str) -> T:
        """More of the reply's reasoning (a reasoning model's thinking), never counted in ids."""
        raise NotImplementedError

    async def tool(self, call: ToolCall) -> T:
        """One of the reply's tool calls, in the state it is in now (each time it changes)."""
        raise NotImplementedError

    async def step(self, following: Generation, *, ready: bool = True) -> T:
        """The reply goes on in ``following``, its next step: where to stream it from (``step``
        event); or, not ``ready``, it will once the user has decided its calls (no event)."""
        raise NotImplementedError

    async def error(self, notice: str) -> T:
        raise NotImplementedError

    async def done(self, final: str) -> T:
        raise NotImplementedError


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

    async def tool(self, call: ToolCall) -> bytes:
        return event("tool", _json(tools.as_dict(call))).encode()

    async def step(self, following: Generation, *, ready: bool = True) -> bytes:
        if not ready:
            return b""
        url = reverse("chatstream:api-generation-stream", args=[following.pk])
        return event("step", _json({"id": str(following.pk), "stream_url": url})).encode()

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

    async def tool(self, call: ToolCall) -> str:
        return ""

    async def step(self, following: Generation, *, ready: bool = True) -> str:
        return ""

    async def error(self, notice: str) -> str:
        return ""

    async def done(self, final: str) -> str:
        return ""


def _json(value: Any) -> str:
    # One line: JSON escapes every line end inside strings, so the data is one data: field.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
