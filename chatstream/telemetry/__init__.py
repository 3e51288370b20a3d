"""Spans and metrics of the upstream calls and the tool calls, through ``opentelemetry-api``.

Without an SDK (the site installed none, or set no providers) every call here is the API's
no-op: a non-recording span, histograms that drop what they are given. The tracer and the
meter are the API's proxies, made at import: a site that sets its providers later (in its
``asgi.py``, after Django's setup) still gets everything. What is emitted follows the GenAI
semantic conventions v1.41.0 (experimental); docs/observability.md lists it.

How the engine uses it, for one generation's run (at most these calls per attempt, none per
delta)::

    reply = telemetry.reply(generation)         # the reply's span "chatstream.reply"
    attempt = reply.attempt(model, 1, request=body)  # CLIENT span "chat {model.model}"
    attempt.first_chunk(response_model=acc.model)    # once, at the first chunk read
    attempt.end(response_model=acc.model, response_id=acc.id,
                finish_reasons=["stop"], input_tokens=12, output_tokens=34,
                error_type=None)                # or the outcome's error type: status ERROR
    reply.attempt(fallback, 2, request=body2)   # a retry or a fallback: one span each
    ...
    reply.end(error_type=None)                  # the reply's span ends
    Round.after(step, model, parent=reply.context)  # the step's tool calls under its span

``request`` is the request's body as sent (``messages``, ``max_tokens``, ``temperature``...):
its fields become ``gen_ai.request.*`` attributes, and its messages ``gen_ai.input.messages``
when the site opted in to content; ``attempt.end(text=..., reasoning=..., tool_calls=...)``
(the reply's, choice 0) likewise become ``gen_ai.output.messages``. Nothing of them is read
unless the span records and ``CHATSTREAM_TELEMETRY_CONTENT`` is on. Every method may be called
from any task; ``end`` and ``first_chunk`` count once, whatever calls them again.

A tool call's span (``execute_tool {name}``) is made by ``tools.execute`` through
:func:`tool_call`; its parent is the ``parent`` context it is given (``Reply.context``), else
the current one, as for any span.

``gen_ai.provider.name`` is the provider entry's ``"NAME"`` in ``CHATSTREAM_PROVIDERS`` (a
well-known value of the conventions: ``openai``, ``anthropic``, ``groq``...), else its alias.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .. import __version__
from ..conf import ModelChoice, conf
from . import _content

if TYPE_CHECKING:
    from ..models import Generation

__all__ = ["SECONDS_BUCKETS", "TOKEN_BUCKETS", "Attempt", "Reply", "ToolCallSpan", "meter",
           "reply", "tool_call", "tracer"]

tracer = trace.get_tracer("chatstream", __version__)
meter = metrics.get_meter("chatstream", __version__)

# The conventions' explicit bucket boundaries (v1.41.0, gen-ai-metrics.md).
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)
SECONDS_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                   40.96, 81.92)

operation_duration = meter.create_histogram(
    "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration.",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)
token_usage = meter.create_histogram(
    "gen_ai.client.token.usage", unit="{token}",
    description="Number of input and output tokens used.",
    explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
time_to_first_chunk = meter.create_histogram(
    "gen_ai.client.operation.time_to_first_chunk", unit="s",
    description="Time to receive the first chunk of a streaming response.",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)

# The request's fields recorded on an attempt's span, and the attribute each becomes.
REQUEST_FIELDS = {"max_tokens": "gen_ai.request.max_tokens",
                  "max_completion_tokens": "gen_ai.request.max_tokens",
                  "temperature": "gen_ai.request.temperature", "top_p": "gen_ai.request.top_p",
                  "frequency_penalty": "gen_ai.request.frequency_penalty",
                  "presence_penalty": "gen_ai.request.presence_penalty",
                  "seed": "gen_ai.request.seed", "n": "gen_ai.request.choice.count"}


def reply(generation: Generation, *, parent: Context | None = None) -> Reply:
    """Start the span of ``generation``'s run (one per generation, whatever its attempts),
    a child of ``parent`` (None: of the current context, a request's span if the site traces
    its requests)."""
    span = tracer.start_span("chatstream.reply", parent, SpanKind.INTERNAL)
    if span.is_recording():
        span.set_attributes({"gen_ai.conversation.id": str(generation.conversation_id),
                             "chatstream.generation.id": str(generation.pk),
                             "chatstream.model": generation.model,
                             "chatstream.step": generation.step})
    return Reply(span, generation.conversation_id)


class Reply:
    """The telemetry of one generation's run: its span, the parent of its attempts' spans."""

    __slots__ = ("_context", "_ended", "conversation_id", "span")

    def __init__(self, span: Span, conversation_id: Any) -> None:
        self.span = span
        self.conversation_id = conversation_id
        self._context: Context | None = None
        self._ended = False

    @property
    def context(self) -> Context:
        """A context holding the reply's span: the parent of its attempts and its tool calls."""
        if self._context is None:
            self._context = trace.set_span_in_context(self.span)
        return self._context

    def attempt(self, model: ModelChoice, number: int = 1, *,
                request: Mapping[str, Any] | None = None) -> Attempt:
        """Start the span of one call of ``model`` (the ``number``-th of this reply), whose
        body is ``request``; see the module docstring."""
        return Attempt(self, model, number, request)

    def end(self, error_type: str | None = None) -> None:
        """End the reply's span: its status ERROR and ``error.type`` when ``error_type``."""
        if self._ended:
            return
        self._ended = True
        _fail(self.span, error_type)
        self.span.end()


class Attempt:
    """One upstream call: its CLIENT span and its measures."""

    __slots__ = ("_ended", "_first", "_started", "attributes", "span")

    def __init__(self, reply: Reply, model: ModelChoice, number: int,
                 request: Mapping[str, Any] | None) -> None:
        # The attributes the conventions want at the span's start (for sampling) are the
        # metrics' too: built once.
        self.attributes = _call_attributes(model)
        self.span = span = tracer.start_span(f"chat {model.model}", reply.context,
                                             SpanKind.CLIENT, self.attributes)
        self._first = self._ended = False
        self._started = time.perf_counter()
        if span.is_recording():
            span.set_attributes({"gen_ai.conversation.id": str(reply.conversation_id),
                                 "gen_ai.request.stream": True, "chatstream.attempt": number,
                                 "chatstream.model": model.key})
            if request is not None:
                _record_request(span, request)

    def first_chunk(self, response_model: str = "") -> None:
        """The first chunk of the response was read: ``time_to_first_chunk`` (once)."""
        if self._first or self._ended:
            return
        self._first = True
        elapsed = time.perf_counter() - self._started
        if response_model:
            self.attributes["gen_ai.response.model"] = response_model
        time_to_first_chunk.record(elapsed, self.attributes)
        if self.span.is_recording():
            self.span.set_attribute("gen_ai.response.time_to_first_chunk", elapsed)

    def end(self, *, response_model: str = "", response_id: str = "",
            finish_reasons: Sequence[str] = (), input_tokens: int | None = None,
            output_tokens: int | None = None, error_type: str | None = None,
            text: str = "", reasoning: str = "",
            tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        """The call ended: its span ends, its duration and token usage are recorded.

        ``error_type`` (None when it succeeded) is a short label (the outcome's error type, an
        HTTP status...) and sets the span's status to ERROR. ``text``, ``reasoning`` and
        ``tool_calls`` (``{"id", "name", "arguments"}`` each) are the reply's, read only for
        a site that opted in to content."""
        if self._ended:
            return
        self._ended = True
        elapsed = time.perf_counter() - self._started
        attributes = self.attributes
        if response_model:
            attributes["gen_ai.response.model"] = response_model
        span = self.span
        if span.is_recording():
            _record_response(span, response_model, response_id, finish_reasons, input_tokens,
                             output_tokens)
            if conf.TELEMETRY_CONTENT:
                span.set_attribute("gen_ai.output.messages", _content.output_messages(
                    text, reasoning, tool_calls, finish_reasons))
            _fail(span, error_type)
        span.end()
        if input_tokens is not None:
            token_usage.record(input_tokens, {**attributes, "gen_ai.token.type": "input"})
        if output_tokens is not None:
            token_usage.record(output_tokens, {**attributes, "gen_ai.token.type": "output"})
        if error_type:
            attributes["error.type"] = error_type
        operation_duration.record(elapsed, attributes)


def tool_call(name: str, *, call_id: str = "", description: str = "",
              conversation_id: Any = None, arguments: str = "",
              parent: Context | None = None) -> ToolCallSpan:
    """Start the span of one run of tool ``name`` (``arguments``: the JSON the model sent,
    recorded only for a site that opted in to content)."""
    span = tracer.start_span(f"execute_tool {name}", parent, SpanKind.INTERNAL, {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name})
    if span.is_recording():
        span.set_attribute("gen_ai.tool.type", "function")
        if call_id:
            span.set_attribute("gen_ai.tool.call.id", call_id)
        if description:
            span.set_attribute("gen_ai.tool.description", description)
        if conversation_id is not None:
            span.set_attribute("gen_ai.conversation.id", str(conversation_id))
        if conf.TELEMETRY_CONTENT:
            span.set_attribute("gen_ai.tool.call.arguments", arguments)
    return ToolCallSpan(span)


class ToolCallSpan:
    """The span of one tool call's run, made current where the tool runs (its own spans are
    its children), ended once."""

    __slots__ = ("_ended", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._ended = False

    def current(self) -> Any:
        """A context manager making the span current (it does not end it)."""
        return trace.use_span(self.span, end_on_exit=False, record_exception=False,
                              set_status_on_exception=False)

    def end(self, error_type: str | None = None, result: str | None = None) -> None:
        """End the span: ERROR with ``error_type``, or ``result`` (what the model is told,
        recorded only for a site that opted in to content)."""
        if self._ended:
            return
        self._ended = True
        span = self.span
        if span.is_recording():
            if result is not None and not error_type and conf.TELEMETRY_CONTENT:
                span.set_attribute("gen_ai.tool.call.result", result)
            _fail(span, error_type)
        span.end()


def _call_attributes(model: ModelChoice) -> dict[str, Any]:
    entry = conf.PROVIDERS.get(model.provider) or {}
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": str(entry.get("NAME") or model.provider),
        "gen_ai.request.model": model.model}
    server = _server(entry.get("BASE_URL"))
    if server is not None:
        attributes["server.address"], attributes["server.port"] = server
    return attributes


@functools.lru_cache(maxsize=64)
def _server(base_url: Any) -> tuple[str, int] | None:
    """The host and port of a provider's ``BASE_URL`` (parsed once per URL)."""
    try:
        parts = urlsplit(str(base_url))
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname, port


def _record_request(span: Span, request: Mapping[str, Any]) -> None:
    for field, attribute in REQUEST_FIELDS.items():
        value = request.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            span.set_attribute(attribute, value)
    stop = request.get("stop")
    if stop:
        span.set_attribute("gen_ai.request.stop_sequences",
                           [stop] if isinstance(stop, str) else [str(s) for s in stop])
    if conf.TELEMETRY_CONTENT and request.get("messages"):
        span.set_attribute("gen_ai.input.messages",
                           _content.input_messages(request["messages"]))


def _record_response(span: Span, response_model: str, response_id: str,
                     finish_reasons: Sequence[str], input_tokens: int | None,
                     output_tokens: int | None) -> None:
    if response_model:
        span.set_attribute("gen_ai.response.model", response_model)
    if response_id:
        span.set_attribute("gen_ai.response.id", response_id)
    if finish_reasons:
        span.set_attribute("gen_ai.response.finish_reasons", [str(r) for r in finish_reasons])
    if input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    if output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", output_tokens)


def _fail(span: Span, error_type: str | None) -> None:
    if error_type and span.is_recording():
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR))
