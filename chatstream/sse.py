"""Incremental server-sent events decoder: bytes in any split -> :class:`ServerSentEvent`.

Guarantee: the events are exactly those that the WHATWG HTML standard's "interpreting an event
stream" algorithm dispatches, however the byte stream is cut into chunks
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

- the stream is UTF-8; a character split across chunks is never corrupted, and invalid bytes
  become U+FFFD, never an exception; one leading BOM is stripped, only at the very start;
- lines end in CRLF, LF or CR; a CR ending one chunk ends its line at once (so an event whose
  blank line is that CR is dispatched without waiting) and an LF starting the next chunk is not
  a second line end;
- ``last_event_id`` changes only when an event block ends (as the spec's "last event ID string"
  does), so an ``id:`` in an event cut off by the end of the stream is not remembered; ``retry``
  changes as soon as its line is read;
- :meth:`SSEDecoder.close` discards the unfinished line and the undispatched event.

Lines are found in the bytes and each value is decoded on its own: CR and LF never occur inside
a UTF-8 sequence and an invalid sequence never absorbs them, so this decodes exactly as decoding
the whole stream would. Memory is bounded by ``max_event_size`` (characters of one event's data,
or of one unfinished line) and the work is linear in the input: pending pieces are kept in lists
and joined once, never re-scanned.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatstream.exceptions import EventTooLargeError

__all__ = ["DEFAULT_MAX_EVENT_SIZE", "SSEDecoder", "ServerSentEvent"]

#: Default bound on one event's data (and on one unfinished line), in characters.
DEFAULT_MAX_EVENT_SIZE = 16 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"
_DATA_FIELD = b"data: "
_CONTINUATION_BYTES = bytes(range(0x80, 0xC0))  # without them, one byte is left per character
# `int in bytes` is a plain byte search, where `bytes in bytes` first tries an int conversion.
_CR, _LF = 13, 10

# What the start of the next chunk may need: nothing, a BOM stripped, or the LF of a CRLF skipped.
_NOTHING, _STREAM_START, _AFTER_CR = 0, 1, 2


@dataclass(slots=True)
class ServerSentEvent:
    """A dispatched event: ``id`` is the last event ID then, ``retry`` one given in its block."""

    event: str = "message"
    data: str = ""
    id: str = ""
    retry: int | None = None


class SSEDecoder:
    """Turn the bytes of one ``text/event-stream`` response into events (see the module doc)."""

    __slots__ = (
        "_boundary",
        "_counted",
        "_data",
        "_data_size",
        "_dirty",
        "_event_retry",
        "_id",
        "_limit",
        "_pending",
        "_tail",
        "_tail_size",
        "_type",
        "last_event_id",
        "max_event_size",
        "retry",
    )

    def __init__(self, *, max_event_size: int | None = DEFAULT_MAX_EVENT_SIZE) -> None:
        self.max_event_size = max_event_size
        self._limit: float = max_event_size if max_event_size is not None else float("inf")
        self.last_event_id = ""
        self.retry: int | None = None
        self._id = ""
        self._start_stream()

    def _start_stream(self) -> None:
        self._boundary = _STREAM_START
        self._pending = b""  # the first bytes of the stream, while they may still be a BOM
        self._tail: list[bytes] = []  # pieces of the unfinished last line (never a line end)
        self._tail_size = 0  # in bytes, which is at least its number of characters
        self._counted: tuple[list[bytes], int, int] | None = None  # see _check_tail
        self._clear_event()

    def _clear_event(self) -> None:
        # The data lines: joined with "\n", they are the spec's data buffer minus its last LF.
        self._data: list[str] = []
        self._data_size = -1  # len("\n".join(self._data)), without joining; -1 when empty
        self._type = ""
        self._event_retry: int | None = None
        # The spec's last event ID buffer survives dispatch. "Dirty": a field was seen since the
        # last blank line, which the fast path in feed() must not skip over.
        self._id = self.last_event_id
        self._dirty = False

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Take the next piece of the stream; return the events it completes."""
        if self._boundary:
            chunk = self._cross_boundary(chunk)
        if _CR in chunk:
            # Normalising to LF keeps one code path. A final CR already ends its line; the LF
            # that may start the next chunk belongs to it.
            if chunk[-1] == _CR:
                self._boundary = _AFTER_CR
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if _LF not in chunk:
            if chunk:
                self._tail.append(chunk)
                self._tail_size += len(chunk)
                if self._tail_size > self._limit:
                    self._check_tail()
            return []
        if self._dirty:
            return self._general(chunk)
        if not self._tail and chunk.find(b"\n") == len(chunk) - 2 and chunk[-1] == _LF:
            # Exactly one line and a blank line, as a server flushing each token sends them.
            if chunk[:6] == _DATA_FIELD:
                value = chunk[6:-2].decode("utf-8", "replace")
                if len(value) > self._limit:
                    raise EventTooLargeError(len(value), self.max_event_size or 0)
                return [ServerSentEvent("message", value, self.last_event_id, None)]
            return self._general(chunk)

        # Fast path, for nearly every completion stream: a run of events that are each one
        # "data: " line and a blank line, the last one possibly unfinished. One split gives the
        # values. It applies only if no value holds a line end (so every line end is in a
        # separator and there is no other kind of line), and the chunk ends inside a "data: "
        # line or right after a blank line.
        values = chunk.split(b"\n\ndata: ")
        last = values[-1]
        rest = None
        if _LF not in last:
            rest = values.pop()  # the unfinished "data: " line
        elif last[-2:] == b"\n\n":
            values[-1] = last[:-2]
        else:
            return self._general(chunk)
        for piece in values:
            if _LF in piece:
                return self._general(chunk)
        tail = self._tail
        if len(tail) == 2 and tail[0] is _DATA_FIELD:
            values[0] = tail[1] + values[0]  # the line this path left pending: known prefix
        else:
            first = b"".join(tail) + values[0] if tail else values[0]
            if first[:6] != _DATA_FIELD:
                return self._general(chunk)
            values[0] = first[6:]
        last_event_id = self.last_event_id
        try:
            events = [ServerSentEvent("message", v.decode(), last_event_id, None) for v in values]
        except UnicodeDecodeError:
            events = [
                ServerSentEvent("message", v.decode("utf-8", "replace"), last_event_id, None)
                for v in values
            ]
        if self._tail_size + len(chunk) > self._limit:  # bytes bound characters: look closer
            for event in events:
                if len(event.data) > self._limit:
                    raise EventTooLargeError(len(event.data), self.max_event_size or 0)
        if rest is None:
            self._tail = []
            self._tail_size = 0
        else:
            self._tail = [_DATA_FIELD, rest]
            self._tail_size = 6 + len(rest)
            if self._tail_size > self._limit:
                self._check_tail()
        return events

    def close(self) -> list[ServerSentEvent]:
        """End the stream, discarding the unfinished line and event (none is dispatched at EOF).

        The decoder may then take a new stream (a reconnection), keeping ``last_event_id`` and
        ``retry``.
        """
        self._start_stream()
        return []

    def _cross_boundary(self, chunk: bytes) -> bytes:
        """Strip the stream's BOM, or skip the LF of a CRLF cut after its CR."""
        if self._boundary == _STREAM_START:
            if self._pending:
                chunk = self._pending + chunk
                self._pending = b""
            if len(chunk) < 3 and _BOM.startswith(chunk):
                self._pending = chunk  # nothing yet, or (part of) a BOM: wait for more
                return b""
            if chunk[:3] == _BOM:
                chunk = chunk[3:]
        elif not chunk:
            return chunk
        elif chunk[0] == _LF:
            chunk = chunk[1:]
        self._boundary = _NOTHING
        return chunk

    def _general(self, chunk: bytes) -> list[ServerSentEvent]:
        """Any chunk with a line end (LF only by now): process its complete lines, keep the rest."""
        end = chunk.rfind(b"\n")
        if self._tail:
            self._tail.append(chunk)
            end += self._tail_size
            chunk = b"".join(self._tail)
        self._tail = []
        self._tail_size = 0
        if end + 1 < len(chunk):
            rest = chunk[end + 1 :]
            self._tail.append(rest)
            self._tail_size = len(rest)
            if self._tail_size > self._limit:
                self._check_tail()

        # The text is a run of complete lines. Split on "\n\n", it gives blocks whose lines are
        # block.split("\n"), each block but the last followed by one blank line (a dispatch).
        text = chunk[:end].decode("utf-8", "replace")
        events: list[ServerSentEvent] = []
        blocks = text.split("\n\n")
        last: str | None = blocks.pop()
        if last and last[-1] == "\n":
            # The blank line that ends this block is the last complete line: it is complete too.
            blocks.append(last[:-1])
            last = None
        for block in blocks:
            if not self._dirty and block[:5] == "data:" and "\n" not in block:
                # One data line and nothing pending ("data:" without the space goes here).
                value = block[6:] if block[5:6] == " " else block[5:]
                if len(value) > self._limit:
                    raise EventTooLargeError(len(value), self.max_event_size or 0)
                events.append(ServerSentEvent("message", value, self.last_event_id, None))
            else:
                lines = block.split("\n")
                lines.append("")
                self._lines(lines, events)
        if last is not None:
            # The lines of an event still open (or one blank line: a dispatch of what came before).
            self._lines(last.split("\n"), events)
        return events

    def _lines(self, lines: list[str], events: list[ServerSentEvent]) -> None:
        """Process complete lines by the spec's rules, appending the events they dispatch."""
        for line in lines:
            if not line:
                self.last_event_id = self._id
                if self._data:
                    data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
                    kind = self._type or "message"
                    events.append(ServerSentEvent(kind, data, self._id, self._event_retry))
                self._clear_event()
                continue
            colon = line.find(":")
            if colon == 0:
                continue  # a comment
            if colon < 0:
                name, value = line, ""
            elif line[colon + 1 : colon + 2] == " ":
                name, value = line[:colon], line[colon + 2 :]
            else:
                name, value = line[:colon], line[colon + 1 :]
            if name == "data":
                self._data.append(value)
                self._data_size += len(value) + 1
                self._dirty = True
                if self._data_size > self._limit:
                    size = self._data_size
                    self._clear_event()
                    raise EventTooLargeError(size, self.max_event_size or 0)
            elif name == "event":
                self._type = value
                self._dirty = True
            elif name == "id":
                if "\0" not in value:
                    self._id = value
                    self._dirty = True
            elif name == "retry":
                if value.isascii() and value.isdigit():
                    try:
                        retry = int(value)
                    except ValueError:  # more digits than int() takes: no meaningful delay anyway
                        continue
                    self.retry = self._event_retry = retry
                    self._dirty = True
            # Any other field name is ignored, as the spec says.

    def _check_tail(self) -> None:
        """The unfinished line passed the limit in bytes: count characters, each piece once."""
        tail, counted = self._tail, self._counted
        start, chars = (0, 0) if counted is None or counted[0] is not tail else counted[1:]
        for piece in tail[start:]:
            chars += len(piece.translate(None, _CONTINUATION_BYTES))
        self._counted = (tail, len(tail), chars)
        if chars > self._limit:
            self._tail = []
            self._tail_size = 0
            raise EventTooLargeError(chars, self.max_event_size or 0)
