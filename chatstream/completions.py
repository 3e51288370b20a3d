"""Assemble a streamed Chat Completion from its ``chat.completion.chunk`` payloads.

Feed each SSE event's data to :meth:`ChatCompletionAccumulator.feed`; the accumulator keeps one
:class:`Choice` per choice ``index`` and loses nothing it holds when a payload raises. Rules,
with the providers whose streams need them:

- ``role``, and a tool call's ``id``, ``type`` and ``name``, are set once: values repeated on
  every delta (Ollama, OpenRouter) are not duplicated. ``content``, ``refusal``, ``reasoning`` and
  ``arguments`` concatenate.
- Tolerated silently: empty ``choices`` (Azure's first chunk, the usage chunk), a choice without
  ``delta`` (Azure annotations), ``null``/absent/``""`` content, unknown fields, fields of an
  unexpected type (dropped like unknown ones), empty or blank payloads (keep-alives).

Beyond assembling the chunks:

- ``feed(data)`` returns the text it appended to choice 0's content (``""`` if none): a streaming
  caller forwards exactly that and never re-reads the whole text; ``reasoning_added`` is then the
  text the same call appended to choice 0's reasoning (``""`` if none). ``"[DONE]"`` (surrounding
  whitespace allowed) sets ``done``; anything fed after it is ignored.
- A payload with a truthy top-level ``error`` (object or string) raises ``UpstreamStreamError``
  after the rest of the payload is recorded: OpenRouter's ``finish_reason: "error"`` is kept, and
  any text in that chunk is in ``content`` though not returned. ``feed(data, event="error")``
  (pass the SSE event type) raises it too. Its ``code`` is the error's ``code`` (else its
  ``type``) when that is an identifier; its ``detail`` the provider's ``message`` (or the plain
  text of an error event). Invalid JSON, or JSON that is not an object, raises
  :class:`MalformedChunkError`. Neither exception's message quotes the payload: it is stored
  and logged as the reason a reply ended (see chatstream.exceptions).
- ``Choice.reasoning`` collects ``delta.reasoning_content`` (DeepSeek, older vLLM) and
  ``delta.reasoning`` (newer vLLM, Ollama, OpenRouter), apart from content; a delta carrying both
  with the same text counts it once.
- ``delta.content`` as a list of typed blocks (Mistral): ``text`` blocks go to content,
  ``thinking`` blocks to reasoning.
- Tool calls without ``index`` (Gemini): a fragment with a new ``id`` starts a call, one without
  an id continues the last call. A fragment whose ``id`` differs from the call already at its
  ``index`` (proxies that number every parallel call 0) starts a call at the next free index. The
  legacy ``delta.function_call`` becomes a tool call. Object ``arguments`` are serialised to JSON.
- ``usage`` is the latest non-null top-level ``usage``, or Groq's ``x_groq.usage``. ``id``,
  ``model`` and ``system_fingerprint`` keep the first non-empty value, read until the first chunk
  with choices (or all three are known). ``content`` and ``finish_reason`` on the accumulator are
  choice 0's (``""`` and ``None`` before it appears).
- ``size`` is what the reply holds, in characters, whatever the provider sends: the text of every
  choice (each ``Choice.size``: content, refusal, reasoning, the tool calls' ids, names and
  arguments), plus :data:`ENTRY_SIZE` for each tool call and for each choice but the first, so
  that empty choices and empty tool-call fragments, which carry no text, still count. It is kept
  as the chunks arrive (reading it costs nothing), as is ``largest``, the greatest
  ``Choice.size``. A caller bounds a reply's memory (and what it stores of the tool calls) with
  them. One payload may carry a great many entries, though: with ``limit`` (a size), once
  ``size`` passes it a payload's further new choices and tool calls are not taken in, so that
  the caller, which ends the reply when it sees ``size > limit``, never holds more than one
  entry beyond it.
- What is not counted is cut: ``id``, ``model`` and ``system_fingerprint`` keep at most
  :data:`META_LENGTH` characters; a choice's ``role`` and ``finish_reason`` and a tool call's
  ``type`` at most :data:`SHORT_LENGTH`.

Texts are lists of fragments joined when read and cached until the next fragment: accumulation is
linear, and reading ``content`` costs O(length) only when it changed since the last read. A list
is also joined once it holds more than 64 fragments and more than one per 16 characters of its
first (see :func:`compact`): a stream of one-character fragments (~50 bytes of object each) is
held at a few bytes a character, and each character is still copied a bounded number of times.
JSON is decoded by msgspec into small typed structs that skip the fields never read; other shapes
go through a lenient generic decode (both in :mod:`chatstream._chunks`; bench/README-parser.md
has the measurements behind the choice).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from chatstream._chunks import (
    ChunkFields,
    ChunkWithMeta,
    chunk_error,
    decode_chunk,
    decode_chunk_with_meta,
    event_error,
    lenient_chunk,
)

__all__ = ["ENTRY_SIZE", "META_LENGTH", "SHORT_LENGTH", "ChatCompletionAccumulator", "Choice",
           "ToolCall", "compact"]

# bench/bench_parser.py times the typed decoder by this name.
_decode_chunk = decode_chunk

# What a tool call, and a choice beyond the first, counts towards ``size``, in characters. Held, a
# choice takes ~500 bytes and a tool call ~300 (objects, lists, its role or type); stored, a tool
# call with empty fields is ~50 bytes of JSON. At 64 "characters" each, an upstream that sends
# nothing but new indexes is held to ~8 bytes per character of the cap.
ENTRY_SIZE = 64
META_LENGTH = 256  # characters kept of the reply's id, model and system_fingerprint
SHORT_LENGTH = 64  # characters kept of a choice's role and finish_reason, a tool call's type

_FRAGMENTS = 64  # fragments a text may hold before compact() considers joining them


def _joined(parts: list[str]) -> str:
    """Join fragments once and keep the result as the only fragment (so repeated reads are free)."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""


def compact(parts: list[str]) -> None:
    """Join a text's fragments into one when they outnumber ``_FRAGMENTS`` and one per 16
    characters of the first (the text as last joined): the list then costs at most ~4 bytes a
    character on top of the text, and, the text growing by a sixteenth between two joins, each
    character is copied a bounded number of times."""
    if len(parts) > _FRAGMENTS and len(parts) << 4 > len(parts[0]):
        parts[:] = ["".join(parts)]


class ToolCall:
    """One tool call of a choice; ``arguments`` is the concatenated (not parsed) argument string."""

    __slots__ = ("_arguments", "id", "index", "name", "type")

    def __init__(
        self, index: int, id: str = "", type: str = "", name: str = "", arguments: str = ""
    ) -> None:
        self.index = index
        self.id = id
        self.type = type
        self.name = name
        self._arguments = [arguments] if arguments else []

    @property
    def arguments(self) -> str:
        return _joined(self._arguments)

    def as_dict(self) -> dict[str, Any]:
        """The call in the Chat Completions message shape (for storing, or for the next request)."""
        return {
            "id": self.id,
            "type": self.type or "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def _key(self) -> tuple[int, str, str, str, str]:
        return (self.index, self.id, self.type, self.name, self.arguments)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ToolCall):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable while the stream runs

    def __repr__(self) -> str:
        return (
            f"ToolCall(index={self.index!r}, id={self.id!r}, type={self.type!r}, "
            f"name={self.name!r}, arguments={self.arguments!r})"
        )


class Choice:
    """What one choice ``index`` has accumulated so far."""

    __slots__ = (
        "_calls",
        "_content",
        "_join_at",
        "_last_call",
        "_next_call",
        "_reasoning",
        "_refusal",
        "finish_reason",
        "index",
        "role",
        "size",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.role: str | None = None
        self.finish_reason: str | None = None
        self.size = 0  # characters of text held (content, refusal, reasoning, tool calls)
        self._content: list[str] = []
        self._join_at = _FRAGMENTS  # the content's fragments that make the feed join them
        self._refusal: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, ToolCall] = {}
        self._last_call: ToolCall | None = None
        self._next_call = 0  # one past the highest tool-call index held

    @property
    def content(self) -> str:
        return _joined(self._content)

    @property
    def refusal(self) -> str:
        return _joined(self._refusal)

    @property
    def reasoning(self) -> str:
        return _joined(self._reasoning)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [self._calls[i] for i in sorted(self._calls)]

    def __repr__(self) -> str:
        return (
            f"Choice(index={self.index!r}, role={self.role!r}, content={self.content!r}, "
            f"refusal={self.refusal!r}, reasoning={self.reasoning!r}, "
            f"finish_reason={self.finish_reason!r}, tool_calls={self.tool_calls!r})"
        )

    def _apply_delta(self, delta: dict[str, Any], thoughts: list[str] | None = None,
                     room: int | None = None) -> str:
        """Record one delta; return the text it added to content (its reasoning is also added
        to ``thoughts``, if given). ``room``: how much the reply may still grow (see the
        accumulator's ``limit``), which bounds the tool calls one delta may start."""
        text = ""
        content = delta.get("content")
        if content:
            if content.__class__ is str:
                self._add(self._content, content)
                text = content
            elif content.__class__ is list:
                text = self._apply_blocks(content, thoughts)
        if content is not None and len(delta) == 1:
            return text  # the common chunk: nothing else to look at
        role = delta.get("role")
        if role and self.role is None and role.__class__ is str:
            self.role = role[:SHORT_LENGTH]
        refusal = delta.get("refusal")
        if refusal and refusal.__class__ is str:
            self._add(self._refusal, refusal)
        old = delta.get("reasoning_content")
        if old and old.__class__ is str:
            self._add(self._reasoning, old, thoughts)
        new = delta.get("reasoning")
        if new and new.__class__ is str and new != old:
            self._add(self._reasoning, new, thoughts)
        calls = delta.get("tool_calls")
        if calls and calls.__class__ is list:
            most = None if room is None else len(self._calls) + max(room // ENTRY_SIZE + 1, 0)
            for fragment in calls:
                if most is not None and len(self._calls) >= most:
                    break  # past the limit: the rest of this delta's calls are not taken in
                if fragment.__class__ is dict:
                    self._apply_call(fragment)
        legacy = delta.get("function_call")
        if legacy and legacy.__class__ is dict:
            self._apply_call({"type": "function", "function": legacy})
        return text

    def _add(self, parts: list[str], text: str, thoughts: list[str] | None = None) -> None:
        parts.append(text)
        self.size += len(text)
        compact(parts)
        if thoughts is not None:
            thoughts.append(text)

    def _apply_blocks(self, blocks: list[Any], thoughts: list[str] | None) -> str:
        """Mistral's typed content blocks: text to content, thinking to reasoning."""
        added: list[str] = []
        for block in blocks:
            if block.__class__ is str:
                added.append(block)
            elif block.__class__ is dict:
                kind = block.get("type")
                if kind == "text":
                    text = block.get("text")
                    if text and text.__class__ is str:
                        added.append(text)
                elif kind == "thinking":
                    thinking = block.get("thinking")
                    if thinking.__class__ is str:
                        thinking = [{"text": thinking}]
                    if thinking.__class__ is list:
                        for part in thinking:
                            text = part.get("text") if part.__class__ is dict else part
                            if text and text.__class__ is str:
                                self._add(self._reasoning, text, thoughts)
        joined = "".join(added)
        if joined:
            self._add(self._content, joined)
        return joined

    def _apply_call(self, fragment: dict[str, Any]) -> None:
        """One tool-call fragment: find or start its call; set id/type/name once, add arguments."""
        call_id = fragment.get("id")
        if not (call_id and type(call_id) is str):
            call_id = ""
        index = fragment.get("index")
        calls = self._calls
        call: ToolCall | None
        if type(index) is int:
            call = calls.get(index)
            if call is not None and call_id and call.id and call_id != call.id:
                call = None  # a second call given the same index (some proxies): keep them apart
                index = self._next_call
        else:
            # No index (Gemini): a new id starts a call, anything else continues the last one.
            call = self._last_call
            if call is not None and call_id and call_id != call.id:
                call = None
            index = self._next_call
        if call is None:
            call = calls[index] = ToolCall(index)  # the accumulator's size counts it
            if index >= self._next_call:
                self._next_call = index + 1
        self._last_call = call
        if call_id and not call.id:
            call.id = call_id
            self.size += len(call_id)
        kind = fragment.get("type")
        if kind and not call.type and type(kind) is str:
            call.type = kind[:SHORT_LENGTH]
        function = fragment.get("function")
        if type(function) is dict:
            name = function.get("name")
            if name and not call.name and type(name) is str:
                call.name = name
                self.size += len(name)
            arguments = function.get("arguments")
            if arguments:
                if type(arguments) is not str:
                    arguments = msgspec.json.encode(arguments).decode()
                self._add(call._arguments, arguments)


class ChatCompletionAccumulator:
    """Assemble one streamed reply from its SSE data payloads; see the module docstring."""

    def __init__(self, *, limit: int | None = None) -> None:
        self.choices: dict[int, Choice] = {}
        self.limit = limit  # see the module docstring
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.id = ""
        self.model = ""
        self.system_fingerprint = ""
        self.reasoning_added = ""  # what the last feed() appended to choice 0's reasoning
        # The size of all but choice 0 (whose is added when read: the common delta, to choice
        # 0, then changes one counter only), and the largest Choice.size among them.
        self._rest = 0
        self._largest_rest = 0
        self._meta_missing = True  # still reading id / model / system_fingerprint
        self._decode: Callable[[str], ChunkFields] = decode_chunk_with_meta

    @property
    def content(self) -> str:
        """Choice 0's text so far, ``""`` before it appears."""
        choice = self.choices.get(0)
        return choice.content if choice is not None else ""

    @property
    def finish_reason(self) -> str | None:
        """Choice 0's finish reason, ``None`` until it is sent."""
        choice = self.choices.get(0)
        return choice.finish_reason if choice is not None else None

    @property
    def size(self) -> int:
        """What the reply holds, in characters (see the module docstring); O(1)."""
        choice = self.choices.get(0)
        if choice is None:
            return self._rest
        return self._rest + choice.size + ENTRY_SIZE * len(choice._calls)

    @property
    def largest(self) -> int:
        """The greatest :attr:`Choice.size` of the reply's choices; O(1)."""
        choice = self.choices.get(0)
        return max(self._largest_rest, choice.size if choice is not None else 0)

    def feed(self, data: str, *, event: str = "message") -> str:
        """Record one SSE data payload; return the text it appended to choice 0's content."""
        if self.reasoning_added:
            self.reasoning_added = ""
        if self.done:
            return ""
        if event == "error":
            raise event_error(data)
        try:
            chunk = self._decode(data)
        except msgspec.DecodeError:  # also ValidationError: "[DONE]", blanks, odd shapes, bad JSON
            stripped = data.strip()
            if stripped == "[DONE]":
                self.done = True
                return ""
            if not stripped:
                return ""  # an empty keep-alive carries nothing
            chunk = lenient_chunk(data)

        text = ""
        choices = chunk.choices
        if choices:
            known = self.choices
            position = 0
            for entry in choices:
                index = entry.index
                if index is None:
                    index = position
                position += 1
                choice = known.get(index)
                if choice is None:
                    if known:
                        if self.limit is not None and self.size > self.limit:
                            break  # the rest of this payload is not taken in (see limit)
                        self._rest += ENTRY_SIZE  # an empty choice is held all the same
                    choice = known[index] = Choice(index)
                delta = entry.delta
                if not delta:
                    pass
                elif len(delta) == 1 and (content := delta.get("content")).__class__ is str:
                    # The common delta, {"content": "..."}, without a method call.
                    if content:
                        parts = choice._content
                        parts.append(content)
                        choice.size += len(content)
                        if len(parts) > choice._join_at:  # as compact() does, without a call
                            parts[:] = [joined := "".join(parts)]
                            choice._join_at = max(_FRAGMENTS, len(joined) >> 4)
                        if index == 0:
                            text += content
                        else:
                            self._grew(choice, len(content))
                elif index == 0:
                    thoughts: list[str] = []
                    content = choice._apply_delta(delta, thoughts, self._room(delta))
                    if content:
                        text += content
                    if thoughts:
                        self.reasoning_added += "".join(thoughts)
                else:
                    held, calls = choice.size, len(choice._calls)
                    choice._apply_delta(delta, None, self._room(delta))
                    if choice.size != held or len(choice._calls) != calls:
                        self._grew(choice, choice.size - held
                                   + ENTRY_SIZE * (len(choice._calls) - calls))
                if entry.finish_reason:
                    choice.finish_reason = entry.finish_reason[:SHORT_LENGTH]
        if self._meta_missing and isinstance(chunk, ChunkWithMeta):
            self._apply_meta(chunk)
        if chunk.x_groq and chunk.x_groq.get("usage"):
            self.usage = chunk.x_groq["usage"]
        if chunk.usage:
            self.usage = chunk.usage
        if chunk.error:
            raise chunk_error(chunk.error)
        return text

    def _room(self, delta: dict[str, Any]) -> int | None:
        """How much the reply may still grow before ``limit``, for a delta with tool calls."""
        if self.limit is None or not delta.get("tool_calls"):
            return None
        return self.limit - self.size

    def _grew(self, choice: Choice, added: int) -> None:
        """A choice other than 0 grew by ``added``."""
        self._rest += added
        if choice.size > self._largest_rest:
            self._largest_rest = choice.size

    def _apply_meta(self, chunk: ChunkWithMeta) -> None:
        self.id = self.id or (chunk.id or "")[:META_LENGTH]
        self.model = self.model or (chunk.model or "")[:META_LENGTH]
        self.system_fingerprint = (self.system_fingerprint
                                   or (chunk.system_fingerprint or "")[:META_LENGTH])
        # Read until all are known, or a chunk with choices was seen: Azure's first chunk has empty
        # values and no choices, and many providers never send a fingerprint.
        if self.id and self.model and (self.system_fingerprint or self.choices):
            self._meta_missing = False
            self._decode = decode_chunk
