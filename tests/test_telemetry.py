"""Telemetry: the spans and metrics of upstream calls and tool calls, read with the SDK's
in-memory exporter and reader.

OpenTelemetry's global providers can be set once per process: the session fixture sets them
the first time a test here asks, after ``chatstream.telemetry`` was imported (by the test
collection), so every test here also shows that the module's proxy tracer and meter reach
providers set after import. Spans reach the exporter only while a test of this module runs;
metrics are read as deltas, each test reading its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    InMemoryMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import chatstream.telemetry
from chatstream import api, telemetry
from chatstream.conf import conf
from chatstream.models import Generation
from chatstream.tools import ToolContext, ToolError, execute, tool

ROOT = Path(__file__).resolve().parent.parent


class WhileOn(SpanProcessor):
    """Passes ended spans on only while a test of this module runs."""

    def __init__(self, processor: SpanProcessor) -> None:
        self.processor = processor
        self.on = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.processor.on_end(span)


class Telemetry:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.switch = WhileOn(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader(
            preferred_temporality={Histogram: AggregationTemporality.DELTA})
        self.read: list[tuple[Any, HistogramDataPoint]] = []

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name in (None, s.name)]

    def span(self, name: str) -> ReadableSpan:
        [found] = self.spans(name)
        return found

    def points(self, metric_name: str) -> list[tuple[Any, HistogramDataPoint]]:
        """(the metric, one of its points) of what this test recorded (read as deltas, each
        read kept)."""
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if scope.scope.name == "chatstream":
                        self.read += [(metric, point) for point in metric.data.data_points]
        return [(metric, point) for metric, point in self.read if metric.name == metric_name]


@pytest.fixture(scope="session")
def sdk() -> Telemetry:
    assert "chatstream.telemetry" in sys.modules  # imported before the providers are set
    kit = Telemetry()
    provider = TracerProvider()
    provider.add_span_processor(kit.switch)
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[kit.reader]))
    return kit


@pytest.fixture
def otel(sdk: Telemetry) -> Iterator[Telemetry]:
    sdk.exporter.clear()
    sdk.reader.get_metrics_data()  # what earlier tests recorded is read and dropped
    sdk.read = []
    sdk.switch.on = True
    yield sdk
    sdk.switch.on = False
    sdk.exporter.clear()


def generation(**fields: Any) -> Any:
    return SimpleNamespace(**{"pk": "g-1", "conversation_id": "c-1", "model": "mini", "step": 1,
                              **fields})


@pytest.fixture
def mini(settings: Any) -> Any:
    settings.CHATSTREAM_PROVIDERS = {
        "main": {"BASE_URL": "https://llm.example.com:8443/v1", "API_KEY": "k", "NAME": "openai"},
        "local": {"BASE_URL": "http://127.0.0.1/v1", "API_KEY": "k"}}
    settings.CHATSTREAM_MODELS = {"mini": {"PROVIDER": "main", "MODEL": "gpt-mini"},
                                  "small": {"PROVIDER": "local", "MODEL": "llama-small"}}
    return conf.get_model("mini")


REQUEST = {"model": "gpt-mini", "max_tokens": 100, "temperature": 0.5, "stream": True,
           "stop": "END", "messages": [
               {"role": "system", "content": "Be brief."},
               {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "rainy"}]}


def one_reply(model: Any, *, error_type: str | None = None, **end: Any) -> telemetry.Reply:
    reply = telemetry.reply(generation())
    attempt = reply.attempt(model, 1, request=REQUEST)
    attempt.first_chunk(response_model="gpt-mini-2025")
    attempt.end(**{"response_model": "gpt-mini-2025", "response_id": "chatcmpl-1",
                   "finish_reasons": ["stop"], "input_tokens": 12, "output_tokens": 300,
                   "error_type": error_type, "text": "Rainy.", **end})
    reply.end(error_type)
    return reply


def test_one_reply_is_a_span_with_one_client_span_per_attempt(otel, mini):
    one_reply(mini)
    reply, attempt = otel.span("chatstream.reply"), otel.span("chat gpt-mini")
    assert reply.kind is SpanKind.INTERNAL and attempt.kind is SpanKind.CLIENT
    assert attempt.parent is not None and attempt.parent.span_id == reply.context.span_id
    assert attempt.context.trace_id == reply.context.trace_id
    assert dict(reply.attributes) == {"gen_ai.conversation.id": "c-1",
                                      "chatstream.generation.id": "g-1",
                                      "chatstream.model": "mini", "chatstream.step": 1}
    attributes = dict(attempt.attributes)
    assert attributes.pop("gen_ai.response.time_to_first_chunk") >= 0
    assert attributes == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-mini", "server.address": "llm.example.com",
        "server.port": 8443, "gen_ai.conversation.id": "c-1", "gen_ai.request.stream": True,
        "chatstream.attempt": 1, "chatstream.model": "mini", "gen_ai.request.max_tokens": 100,
        "gen_ai.request.temperature": 0.5, "gen_ai.request.stop_sequences": ("END",),
        "gen_ai.response.model": "gpt-mini-2025", "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ("stop",), "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 300}
    assert reply.status.status_code is StatusCode.UNSET
    assert attempt.status.status_code is StatusCode.UNSET


def test_a_retry_and_a_fallback_are_spans_of_one_reply_the_failed_ones_in_error(otel, mini):
    reply = telemetry.reply(generation())
    first = reply.attempt(mini, 1)
    first.end(error_type="http_503")
    first.end()  # counts once
    fallback = reply.attempt(conf.get_model("small"), 2)
    fallback.first_chunk()
    fallback.end(response_model="llama-small", finish_reasons=["length"], output_tokens=5)
    reply.end()
    failed, answered = otel.span("chat gpt-mini"), otel.span("chat llama-small")
    parent = otel.span("chatstream.reply").context.span_id
    assert failed.parent.span_id == parent and answered.parent.span_id == parent
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "http_503"
    assert failed.attributes["chatstream.attempt"] == 1
    assert answered.attributes["chatstream.attempt"] == 2
    assert "error.type" not in answered.attributes
    assert answered.attributes["gen_ai.provider.name"] == "local"  # no NAME: the alias
    assert answered.attributes["server.address"] == "127.0.0.1"
    assert answered.attributes["server.port"] == 80
    durations = {p.attributes["gen_ai.request.model"]: p for _, p in
                 otel.points("gen_ai.client.operation.duration")}
    assert durations["gpt-mini"].attributes["error.type"] == "http_503"
    assert "error.type" not in durations["llama-small"].attributes
    assert [p.count for p in durations.values()] == [1, 1]


def test_a_reply_that_failed_is_in_error(otel, mini):
    one_reply(mini, error_type="timeout")
    for name in ("chatstream.reply", "chat gpt-mini"):
        span = otel.span(name)
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "timeout"
    # The span's status holds no words of the failure, which could quote a message.
    assert otel.span("chat gpt-mini").status.description is None


def test_the_histograms_have_the_conventions_names_units_attributes_and_buckets(otel, mini):
    one_reply(mini)
    [(duration, elapsed)] = otel.points("gen_ai.client.operation.duration")
    [(first, to_first)] = otel.points("gen_ai.client.operation.time_to_first_chunk")
    usage = otel.points("gen_ai.client.token.usage")
    assert (duration.unit, first.unit) == ("s", "s")
    assert {metric.unit for metric, _ in usage} == {"{token}"}
    seconds = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
               40.96, 81.92)
    assert tuple(elapsed.explicit_bounds) == tuple(to_first.explicit_bounds) == seconds
    tokens = tuple(4 ** i for i in range(14))
    assert tokens[-1] == 67108864
    assert all(tuple(point.explicit_bounds) == tokens for _, point in usage)
    common = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
              "gen_ai.request.model": "gpt-mini", "gen_ai.response.model": "gpt-mini-2025",
              "server.address": "llm.example.com", "server.port": 8443}
    assert dict(elapsed.attributes) == dict(to_first.attributes) == common
    by_type = {point.attributes["gen_ai.token.type"]: point for _, point in usage}
    assert {kind: dict(p.attributes) for kind, p in by_type.items()} == {
        "input": {**common, "gen_ai.token.type": "input"},
        "output": {**common, "gen_ai.token.type": "output"}}
    assert (by_type["input"].sum, by_type["output"].sum) == (12, 300)
    assert list(by_type["output"].bucket_counts)[5] == 1  # 300 is in (256, 1024]
    assert elapsed.count == to_first.count == 1 and 0 <= to_first.sum <= elapsed.sum


def test_first_chunk_counts_once_and_unknown_usage_is_not_recorded(otel, mini):
    reply = telemetry.reply(generation())
    attempt = reply.attempt(mini)
    attempt.first_chunk()
    attempt.first_chunk()
    attempt.end(error_type="interrupted")
    attempt.first_chunk()  # after its end: nothing
    reply.end("interrupted")
    [(_, point)] = otel.points("gen_ai.client.operation.time_to_first_chunk")
    assert point.count == 1
    assert otel.points("gen_ai.client.token.usage") == []
    span = otel.span("chat gpt-mini")
    assert not any(key.startswith("gen_ai.usage.") for key in span.attributes)


def test_no_text_of_the_conversation_is_in_a_span_by_default(otel, mini):
    one_reply(mini, reasoning="Thinking.")
    for span in otel.spans():
        recorded = json.dumps(dict(span.attributes))
        assert "Paris" not in recorded and "Rainy" not in recorded and "brief" not in recorded
        assert not {"gen_ai.input.messages", "gen_ai.output.messages"} & set(span.attributes)


def test_with_content_on_the_messages_follow_the_conventions(otel, mini, settings):
    settings.CHATSTREAM_TELEMETRY_CONTENT = True
    one_reply(mini, reasoning="Thinking.", tool_calls=[
        {"id": "call_2", "name": "get_time", "arguments": '{"timezone":"CET"}'}])
    span = otel.span("chat gpt-mini")
    assert json.loads(span.attributes["gen_ai.input.messages"]) == [
        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1",
                                         "name": "get_weather",
                                         "arguments": {"city": "Paris"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1",
                                    "response": "rainy"}]}]
    assert json.loads(span.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "finish_reason": "stop", "parts": [
            {"type": "reasoning", "content": "Thinking."},
            {"type": "text", "content": "Rainy."},
            {"type": "tool_call", "id": "call_2", "name": "get_time",
             "arguments": {"timezone": "CET"}}]}]
    assert "gen_ai.input.messages" not in otel.span("chatstream.reply").attributes


# --- tool calls ---------------------------------------------------------------------------------

inner: list[Any] = []


@tool(timeout=0.2)
def slow(seconds: float) -> str:
    """Sleeps, then answers."""
    with telemetry.tracer.start_as_current_span("inside slow"):
        time.sleep(seconds)
    return "woke"


@tool
def broken(kind: str) -> str:
    """Fails."""
    if kind == "tool":
        raise ToolError("No such city.")
    raise ValueError("the user's words")


@tool
async def quick(word: str) -> str:
    """Answers at once."""
    with telemetry.tracer.start_as_current_span("inside quick"):
        return word.upper()


@tool(timeout=0.1)
async def stuck() -> str:
    """Never answers."""
    await asyncio.sleep(10)
    return ""


def context_for(call_id: str = "call_9", arguments: str = "{}") -> ToolContext:
    call = SimpleNamespace(pk="row-9", call_id=call_id, arguments=arguments)
    return ToolContext(None, SimpleNamespace(pk="c-7"), None, call)


async def test_a_tool_call_is_an_execute_tool_span_under_the_reply_it_is_given(otel, mini):
    reply = telemetry.reply(generation())
    outcome = await execute(quick, {"word": "hi"}, context_for(arguments='{"word":"hi"}'),
                            parent=reply.context)
    reply.end()
    assert outcome.result == "HI"
    span, parent = otel.span("execute_tool quick"), otel.span("chatstream.reply")
    assert span.kind is SpanKind.INTERNAL
    assert span.parent.span_id == parent.context.span_id
    assert dict(span.attributes) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "quick",
        "gen_ai.tool.type": "function", "gen_ai.tool.call.id": "call_9",
        "gen_ai.tool.description": "Answers at once.", "gen_ai.conversation.id": "c-7"}
    assert span.status.status_code is StatusCode.UNSET
    # The tool's own spans are the call's children.
    assert otel.span("inside quick").parent.span_id == span.context.span_id


async def test_a_sync_tool_that_outlives_its_timeout_ends_its_span_when_it_returns(otel):
    started = time.perf_counter()
    outcome = await execute(slow, {"seconds": 0.6}, context_for())
    assert outcome.status == "timed_out" and time.perf_counter() - started < 0.5
    assert otel.spans("execute_tool slow") == []  # it still runs, in its thread
    for _ in range(100):
        if otel.spans("execute_tool slow"):
            break
        await asyncio.sleep(0.02)
    span = otel.span("execute_tool slow")
    assert (span.end_time - span.start_time) / 1e9 >= 0.6
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "timeout"
    assert otel.span("inside slow").parent.span_id == span.context.span_id
    assert span.parent is None  # no parent given, none current


async def test_a_sync_call_that_never_got_a_thread_ends_its_span_on_the_loop(otel, monkeypatch):
    from chatstream.tools import _running

    busy = threading.Event()
    pool = _running.ThreadPoolExecutor(1)
    monkeypatch.setattr(_running, "_executor", pool)
    pool.submit(busy.wait, 5)  # the only thread is taken
    try:
        outcome = await execute(slow, {"seconds": 0}, context_for())
        assert outcome.status == "timed_out"
        span = otel.span("execute_tool slow")
        assert span.attributes["error.type"] == "timeout"
        assert otel.spans("inside slow") == []
    finally:
        busy.set()
        pool.shutdown(wait=True)
    assert otel.spans("inside slow") == []  # it never started, even once a thread was free


@pytest.mark.parametrize(("tool_", "arguments", "error_type"), [
    (broken, {"kind": "tool"}, "tool_error"),
    (broken, {"kind": "crash"}, "ValueError"),
    (stuck, {}, "timeout"),
])
async def test_a_failed_call_s_span_is_in_error_with_its_type(otel, settings, tool_, arguments,
                                                           error_type):
    settings.CHATSTREAM_TELEMETRY_CONTENT = True
    outcome = await execute(tool_, arguments, context_for())
    assert outcome.error_type == error_type
    span = otel.span(f"execute_tool {tool_.name}")
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is None  # no words of the exception's
    assert span.attributes["error.type"] == error_type
    assert "gen_ai.tool.call.result" not in span.attributes
    if tool_ is stuck:
        assert (span.end_time - span.start_time) / 1e9 < 1


async def test_a_cancelled_call_ends_its_span(otel):
    task = asyncio.ensure_future(execute(stuck, {}, context_for()))
    await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert otel.span("execute_tool stuck").attributes["error.type"] == "cancelled"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("content", [False, True])
def test_the_tool_loop_s_calls_are_execute_tool_spans(otel, settings, make_user, content):
    settings.CHATSTREAM_TELEMETRY_CONTENT = content
    settings.CHATSTREAM_MODELS = {"agent": {"PROVIDER": "default", "MODEL": "agent", "TOOLS": [
        "tests.test_tool_loop.get_weather", "tests.test_tool_loop.get_time"]}}
    last = api.run(api.send(make_user(), "Weather and time in Paris?"))
    assert last.status == Generation.Status.COMPLETED and last.step == 2
    weather, clock = otel.span("execute_tool get_weather"), otel.span("execute_tool get_time")
    assert weather.attributes["gen_ai.tool.call.id"] and clock.attributes["gen_ai.tool.call.id"]
    assert weather.attributes["gen_ai.conversation.id"] == str(last.conversation_id)
    assert "error.type" not in weather.attributes
    if content:
        assert json.loads(weather.attributes["gen_ai.tool.call.arguments"])["city"] == "Paris"
        assert json.loads(weather.attributes["gen_ai.tool.call.result"])["sky"] == "clear"
        assert clock.attributes["gen_ai.tool.call.result"] == "12:00"
    else:
        for span in (weather, clock):
            assert "Paris" not in json.dumps(dict(span.attributes))
            assert "gen_ai.tool.call.arguments" not in span.attributes
            assert "gen_ai.tool.call.result" not in span.attributes


# --- without an SDK -----------------------------------------------------------------------------

WITHOUT_SDK = """
import asyncio, django
django.setup()
from types import SimpleNamespace
from opentelemetry import trace
from chatstream import telemetry
from chatstream.conf import conf
from chatstream.tools import ToolContext, execute
from tests.test_telemetry import broken, quick, slow

model = conf.get_model(None)
reply = telemetry.reply(SimpleNamespace(pk=1, conversation_id=2, model="m", step=1))
attempt = reply.attempt(model, 1, request={"messages": [{"role": "user", "content": "hi"}]})
attempt.first_chunk()
attempt.end(response_model="x", input_tokens=1, output_tokens=2, error_type="http_500")
reply.end("http_500")
assert not reply.span.is_recording() and not attempt.span.is_recording()
context = ToolContext(None, None, None, None)

async def main():
    for tool_, arguments in ((quick, {"word": "a"}), (slow, {"seconds": 0}),
                             (broken, {"kind": "crash"})):
        outcome = await execute(tool_, arguments, context, parent=reply.context)
        print(tool_.name, outcome.status)

asyncio.run(main())
print(type(trace.get_tracer_provider()).__name__)
"""


def test_without_an_sdk_nothing_records_and_nothing_breaks(settings):
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
                   "CHATSTREAM_TEST_OVERRIDES": json.dumps({
                       "CHATSTREAM_PROVIDERS": settings.CHATSTREAM_PROVIDERS,
                       "CHATSTREAM_MODELS": settings.CHATSTREAM_MODELS,
                       "CHATSTREAM_TELEMETRY_CONTENT": True})}
    done = subprocess.run([sys.executable, "-c", WITHOUT_SDK], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["quick", "succeeded", "slow", "succeeded", "broken",
                                   "failed", "ProxyTracerProvider"]
    assert chatstream.telemetry.tracer is telemetry.tracer


def test_content_parts_of_every_shape_and_arguments_that_are_not_json():
    from chatstream.telemetry import _content

    messages = json.loads(_content.input_messages([
        {"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "input_audio", "input_audio": {}}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": "{not json"}}]}]))
    assert messages == [
        {"role": "user", "parts": [
            {"type": "text", "content": "What is this?"},
            {"type": "uri", "modality": "image", "uri": "https://example.com/a.png"},
            {"type": "input_audio"}]},
        {"role": "assistant", "parts": [
            {"type": "tool_call", "id": "c1", "name": "f", "arguments": "{not json"}]}]
    # A reply that ended without a finish reason (interrupted) ended in error.
    assert json.loads(_content.output_messages("", "", [], [])) == [
        {"role": "assistant", "parts": [], "finish_reason": "error"}]


@pytest.mark.parametrize(("base_url", "server"), [
    ("https://api.example.com/v1", ("api.example.com", 443)),
    ("http://[::1]:8001/v1", ("::1", 8001)),
    ("http://host:notaport/v1", None),
    ("no url", None),
    (None, None),
])
def test_the_server_is_read_from_the_base_url(base_url, server):
    assert telemetry._server(base_url) == server


# --- through the engine: a real reply from the simulated upstream ------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_reply_with_a_fallback_is_one_reply_span_with_a_chat_span_per_call(otel, settings,
                                                                             make_user):
    settings.CHATSTREAM_MODELS = {
        "primary": {"MODEL": "http-503?tps=0", "FALLBACKS": ["backup"]},
        "backup": {"MODEL": "default?tps=0&cached_tokens=3"},
    }
    generation = api.run(api.send(make_user(), "Hi", model="primary"))
    assert generation.answered_by == "backup"
    reply = otel.span("chatstream.reply")
    failed = otel.span("chat http-503?tps=0")
    answered = otel.span("chat default?tps=0&cached_tokens=3")
    assert failed.parent.span_id == answered.parent.span_id == reply.context.span_id
    assert reply.attributes["chatstream.generation.id"] == str(generation.pk)
    assert reply.attributes["gen_ai.conversation.id"] == str(generation.conversation_id)
    assert reply.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "http_503"
    assert answered.attributes["chatstream.attempt"] == 2
    assert answered.attributes["gen_ai.request.max_tokens"] == 1024  # the request's, as sent
    assert answered.attributes["gen_ai.usage.input_tokens"] == generation.prompt_tokens
    assert answered.attributes["gen_ai.usage.output_tokens"] == generation.completion_tokens
    assert answered.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert answered.attributes["gen_ai.response.id"].startswith("chatcmpl-")
    assert answered.attributes["gen_ai.response.time_to_first_chunk"] > 0
    assert "gen_ai.input.messages" not in answered.attributes  # content is off
    first_chunks = otel.points("gen_ai.client.operation.time_to_first_chunk")
    assert [p.attributes["gen_ai.request.model"] for _, p in first_chunks] == [
        "default?tps=0&cached_tokens=3"]  # the failed call read no chunk
    tokens = {p.attributes["gen_ai.token.type"]: p.sum
              for _, p in otel.points("gen_ai.client.token.usage")}
    assert tokens == {"input": generation.prompt_tokens, "output": generation.completion_tokens}
