"""What the simulator says: the :class:`Script` of one reply, the built-in scenarios, and the
``name?key=value`` selector syntax that picks and tweaks a script from nothing but a model name.

Pure Python (no Django, no httpx, no I/O).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl

LineEnding = Literal["\n", "\r\n", "\r"]
UsagePlacement = Literal["separate", "finish"]
FloodOf = Literal["content", "choices", "tool_calls"]
CallIds = Literal["unique", "empty", "repeated"]

DEFAULT_TEXT = """\
Sure! Here's how streaming works with the Chat Completions API.

With `stream` set to true, the reply arrives as server-sent events, so you can show it as it comes:

1. Send the request with `stream=True`.
2. Read each `data:` line and parse its JSON.
3. Append `choices[0].delta.content` to the reply.
4. Stop at the `[DONE]` line.

In Python:

```python
for chunk in client.chat.completions.create(model=model, messages=history, stream=True):
    print(chunk.choices[0].delta.content or "", end="")
```

The connection can drop at any moment, so check `finish_reason` before trusting the reply."""

REASONING_TEXT = """\
The user wants to know how streaming works. I should explain server-sent events first.

Then the steps: send with stream=True, read each data: line, append delta.content, stop at [DONE].
A short Python example would help, and a word on checking finish_reason."""

# The full-width punctuation is deliberate: more multibyte characters to cut in half.
MULTIBYTE_TEXT = (
    "Café crème, naïve résumé ✓ 你好，世界！ Emoji: 🎉🚀 👩\u200d💻 — «quotes» and "  # noqa: RUF001
    "ünïcödé ✓✓ 你好 ✓ done 🎉"
)


class ScenarioError(ValueError):
    """A selector named an unknown option or gave an option a bad value."""


@dataclass(frozen=True)
class Script:
    """How the simulator answers one request. Every field is also a ``?key=value`` option."""

    text: str = DEFAULT_TEXT
    """The reply's text, streamed in ~4-character token pieces."""
    echo: bool = False
    """Reply with the last user message's text instead of ``text``."""
    reasoning: str = ""
    """What the model thinks before it replies: streamed first, as ``delta.reasoning_content``
    pieces at the same pace (DeepSeek's shape), and counted in ``usage`` as reasoning tokens."""
    tokens: int | None = None
    """Exact reply length in tokens: ``text`` is repeated or cut to fit."""
    tokens_per_second: float = 30.0
    """Pace of the content chunks; 0 = as fast as possible."""
    first_token_delay: float = 0.3
    """Seconds between the response headers and the first chunk."""
    chunk_tokens: int = 1
    """Token pieces per content chunk (Azure-style bursts when > 1)."""
    finish_reason: str | None = "stop"
    """The final chunk's ``finish_reason``; None = no final chunk at all."""
    usage: bool | None = None
    """Send the usage chunk: None = as ``stream_options.include_usage`` asks, True/False = force."""
    usage_placement: UsagePlacement = "separate"
    """``separate``: its own chunk with ``choices: []`` (OpenAI); ``finish``: on the last
    finish chunk (Groq-like)."""
    cached_tokens: int = 0
    """``usage.prompt_tokens_details.cached_tokens``."""
    status: int = 200
    """A non-200 status answers an OpenAI-style JSON error instead of a reply."""
    retry_after: int = 1
    """The ``retry-after`` header (seconds) sent with a 429 or 503."""
    drop_after: int | None = None
    """Close the connection abruptly after this many content chunks (mid chunked body)."""
    stall_after: int | None = None
    """Go silent after this many content chunks, holding the connection until the client closes."""
    malformed_after: int | None = None
    """Send ``data: {not json`` after this many content chunks, then carry on."""
    error_after: int | None = None
    """Send OpenAI's mid-stream ``{"error": ...}`` event after this many content chunks, then end
    the response without ``[DONE]``."""
    error_message: str | None = None
    """The ``message`` of the error object a non-200 ``status`` or ``error_after`` sends (None:
    OpenAI's usual words); a provider's message may echo the prompt or a header."""
    gzip: bool = False
    """Send the body gzip-encoded (``content-encoding: gzip``) whatever ``Accept-Encoding`` asked,
    as some proxies do; each write is flushed, so events still arrive one by one."""
    flood_after: int | None = None
    """After this many content chunks, send ``flood_bytes`` of content chunks at once (in 1 MiB
    writes), then carry on; with ``gzip``, in one compressed write: a gzip bomb (~8 KB per MiB)."""
    flood_bytes: int = 64 * 1024 * 1024
    """The flood's size before compression. Its chunks repeat the reply's first text pieces, or
    carry ``"content": ""`` when the text is empty (framing alone)."""
    flood_of: FloodOf = "content"
    """What the flood's chunks carry: ``content`` (as ``flood_bytes`` says); ``choices``: each a
    new, empty choice (``{"choices":[{"index":N}]}``); ``tool_calls``: each a new, empty tool
    call of choice 0 (``{"index":N}`` in its ``tool_calls``). No text, but a new index each."""
    endless: bool = False
    """Repeat the text for ever, ignoring ``max_tokens``: a stream that never finishes."""
    tool_calls: tuple[tuple[str, str], ...] = ()
    """``(name, arguments)`` pairs streamed as tool-call fragments after the text."""
    call_ids: CallIds = "unique"
    """The tool calls' ids: ``unique`` (``call_<24 hex>``, OpenAI's), ``empty`` or ``repeated``
    (``call_0`` for each, as some local servers send)."""
    answer_tools: bool = False
    """When the request ends with tool results, reply with text quoting them (``Results:
    <content> | <content>``), no tool calls and ``finish_reason: stop``: a model that reads what
    its tools said."""
    n: int = 1
    """Number of choices, interleaved (the request's ``n`` wins if larger)."""
    line_ending: LineEnding = "\n"
    """SSE line ending: ``\\n``, ``\\r\\n`` or ``\\r`` (selector aliases: lf, crlf, cr)."""
    data_space: bool = True
    """``data: {...}`` (True) or ``data:{...}`` (False, as some gateways send)."""
    keepalive_every: float | None = None
    """Seconds of silence after which a ``: keep-alive`` comment is sent (DeepSeek, OpenRouter)."""
    split_writes: bool = False
    """Write each event in several HTTP chunks, cutting multibyte UTF-8 characters in half."""
    send_done: bool = True
    """End a normal stream with ``data: [DONE]``."""
    role_every_delta: bool = False
    """Repeat ``"role": "assistant"`` on every delta (Ollama, OpenRouter)."""
    response_model: str | None = None
    """The ``model`` every chunk names; None: the request's model name (without its options)."""
    completion_id: str | None = None
    """The ``id`` every chunk carries; None: ``chatcmpl-<30 hex>``."""
    request_id: str | None = None
    """The ``x-request-id`` header (and the record's ``id``); None: ``req_<32 hex>``. Any
    latin-1 text but CR, LF and NUL, which would break the response's framing."""

    def __post_init__(self) -> None:
        calls = tuple(_tool_call(call) for call in self.tool_calls)
        object.__setattr__(self, "tool_calls", calls)
        if self.line_ending not in ("\n", "\r\n", "\r"):
            raise ScenarioError(
                f"line_ending must be '\\n', '\\r\\n' or '\\r', not {self.line_ending!r}"
            )
        if self.usage_placement not in ("separate", "finish"):
            raise ScenarioError(
                f"usage_placement must be 'separate' or 'finish', not {self.usage_placement!r}"
            )
        if self.tokens_per_second < 0 or self.first_token_delay < 0:
            raise ScenarioError("tokens_per_second and first_token_delay must be >= 0")
        if self.n < 1 or self.chunk_tokens < 1:
            raise ScenarioError(
                f"n and chunk_tokens must be >= 1, not {self.n!r}, {self.chunk_tokens!r}"
            )
        if not 100 <= self.status <= 599:
            raise ScenarioError(f"status must be an HTTP status code, not {self.status!r}")
        if self.keepalive_every is not None and self.keepalive_every <= 0:
            raise ScenarioError(f"keepalive_every must be > 0, not {self.keepalive_every!r}")
        if self.flood_bytes < 1:
            raise ScenarioError(f"flood_bytes must be >= 1, not {self.flood_bytes!r}")
        if self.call_ids not in ("unique", "empty", "repeated"):
            raise ScenarioError(
                f"call_ids must be 'unique', 'empty' or 'repeated', not {self.call_ids!r}"
            )
        if self.flood_of not in ("content", "choices", "tool_calls"):
            raise ScenarioError(
                f"flood_of must be 'content', 'choices' or 'tool_calls', not {self.flood_of!r}"
            )
        if self.request_id is not None and re.search("[\r\n\0]|[^\0-\xff]", self.request_id):
            raise ScenarioError(
                f"request_id must be latin-1 text without CR, LF or NUL, not {self.request_id!r}"
            )


def _tool_call(call: Any) -> tuple[str, str]:
    if isinstance(call, Mapping):
        call = (call.get("name"), call.get("arguments", ""))
    name, arguments = call
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return str(name), arguments


TWO_CALLS = (
    ("get_weather", '{"city": "Paris", "unit": "celsius"}'),
    ("get_time", '{"timezone": "Europe/Paris"}'),
)

SCENARIOS: Mapping[str, Script] = types.MappingProxyType(
    {
        "default": Script(),
        "fast": Script(tokens_per_second=0, first_token_delay=0),
        "slow": Script(tokens_per_second=5, first_token_delay=2.0),
        "http-401": Script(status=401),
        "http-429": Script(status=429),
        "http-500": Script(status=500),
        "drop": Script(drop_after=5),
        "stall": Script(stall_after=3),
        "malformed": Script(malformed_after=3),
        "error-mid": Script(error_after=3),
        "tools": Script(text="", tool_calls=TWO_CALLS, finish_reason="tool_calls"),
        "agent": Script(text="", tool_calls=TWO_CALLS, finish_reason="tool_calls",
                        answer_tools=True),
        "n2": Script(n=2),
        "crlf": Script(line_ending="\r\n"),
        "cr": Script(line_ending="\r"),
        "keepalive": Script(first_token_delay=1.0, keepalive_every=0.25),
        "multibyte": Script(text=MULTIBYTE_TEXT, split_writes=True),
        "no-done": Script(send_done=False, finish_reason=None, usage=False),
        "no-usage": Script(usage=False),
        "echo": Script(echo=True),
        "long": Script(tokens=2000),
        "gzip": Script(gzip=True),
        "gzip-bomb": Script(gzip=True, flood_after=3),
        "endless": Script(endless=True),
        "thinking": Script(reasoning=REASONING_TEXT),
    }
)
"""The built-in scenarios: each is the default script with a few fields changed."""

_HTTP_NAME = re.compile(r"http-([1-5][0-9][0-9])")
_ALIASES = {"tps": "tokens_per_second"}
_LINE_ENDINGS = {"lf": "\n", "crlf": "\r\n", "cr": "\r"}


def select(selector: str, scenarios: Mapping[str, Script]) -> tuple[str, Script]:
    """Resolve ``name`` or ``name?key=value&...`` to ``(scenario name, script)``.

    An unknown name means ``default``; ``http-NNN`` means the default script with that status.
    Raises :class:`ScenarioError` for an unknown option or a bad value.
    """
    name, _, query = selector.partition("?")
    name = name.strip()
    if name in scenarios:
        script = scenarios[name]
    elif match := _HTTP_NAME.fullmatch(name):
        script = dataclasses.replace(scenarios["default"], status=int(match[1]))
    else:
        name, script = "default", scenarios["default"]
    if not query:
        return name, script
    changes = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        field = _ALIASES.get(key, key.replace("-", "_"))
        convert = _converters().get(field)
        if convert is None:
            raise ScenarioError(
                f"Unknown simulator option {key!r} in {selector!r}; "
                f"options: {', '.join(sorted(_converters()))}, tps."
            )
        try:
            changes[field] = convert(value)
        except (ValueError, TypeError) as exc:
            raise ScenarioError(
                f"Bad value {value!r} for simulator option {key!r}: {exc}"
            ) from None
    return name, dataclasses.replace(script, **changes)


_CONVERTERS: dict[str, Callable[[str], Any]] = {}


def _converters() -> dict[str, Callable[[str], Any]]:
    if not _CONVERTERS:
        hints = typing.get_type_hints(Script)
        for field in dataclasses.fields(Script):
            _CONVERTERS[field.name] = _converter(hints[field.name])
        _CONVERTERS["line_ending"] = lambda value: _LINE_ENDINGS.get(value.lower(), value)
    return _CONVERTERS


def _converter(annotation: Any) -> Callable[[str], Any]:
    args = typing.get_args(annotation)
    if type(None) in args:
        inner = _converter(next(arg for arg in args if arg is not type(None)))
        return lambda value: None if value.lower() in ("", "none", "null") else inner(value)
    if annotation is bool:
        return _boolean
    if annotation in (int, float, str):
        return typing.cast("Callable[[str], Any]", annotation)
    if typing.get_origin(annotation) is tuple:
        return json.loads
    return str


def _boolean(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on", ""):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


_PIECE = re.compile(r"\n+|[ \t]?(?:\w+|[^\w\s]+)|[^\S\n]+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into word-ish pieces of about 4 characters, spaces leading, as tokenizers do.

    ``"".join(tokenize(text)) == text`` always holds.
    """
    return list(_tokenize(text))


@functools.lru_cache(maxsize=256)  # the same few texts, a thousand requests at once
def _tokenize(text: str) -> tuple[str, ...]:
    pieces: list[str] = []
    for match in _PIECE.finditer(text):
        piece = match.group()
        if len(piece) <= 8:
            pieces.append(piece)
            continue
        parts = math.ceil(len(piece) / 6)
        size = math.ceil(len(piece) / parts)
        pieces.extend(piece[i : i + size] for i in range(0, len(piece), size))
    return tuple(pieces)


def fit(pieces: list[str], count: int) -> list[str]:
    """``pieces`` repeated (a blank line between copies) or cut to exactly ``count`` pieces."""
    if not pieces:
        return []
    result = list(pieces)
    while len(result) < count:
        result.append("\n\n")
        result.extend(pieces)
    return result[:count]


def message_text(content: Any) -> str:
    """The text of a message's ``content``: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def prompt_tokens(messages: Any) -> int:
    """A deterministic estimate: ceil(characters / 4) plus 3 per message."""
    if not isinstance(messages, list):
        return 0
    chars = sum(len(message_text(m.get("content"))) for m in messages if isinstance(m, dict))
    return math.ceil(chars / 4) + 3 * len(messages)


def tool_results(messages: Any) -> list[str] | None:
    """The texts of the ``tool`` messages that end ``messages``, or None when the last message
    is no tool result."""
    if not isinstance(messages, list):
        return None
    results = []
    for message in reversed(messages):
        if not (isinstance(message, dict) and message.get("role") == "tool"):
            break
        results.append(message_text(message.get("content")))
    return results[::-1] or None


def tool_message_problem(messages: Any) -> str:
    """What OpenAI refuses in how ``messages`` pair tool calls with their results (``""``: none):
    a ``tool`` message answering no call of the assistant message before it, a call left
    unanswered, or two calls of one message with the same id."""
    if not isinstance(messages, list):
        return ""
    waiting: list[str] | None = None
    for message in [*messages, {"role": "end"}]:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            answered = message.get("tool_call_id")
            if waiting is None or answered not in waiting:
                return ("Invalid parameter: messages with role 'tool' must be a response to a "
                        "preceeding message with 'tool_calls'.")
            waiting.remove(answered)
            continue
        if waiting:
            return ("An assistant message with 'tool_calls' must be followed by tool messages "
                    "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                    f"response messages: {', '.join(waiting)}")
        calls = message.get("tool_calls") if role == "assistant" else None
        waiting = None
        if isinstance(calls, list) and calls:
            waiting = [str(call.get("id")) for call in calls if isinstance(call, dict)]
            if len(set(waiting)) < len(waiting):
                return "Invalid parameter: tool_call ids must be unique within a message."
    return ""


def last_user_text(messages: Any) -> str:
    """The text of the last ``user`` message, or ``""``."""
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return message_text(message.get("content"))
    return ""
