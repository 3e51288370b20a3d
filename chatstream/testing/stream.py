"""Turn a :class:`Script` and a request body into what goes on the wire: Chat Completions chunks
framed as server-sent events, with pauses and faults, or one ``chat.completion`` body.

Pure Python: :func:`actions` yields :class:`Send` / :class:`Pause` / :data:`DROP` / :data:`STALL`
and the server performs them. Chunk shapes follow real OpenAI captures: a role chunk with
``content: ""``, content chunks, a finish chunk with an empty delta, then the usage chunk with
``choices: []``, then ``[DONE]``.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from .scripts import Script, fit, last_user_text, prompt_tokens, tokenize, tool_results

FINGERPRINT = "fp_simulator"
SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"
FLOOD_WRITE = 1024 * 1024  # bytes of one write of a flood, before compression
FLOOD_CYCLE = 8 * 1024  # about the bytes of chunks a flood repeats


@dataclass(frozen=True, slots=True)
class Send:
    """Write ``data`` (one SSE event or comment); ``content`` counts it as a content chunk.
    ``held``: more of a burst follows, so a gzip body holds this back and sends the burst as one
    compressed write (as a real gzip bomb arrives)."""

    data: bytes
    content: bool = False
    held: bool = False


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds`` after the previous pause's deadline (so pacing never drifts)."""

    seconds: float


DROP = object()
"""Close the connection at once, mid body."""
STALL = object()
"""Send nothing more; hold the connection until the client closes it."""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class Reply:
    """Everything decided for one request: ids, pieces per choice, finish reasons, token counts."""

    script: Script
    model: str
    include_usage: bool
    prompt_tokens: int
    choices: list[list[str]]
    finish_reasons: list[str | None]
    tool_calls: list[list[tuple[str, str, list[str]]]]
    reasoning: list[str] = field(default_factory=list)  # each choice's, before its text
    id: str = field(default_factory=lambda: "chatcmpl-" + secrets.token_hex(15))
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def reasoning_tokens(self) -> int:
        return len(self.reasoning) * len(self.choices)

    @property
    def completion_tokens(self) -> int:
        tools = sum(len(args) for calls in self.tool_calls for _, _, args in calls)
        return sum(len(pieces) for pieces in self.choices) + tools + self.reasoning_tokens

    def usage(self) -> dict[str, Any]:
        completion = self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {
                "cached_tokens": self.script.cached_tokens,
                "audio_tokens": 0,
            },
            "completion_tokens_details": {
                "reasoning_tokens": self.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }


def plan(script: Script, body: dict[str, Any], model: str) -> Reply:
    """Decide the reply to ``body``: text per choice, ``max_tokens`` truncation, usage."""
    messages = body.get("messages")
    text = last_user_text(messages) if script.echo else script.text
    results = tool_results(messages) if script.answer_tools else None
    if results is not None:  # it read what its tools said: it answers in words
        script = dataclasses.replace(script, tool_calls=(), finish_reason="stop")
        text = "Results: " + " | ".join(results)
    pieces = tokenize(text)
    if script.tokens is not None:
        pieces = fit(pieces, script.tokens)
    requested_n = body.get("n")
    n = max(script.n, requested_n if isinstance(requested_n, int) else 1)
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if script.endless and body.get("stream") is True:
        limit = None  # a stream that never ends ignores max_tokens too
    choices, finish_reasons, tool_calls = [], [], []
    for index in range(n):
        choice = pieces if index == 0 else tokenize(f"Alternative {index}: ") + pieces
        finish = script.finish_reason
        if isinstance(limit, int) and limit >= 0 and len(choice) > limit:
            choice, finish = choice[:limit], "length" if finish is not None else None
        choices.append(choice)
        finish_reasons.append(finish)
        calls = [
            (_call_id(script), name, tokenize(args)) for name, args in script.tool_calls
        ]
        tool_calls.append(calls)
    options = body.get("stream_options")
    asked = isinstance(options, dict) and options.get("include_usage") is True
    reply = Reply(
        script=script,
        model=model if script.response_model is None else script.response_model,
        include_usage=asked if script.usage is None else script.usage,
        prompt_tokens=prompt_tokens(messages),
        choices=choices,
        finish_reasons=finish_reasons,
        tool_calls=tool_calls,
        reasoning=tokenize(script.reasoning),
    )
    if script.completion_id is not None:
        reply.id = script.completion_id
    return reply


def _call_id(script: Script) -> str:
    if script.call_ids == "empty":
        return ""
    return "call_0" if script.call_ids == "repeated" else "call_" + secrets.token_hex(12)


def completion_body(reply: Reply) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    choices = []
    for index, pieces in enumerate(reply.choices):
        calls = reply.tool_calls[index]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(pieces) if pieces or not calls else None,
            "refusal": None,
            "annotations": [],
        }
        if reply.reasoning:
            message["reasoning_content"] = "".join(reply.reasoning)
        if calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": "".join(args)},
                }
                for call_id, name, args in calls
            ]
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": None,
                "finish_reason": reply.finish_reasons[index],
            }
        )
    return {
        "id": reply.id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
        "usage": reply.usage(),
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }


def error_body(
    status: int, *, message: str = "", code: str | None = None, type: str = ""
) -> dict[str, Any]:
    """An OpenAI-shaped error object for ``status``."""
    defaults = {
        400: ("Invalid request.", "invalid_request_error", None),
        401: ("Incorrect API key provided.", "invalid_request_error", "invalid_api_key"),
        403: ("You are not allowed to sample from this model.", "invalid_request_error", None),
        404: (
            "The model does not exist or you do not have access to it.",
            "invalid_request_error",
            "model_not_found",
        ),
        429: (
            "Rate limit reached for requests. Please try again in 1s.",
            "requests",
            "rate_limit_exceeded",
        ),
        500: (SERVER_ERROR, "server_error", None),
        503: ("The engine is currently overloaded, please try again later.", "server_error", None),
    }
    fallback = (
        f"Simulated HTTP {status} error.",
        "server_error" if status >= 500 else "invalid_request_error",
        None,
    )
    default_message, default_type, default_code = defaults.get(status, fallback)
    return {
        "error": {
            "message": message or default_message,
            "type": type or default_type,
            "param": None,
            "code": code if code is not None else default_code,
        }
    }


class _Framer:
    """Builds the SSE bytes of one reply's chunks."""

    def __init__(self, reply: Reply) -> None:
        script = reply.script
        self.reply = reply
        self.end = script.line_ending * 2
        self.prefix = "data: " if script.data_space else "data:"
        self.envelope = {
            "id": reply.id,
            "object": "chat.completion.chunk",
            "created": reply.created,
            "model": reply.model,
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
        }
        self.usage_null = reply.include_usage
        # Content chunks are the hot path (1,000 streams in the benchmark): pre-render the JSON
        # around the piece once per choice and splice each piece's JSON string in.
        self._templates: dict[int, tuple[str, str]] = {}

    def event(self, payload: str) -> bytes:
        return (self.prefix + payload + self.end).encode()

    def chunk(
        self,
        index: int | None,
        delta: dict[str, Any] | None = None,
        finish: str | None = None,
        usage: dict[str, Any] | None = None,
    ) -> bytes:
        value: dict[str, Any] = dict(self.envelope)
        if index is None:
            value["choices"] = []
        else:
            value["choices"] = [
                {"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
            ]
        if usage is not None or self.usage_null:
            value["usage"] = usage
        return self.event(_dumps(value))

    def content(self, index: int, piece: str) -> bytes:
        template = self._templates.get(index)
        if template is None:
            marker = "\x00piece\x00"
            delta: dict[str, Any] = {"content": marker}
            if self.reply.script.role_every_delta:
                delta = {"role": "assistant", "content": marker}
            rendered = self.chunk(index, delta).decode()
            head, _, tail = rendered.partition(_dumps(marker))
            template = self._templates[index] = (head, tail)
        return (template[0] + _dumps(piece) + template[1]).encode()


def actions(reply: Reply) -> Iterator[Send | Pause | object]:
    """The streamed reply as a sequence of writes, pauses and faults."""
    script = reply.script
    framer = _Framer(reply)
    yield Pause(script.first_token_delay)
    if (yield from _faults(framer, script, 0)):
        return
    sent = 0
    for item in _timeline(framer, reply):
        yield item
        if type(item) is Send and item.content:
            sent += 1
            if (yield from _faults(framer, script, sent)):
                return


def _faults(framer: _Framer, script: Script, sent: int) -> Generator[object, None, bool]:
    """Inject what the script's faults say after ``sent`` content chunks; True ends the body."""
    if sent == script.drop_after:
        yield DROP
        return True
    if sent == script.stall_after:
        yield STALL
        return True
    if sent == script.error_after:
        message = script.error_message or SERVER_ERROR
        error = {"message": message, "type": "server_error", "param": None, "code": None}
        yield Send(framer.event(_dumps({"error": error})))
        return True
    if sent == script.malformed_after:
        yield Send(framer.event("{not json"))
    if sent == script.flood_after:
        yield from _flood(framer, script)
    return False


def _flood(framer: _Framer, script: Script) -> Iterator[Send]:
    """About ``flood_bytes`` of chunks, in 1 MiB writes: content chunks repeating the reply's first
    pieces, or chunks naming a new index each (see ``Script.flood_of``)."""
    if script.flood_of != "content":
        yield from _index_flood(framer, script)
        return
    # A cycle within deflate's 32 KB window compresses 100-200:1, as a gzip bomb does.
    cycle = b""
    for piece in framer.reply.choices[0] or [""]:
        cycle += framer.content(0, piece)
        if len(cycle) > FLOOD_CYCLE:
            break
    left = max(1, script.flood_bytes // len(cycle))  # cycles still to send
    per_write = max(1, FLOOD_WRITE // len(cycle))
    block = cycle * per_write
    while left > 0:
        yield Send(block if left >= per_write else cycle * left, held=left > per_write)
        left -= per_write


def _index_flood(framer: _Framer, script: Script) -> Iterator[Send]:
    """Chunks that carry no text but a new choice, or a new tool call of choice 0, each."""
    reply = framer.reply
    if script.flood_of == "choices":
        index, shape = len(reply.choices), '{"choices":[{"index":%d}]}'
    else:
        index = len(reply.tool_calls[0])
        shape = '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":%d}]}}]}'
    left = script.flood_bytes
    while left > 0:
        events: list[bytes] = []
        size = 0
        while size < min(left, FLOOD_WRITE):
            event = framer.event(shape % index)
            events.append(event)
            size += len(event)
            index += 1
        left -= size
        yield Send(b"".join(events), held=left > 0)


def _timeline(framer: _Framer, reply: Reply) -> Iterator[Send | Pause]:
    """The whole stream as scripted without faults: choices interleaved, usage, ``[DONE]``."""
    script = reply.script
    interval = script.chunk_tokens / script.tokens_per_second if script.tokens_per_second else 0.0
    streams = [_choice_chunks(framer, reply, index) for index in range(len(reply.choices))]
    first = True
    while streams:
        if not first:
            yield Pause(interval)
        first = False
        for stream in list(streams):
            for item in next(stream):
                if item is None:
                    streams.remove(stream)
                    break
                yield item
    if reply.include_usage and script.usage_placement == "separate":
        yield Send(framer.chunk(None, usage=reply.usage()))
    if script.send_done:
        yield Send(framer.event("[DONE]"))


def _content_steps(pieces: list[str], step: int, *, endless: bool) -> Iterator[str]:
    """The text of each content chunk; ``endless``: the pieces again and again, for ever."""
    while True:
        for start in range(0, len(pieces), step):
            yield "".join(pieces[start : start + step])
        if not (endless and pieces):
            return
        yield "\n\n"


def _choice_chunks(framer: _Framer, reply: Reply, index: int) -> Iterator[list[Send | None]]:
    """One choice's chunks, one list per time step; ``None`` marks the choice's end."""
    script = reply.script
    pieces = reply.choices[index]
    calls = reply.tool_calls[index]
    role = {"role": "assistant"}
    step = script.chunk_tokens
    opening: list[Send | None] = []
    if not script.role_every_delta and (pieces or not calls):
        opening.append(
            Send(framer.chunk(index, {"role": "assistant", "content": "", "refusal": None}))
        )
    for start in range(0, len(reply.reasoning), step):
        thought = "".join(reply.reasoning[start : start + step])
        thinking: dict[str, Any] = {"content": None, "reasoning_content": thought}
        if script.role_every_delta:
            thinking = {**role, **thinking}
        yield [*opening, Send(framer.chunk(index, thinking), content=True)]
        opening = []
    for text in _content_steps(pieces, step, endless=script.endless):
        yield [*opening, Send(framer.content(index, text), content=True)]
        opening = []
    for call_index, (call_id, name, arguments) in enumerate(calls):
        first = {
            "index": call_index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        delta: dict[str, Any] = {"tool_calls": [first]}
        if not pieces and call_index == 0:
            delta = {"role": "assistant", "content": None, "tool_calls": [first], "refusal": None}
        elif script.role_every_delta:
            delta = {**role, **delta}
        yield [*opening, Send(framer.chunk(index, delta), content=True)]
        opening = []
        for start in range(0, len(arguments), step):
            fragment = {
                "index": call_index,
                "function": {"arguments": "".join(arguments[start : start + step])},
            }
            delta = {"tool_calls": [fragment]}
            if script.role_every_delta:
                delta = {**role, **delta}
            yield [Send(framer.chunk(index, delta), content=True)]
    ending: list[Send | None] = list(opening)
    finish = reply.finish_reasons[index]
    if finish is not None:
        last = index == len(reply.choices) - 1
        usage = (
            reply.usage()
            if reply.include_usage and script.usage_placement == "finish" and last
            else None
        )
        ending.append(Send(framer.chunk(index, {}, finish, usage)))
    ending.append(None)
    yield ending
