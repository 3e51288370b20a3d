"""The simulated upstream (chatstream.testing), driven over real loopback HTTP with httpx."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from chatstream.testing import (
    DEFAULT_TEXT,
    SCENARIOS,
    RecordedRequest,
    ScenarioError,
    Script,
    Simulator,
    tokenize,
)
from chatstream.testing.scripts import MULTIBYTE_TEXT, select

pytest_plugins = ["chatstream.testing.pytest_plugin"]

HELLO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say hello, please."},
]


def sse_data(raw: bytes) -> list[str]:
    """The data of each event in ``raw`` (comments dropped), whatever its line endings."""
    text = raw.decode().replace("\r\n", "\n").replace("\r", "\n")
    events = []
    for block in text.split("\n\n"):
        data = [
            line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")
        ]
        if data:
            events.append("\n".join(data))
    return events


def chunks_of(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(data) for data in sse_data(raw) if data != "[DONE]"]


def text_of(chunks: list[dict[str, Any]], index: int = 0) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for chunk in chunks
        for choice in chunk.get("choices", [])
        if choice["index"] == index
    )


def finish_reasons(chunks: list[dict[str, Any]]) -> dict[int, str]:
    return {
        choice["index"]: choice["finish_reason"]
        for chunk in chunks
        for choice in chunk.get("choices", [])
        if choice.get("finish_reason")
    }


def body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": HELLO, "stream": True, **extra}


@pytest.fixture(scope="module")
def client(chatstream_simulator: Simulator) -> Iterator[httpx.Client]:
    """One pooled client for the module (creating one costs an SSL context)."""
    with httpx.Client(base_url=chatstream_simulator.base_url, timeout=5) as client:
        yield client


def post_stream(client: httpx.Client, model: str, **extra: Any) -> tuple[httpx.Response, bytes]:
    with client.stream("POST", "/chat/completions", json=body(model, **extra)) as response:
        return response, response.read()


# The normal reply


def test_default_stream_parses_to_default_text_with_usage(simulator, client):
    response, raw = post_stream(
        client, "gpt-demo?tps=0&first_token_delay=0", stream_options={"include_usage": True}
    )
    chunks = chunks_of(raw)
    record = simulator.last_request

    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.headers["x-request-id"] == record.id
    assert record.id.startswith("req_") and len(record.id) == 36
    assert text_of(chunks) == DEFAULT_TEXT
    assert sse_data(raw)[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert {chunk["id"] for chunk in chunks} == {chunks[0]["id"]}
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert {chunk["model"] for chunk in chunks} == {"gpt-demo"}
    assert finish_reasons(chunks) == {0: "stop"}
    assert chunks[-1]["choices"] == []
    assert all(chunk["usage"] is None for chunk in chunks[:-1])
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == len(tokenize(DEFAULT_TEXT)) == record.chunks_sent
    assert usage["prompt_tokens"] == -(-len("Be brief.Say hello, please.") // 4) + 3 * 2
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert record.completed and not record.client_closed and record.scenario == "default"


def test_default_text_reads_like_a_real_answer():
    pieces = tokenize(DEFAULT_TEXT)

    assert 140 <= len(pieces) <= 190
    assert "\n1. " in DEFAULT_TEXT and "```python\n" in DEFAULT_TEXT
    assert "".join(pieces) == DEFAULT_TEXT
    assert 2.5 <= len(DEFAULT_TEXT) / len(pieces) <= 5


@pytest.mark.parametrize(
    "text", ["", "Hello", " leading space", "naïve 你好世界 🎉🚀\n\n  indented", "x" * 50]
)
def test_tokenize_joins_back_to_the_text(text):
    pieces = tokenize(text)

    assert "".join(pieces) == text
    assert all(pieces) and all(len(piece) <= 8 for piece in pieces)


@pytest.mark.parametrize(
    ("model", "extra", "has_usage"),
    [
        ("fast", {"stream_options": {"include_usage": True}}, True),
        ("fast", {"stream_options": {"include_usage": False}}, False),
        ("fast", {}, False),
        ("no-usage?tps=0&first_token_delay=0", {"stream_options": {"include_usage": True}}, False),
        ("fast?usage=true", {}, True),
    ],
    ids=["asked", "declined", "not-asked", "no-usage-scenario", "forced"],
)
def test_usage_chunk_follows_include_usage_unless_forced(client, model, extra, has_usage):
    _, raw = post_stream(client, model + ("&" if "?" in model else "?") + "text=Hi", **extra)
    chunks = chunks_of(raw)

    assert any(chunk.get("usage") for chunk in chunks) is has_usage
    assert ("usage" in chunks[0]) is has_usage  # "usage": null rides on every chunk when asked


def test_usage_can_ride_on_the_finish_chunk(client):
    _, raw = post_stream(
        client, "fast?text=Hi&usage_placement=finish", stream_options={"include_usage": True}
    )
    chunks = chunks_of(raw)

    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == 1


def test_chunks_arrive_at_the_scripted_pace(client):
    arrivals = []
    started = time.monotonic()
    text = "one two three four five six seven eight nine ten eleven twelve"
    request = body(f"default?tps=40&first_token_delay=0.2&text={text}")
    with client.stream("POST", "/chat/completions", json=request) as response:
        for line in response.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                arrivals.append(time.monotonic() - started)

    assert len(arrivals) == 12
    assert 0.15 <= arrivals[0] < 0.6
    assert 0.15 <= arrivals[-1] - arrivals[0] < 1.0  # 11 gaps of 25 ms, loosely
    assert all(later > earlier for earlier, later in itertools.pairwise(arrivals))


def test_non_streaming_returns_a_whole_chat_completion(simulator, client):
    response = client.post("/chat/completions", json={"model": "fast", "messages": HELLO})
    completion = response.json()

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"] == simulator.last_request.id
    assert completion["object"] == "chat.completion"
    assert completion["id"].startswith("chatcmpl-")
    assert completion["choices"][0]["message"]["role"] == "assistant"
    assert completion["choices"][0]["message"]["content"] == DEFAULT_TEXT
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert completion["usage"]["completion_tokens"] == len(tokenize(DEFAULT_TEXT))


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_max_tokens_truncates_with_finish_reason_length(client, stream):
    request = body("fast", max_tokens=7, stream=stream, stream_options={"include_usage": True})
    if stream:
        with client.stream("POST", "/chat/completions", json=request) as response:
            chunks = chunks_of(response.read())
        text, finish = text_of(chunks), finish_reasons(chunks)[0]
        usage = chunks[-1]["usage"]
    else:
        completion = client.post("/chat/completions", json=request).json()
        text = completion["choices"][0]["message"]["content"]
        finish, usage = completion["choices"][0]["finish_reason"], completion["usage"]

    assert text == "".join(tokenize(DEFAULT_TEXT)[:7])
    assert finish == "length"
    assert usage["completion_tokens"] == 7


def test_echo_replies_with_the_last_user_message(client):
    _, raw = post_stream(client, "echo?tps=0&first_token_delay=0")

    assert text_of(chunks_of(raw)) == "Say hello, please."


def test_long_reply_has_the_asked_number_of_tokens(client):
    _, raw = post_stream(
        client, "long?tps=0&first_token_delay=0", stream_options={"include_usage": True}
    )
    chunks = chunks_of(raw)

    assert chunks[-1]["usage"]["completion_tokens"] == 2000
    assert len(text_of(chunks)) > 6000


# HTTP errors before streaming


@pytest.mark.parametrize(
    ("model", "status", "error_type", "code"),
    [
        ("http-401", 401, "invalid_request_error", "invalid_api_key"),
        ("http-429", 429, "requests", "rate_limit_exceeded"),
        ("http-500", 500, "server_error", None),
        ("http-503", 503, "server_error", None),
        ("fast?status=400", 400, "invalid_request_error", None),
    ],
    ids=["401", "429", "500", "503-by-name", "400-by-option"],
)
def test_http_error_scenarios_answer_openai_error_json(
    simulator, client, model, status, error_type, code
):
    response, raw = post_stream(client, model)
    error = json.loads(raw)["error"]

    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-request-id"] == simulator.last_request.id
    assert error["type"] == error_type and error["code"] == code and error["message"]
    assert ("retry-after" in response.headers) is (status in (429, 503))
    assert simulator.last_request.status == status


def test_429_retry_after_is_configurable(client):
    response, _ = post_stream(client, "http-429?retry_after=7")

    assert response.headers["retry-after"] == "7"


# Faults in the middle of the stream


def test_drop_cuts_the_chunked_body_after_n_content_chunks(simulator, client):
    received = []
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream(
            "POST", "/chat/completions", json=body("drop?tps=0&first_token_delay=0")
        ) as response:
            for line in response.iter_lines():
                received.append(line)
    chunks = [json.loads(line[6:]) for line in received if line.startswith("data: {")]

    assert text_of(chunks) == "".join(tokenize(DEFAULT_TEXT)[:5])
    assert not finish_reasons(chunks)
    record = simulator.last_request
    assert record.chunks_sent == 5 and not record.completed and not record.client_closed


def test_stall_goes_silent_until_the_client_closes(simulator, client):
    received = []
    request = body("stall?tps=0&first_token_delay=0")
    with client.stream(
        "POST", "/chat/completions", json=request, timeout=httpx.Timeout(5, read=0.4)
    ) as response:
        with pytest.raises(httpx.ReadTimeout):
            for line in response.iter_lines():
                received.append(line)
    record = simulator.last_request
    closed = record.wait_closed(1)
    chunks = [json.loads(line[6:]) for line in received if line.startswith("data: {")]

    assert text_of(chunks) == "".join(tokenize(DEFAULT_TEXT)[:3])
    assert closed and record.client_closed and not record.completed
    assert record.client_closed_at - record.first_chunk_at > 0.35  # held open, silent, until then
    assert record.chunks_sent_at_close == 3 and record.chunks_after_close == 0


def test_malformed_sends_a_broken_event_then_carries_on(client):
    _, raw = post_stream(client, "malformed?tps=0&first_token_delay=0&text=a b c d e")
    events = sse_data(raw)

    assert events[4] == "{not json"  # role chunk, 3 content chunks, then the broken one
    assert events[-1] == "[DONE]"
    assert (
        text_of([json.loads(data) for data in events if data not in ("{not json", "[DONE]")])
        == "a b c d e"
    )


def test_error_mid_stream_ends_with_openai_error_and_no_done(simulator, client):
    _, raw = post_stream(client, "error-mid?tps=0&first_token_delay=0")
    events = sse_data(raw)

    assert json.loads(events[-1]) == {
        "error": {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert "[DONE]" not in events and len(events) == 5
    assert not finish_reasons([json.loads(data) for data in events[:-1]])
    assert simulator.last_request.completed  # a clean end of the body: the error is the script


def test_no_done_ends_without_done_or_finish_reason(client):
    _, raw = post_stream(
        client, "no-done?tps=0&first_token_delay=0", stream_options={"include_usage": True}
    )
    events = sse_data(raw)
    chunks = [json.loads(data) for data in events]

    assert "[DONE]" not in events
    assert not finish_reasons(chunks)
    assert text_of(chunks) == DEFAULT_TEXT
    assert not any(chunk.get("usage") for chunk in chunks)


# Shapes and framing


def test_tools_stream_in_openai_fragments(client):
    _, raw = post_stream(client, "tools?tps=0&first_token_delay=0")
    chunks = chunks_of(raw)
    fragments = [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls", [])
    ]
    first = chunks[0]["choices"][0]["delta"]

    assert first["role"] == "assistant" and first["content"] is None
    assert first["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    openers = [fragment for fragment in fragments if "id" in fragment]
    assert [(f["index"], f["type"], f["function"]["name"]) for f in openers] == [
        (0, "function", "get_weather"),
        (1, "function", "get_time"),
    ]
    assert all(opener["id"].startswith("call_") for opener in openers)
    rest = [fragment for fragment in fragments if "id" not in fragment]
    assert rest and all(
        set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in rest
    )
    arguments = {
        index: "".join(f["function"]["arguments"] for f in fragments if f["index"] == index)
        for index in (0, 1)
    }
    assert json.loads(arguments[0]) == {"city": "Paris", "unit": "celsius"}
    assert json.loads(arguments[1]) == {"timezone": "Europe/Paris"}
    assert finish_reasons(chunks) == {0: "tool_calls"}


def call_ids_of(chunks: list[dict[str, Any]]) -> list[str]:
    return [call["id"] for chunk in chunks for choice in chunk["choices"]
            for call in choice["delta"].get("tool_calls", []) if "id" in call]


def asked_then_answered(ids: list[str], results: list[str]) -> list[dict[str, Any]]:
    """A conversation whose assistant asked for calls ``ids``, then their ``results``."""
    calls = [{"id": call_id, "type": "function",
              "function": {"name": "get_time", "arguments": "{}"}} for call_id in ids]
    return [*HELLO, {"role": "assistant", "content": None, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": call_id, "content": result}
              for call_id, result in zip(ids, results, strict=False))]


def test_an_agent_calls_its_tools_then_answers_from_their_results(client):
    _, raw = post_stream(client, "agent?tps=0&first_token_delay=0")
    chunks = chunks_of(raw)
    ids = call_ids_of(chunks)
    assert len(ids) == 2 and finish_reasons(chunks) == {0: "tool_calls"}
    messages = asked_then_answered(ids, ["18 °C, sunny", "14:05"])
    _, raw = post_stream(client, "agent?tps=0&first_token_delay=0", messages=messages)
    chunks = chunks_of(raw)
    assert text_of(chunks) == "Results: 18 °C, sunny | 14:05"
    assert call_ids_of(chunks) == [] and finish_reasons(chunks) == {0: "stop"}


@pytest.mark.parametrize(("option", "ids"), [
    ("call_ids=empty", ["", ""]), ("call_ids=repeated", ["call_0", "call_0"])])
def test_tool_call_ids_can_be_empty_or_repeated_as_some_servers_send_them(client, option, ids):
    _, raw = post_stream(client, f"tools?tps=0&first_token_delay=0&{option}")
    assert call_ids_of(chunks_of(raw)) == ids


@pytest.mark.parametrize(("ids", "results", "says"), [
    pytest.param(["call_a", "call_b"], ["one"], "did not have response messages: call_b",
                 id="unanswered-call"),
    pytest.param(["call_a"], ["one", "two"], "must be a response to a preceeding message",
                 id="result-of-no-call"),
    pytest.param(["call_a", "call_a"], ["one", "two"], "unique", id="repeated-id"),
])
def test_tool_results_that_do_not_pair_with_their_calls_are_refused_as_openai_does(
        client, ids, results, says):
    messages = asked_then_answered(ids, results)
    for extra in results[len(ids):]:  # results beyond the calls answer a call nobody made
        messages.append({"role": "tool", "tool_call_id": "call_z", "content": extra})
    response = client.post("/chat/completions", json=body("fast", messages=messages))
    assert response.status_code == 400 and says in response.json()["error"]["message"]


def test_n2_interleaves_two_choices_each_with_role_and_finish(client):
    _, raw = post_stream(client, "n2?tps=0&first_token_delay=0&text=alpha beta gamma")
    chunks = chunks_of(raw)
    order = [chunk["choices"][0]["index"] for chunk in chunks if chunk["choices"]]
    roles = [
        c["choices"][0]["index"]
        for c in chunks
        if c["choices"] and "role" in c["choices"][0]["delta"]
    ]

    assert order[:4] == [0, 0, 1, 1]  # role + first token of each choice, then alternating
    assert order[4:6] == [0, 1]
    assert roles == [0, 1]
    assert text_of(chunks, 0) == "alpha beta gamma"
    assert text_of(chunks, 1) == "Alternative 1: alpha beta gamma"
    assert finish_reasons(chunks) == {0: "stop", 1: "stop"}


def test_request_n_asks_for_more_choices(client):
    _, raw = post_stream(client, "fast?text=hi", n=3)

    assert finish_reasons(chunks_of(raw)) == {0: "stop", 1: "stop", 2: "stop"}


@pytest.mark.parametrize(
    ("model", "separator"),
    [
        ("fast", b"\n\n"),
        ("crlf?tps=0&first_token_delay=0", b"\r\n\r\n"),
        ("cr?tps=0&first_token_delay=0", b"\r\r"),
    ],
    ids=["lf", "crlf", "cr"],
)
def test_line_endings_frame_every_event(client, model, separator):
    _, raw = post_stream(client, model)
    events = raw.split(separator)

    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    assert all(event.startswith(b"data: ") for event in events[:-1])
    stray = raw.replace(separator, b"")
    assert b"\r" not in stray and b"\n" not in stray


@pytest.mark.parametrize(
    ("option", "check"),
    [
        (
            "data_space=false",
            lambda raw, chunks: raw.startswith(b"data:{") and b"data: " not in raw,
        ),
        (
            "role_every_delta=true",
            lambda raw, chunks: all(
                c["choices"][0]["delta"].get("role") == "assistant" for c in chunks[:-1]
            ),
        ),
        ("chunk_tokens=3", lambda raw, chunks: text_of(chunks[:2]) == "one two three"),
        (
            "finish_reason=content_filter",
            lambda raw, chunks: finish_reasons(chunks) == {0: "content_filter"},
        ),
    ],
    ids=["no-space-after-data", "role-every-delta", "chunk-tokens", "finish-reason"],
)
def test_quirk_options_change_the_stream_shape(client, option, check):
    _, raw = post_stream(client, f"fast?text=one two three four five six&{option}")
    chunks = chunks_of(raw)

    assert text_of(chunks) == "one two three four five six"
    assert check(raw, chunks)


@pytest.mark.parametrize(
    ("flood_of", "new_index"),
    [
        ("choices", lambda chunk: chunk["choices"][0]["index"]),
        ("tool_calls", lambda chunk: chunk["choices"][0]["delta"]["tool_calls"][0]["index"]),
    ],
    ids=["empty-choices", "empty-tool-calls"],
)
def test_a_flood_of_new_indexes_carries_no_text(client, flood_of, new_index):
    _, raw = post_stream(
        client, f"fast?text=one two&flood_after=1&flood_of={flood_of}&flood_bytes=20000"
    )
    chunks = chunks_of(raw)
    flood = [c for c in chunks if "object" not in c]  # bare chunks: no id, model or usage

    assert text_of(chunks) == "one two" and finish_reasons(chunks) == {0: "stop"}
    sent = sum(len(f"data: {json.dumps(c, separators=(',', ':'))}\n\n") for c in flood)
    assert 20_000 <= sent < 20_100
    assert [new_index(c) for c in flood] == list(range(1 if flood_of == "choices" else 0,
                                                       len(flood) + (flood_of == "choices")))
    assert all("content" not in json.dumps(c) for c in flood)


def test_the_provider_metadata_can_be_anything(simulator, client):
    odd = "x" * 300 + "\n\x1b[31m\u2028\x00"
    request_id = "req-\x85\x1b[0m\t" + "y" * 300
    query = urlencode({"response_model": odd, "completion_id": odd, "request_id": request_id,
                       "finish_reason": odd})
    response, raw = post_stream(client, f"fast?text=hi&{query}")
    chunks = chunks_of(raw)

    assert {c["model"] for c in chunks} == {c["id"] for c in chunks} == {odd}
    assert finish_reasons(chunks) == {0: odd}
    assert response.headers["x-request-id"] == request_id == simulator.last_request.id
    with pytest.raises(ScenarioError, match="request_id"):
        Script(request_id="split\r\nset-cookie: x=1")


@pytest.mark.parametrize(
    ("model", "pings"),
    [
        ("keepalive?tps=0&keepalive_every=0.1&first_token_delay=0.5", range(3, 6)),  # ~4, loaded CI
        ("fast?first_token_delay=0.3", range(1)),
    ],
    ids=["keepalive", "none-by-default"],
)
def test_keepalive_comments_fill_the_first_token_delay(client, model, pings):
    _, raw = post_stream(client, model)
    head = raw[: raw.index(b"data:")]

    assert head.count(b": keep-alive\n\n") in pings
    assert head.replace(b": keep-alive\n\n", b"") == b""


def test_keepalive_comments_continue_through_a_stall(simulator, client):
    request = body("stall?tps=0&first_token_delay=0&keepalive_every=0.1")
    pings = 0
    with client.stream("POST", "/chat/completions", json=request) as response:
        for line in response.iter_lines():
            pings += line == ": keep-alive"
            if pings == 3:
                break

    assert pings == 3
    assert simulator.last_request.wait_closed(1) and simulator.last_request.client_closed


def test_multibyte_split_writes_reassemble_byte_exactly(client):
    pieces = []
    with client.stream(
        "POST", "/chat/completions", json=body("multibyte?tps=0&first_token_delay=0")
    ) as response:
        for piece in response.iter_raw():
            pieces.append(piece)
    raw = b"".join(pieces)

    def invalid(piece: bytes) -> bool:
        try:
            piece.decode()
        except UnicodeDecodeError:
            return True
        return False

    assert sum(invalid(piece) for piece in pieces) >= 10  # characters really were cut in half
    assert text_of(chunks_of(raw)) == MULTIBYTE_TEXT
    assert (
        "é" in MULTIBYTE_TEXT
        and "✓" in MULTIBYTE_TEXT
        and "你好" in MULTIBYTE_TEXT
        and "🎉" in MULTIBYTE_TEXT
    )


# Choosing the script


def test_query_options_are_parsed_to_field_types():
    name, script = select(
        "slow?tps=12.5&n=2&usage=false&stall_after=none&text=a%20b&line_ending=crlf", SCENARIOS
    )

    assert name == "slow"
    assert script.tokens_per_second == 12.5 and script.n == 2 and script.usage is False
    assert script.stall_after is None and script.text == "a b" and script.line_ending == "\r\n"
    assert script.first_token_delay == SCENARIOS["slow"].first_token_delay


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("fast?tsp=3", "Unknown simulator option 'tsp'"),
        ("fast?n=two", "Bad value 'two'"),
        ("fast?n=0", ">= 1"),
    ],
    ids=["unknown-option", "bad-int", "invalid-value"],
)
def test_bad_options_answer_400_naming_the_option(client, selector, message):
    with pytest.raises(ScenarioError, match=message):
        select(selector, SCENARIOS)
    response, raw = post_stream(client, selector)

    assert response.status_code == 400
    assert message in json.loads(raw)["error"]["message"]


def test_registered_script_is_selected_by_name_and_takes_options(simulator, client):
    simulator.register(
        "xss", Script(text="<script>alert(1)</script>", tokens_per_second=0, first_token_delay=0)
    )

    _, raw = post_stream(client, "xss")
    _, raw_crlf = post_stream(client, "xss?line_ending=crlf")

    assert text_of(chunks_of(raw)) == "<script>alert(1)</script>"
    assert b"\r\n\r\n" in raw_crlf and text_of(chunks_of(raw_crlf)) == "<script>alert(1)</script>"
    assert [record.scenario for record in simulator.requests] == ["xss", "xss"]
    simulator.reset()
    assert "xss" not in simulator.scenarios


def test_scenario_header_wins_over_the_model(simulator, client):
    response = client.post(
        "/chat/completions",
        json=body("fast"),
        headers={"X-Simulator-Scenario": "http-429?retry_after=3"},
    )

    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    assert simulator.last_request.scenario == "http-429" and simulator.last_request.model == "fast"


def test_unknown_model_gets_the_default_script(simulator, client):
    _, raw = post_stream(client, "gpt-4.1-mini?tps=0&first_token_delay=0")

    assert text_of(chunks_of(raw)) == DEFAULT_TEXT
    assert simulator.last_request.scenario == "default"


def test_models_lists_the_scenarios(simulator, client):
    simulator.register("mine", Script())
    ids = {model["id"] for model in client.get("/models").json()["data"]}

    assert set(SCENARIOS) | {"mine"} == ids


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong-key-123456"}, 401),
        ({"Authorization": "Bearer sk-test-secret-1234"}, 200),
        ({"api-key": "sk-test-secret-1234"}, 200),
    ],
    ids=["missing", "wrong", "bearer", "azure-header"],
)
def test_api_key_is_required_when_configured(headers, status):
    with (
        Simulator(api_key="sk-test-secret-1234") as sim,
        httpx.Client(base_url=sim.base_url) as client,
    ):
        response = client.post("/chat/completions", json=body("fast?text=hi"), headers=headers)
        models = client.get("/models", headers=headers)

        assert response.status_code == models.status_code == status
        if status == 401:
            assert response.json()["error"]["code"] == "invalid_api_key"
            assert response.json()["error"]["type"] == "invalid_request_error"
        recorded = json.dumps(httpx.get(sim.url + "/_simulator/requests").json())
        assert "sk-test-secret-1234" not in recorded and "sk-test-secret-1234" not in repr(sim)
        assert sim.last_request.status == status


def raw_exchange(simulator: Simulator, data: bytes) -> bytes:
    """Send ``data`` on a fresh socket and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", simulator.port), timeout=3) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def raw_request(model: str, version: str = "1.1", extra: str = "") -> bytes:
    payload = json.dumps(body(model)).encode()
    head = (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: x\r\nContent-Length: {len(payload)}\r\n"
    )
    return (head + extra + "\r\n").encode() + payload


def test_pipelined_requests_are_answered_in_order_on_one_connection(simulator):
    data = raw_request("fast?text=first") + raw_request(
        "fast?text=second", extra="Connection: close\r\n"
    )
    received = raw_exchange(simulator, data)

    assert received.count(b"HTTP/1.1 200 OK") == 2
    assert received.index(b'"first"') < received.index(b'"second"')
    assert received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert len({record.connection_id for record in simulator.requests}) == 1


def test_http10_client_gets_a_close_delimited_stream(simulator):
    received = raw_exchange(simulator, raw_request("fast?text=old", version="1.0"))
    head, _, stream = received.partition(b"\r\n\r\n")

    assert b"transfer-encoding" not in head.lower() and b"connection: close" in head
    assert text_of(chunks_of(stream)) == "old" and stream.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"NONSENSE\r\n\r\n", b"400"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: x\r\n\r\n", b"400"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"411"),
        (b"GET /v1/nothing HTTP/1.1\r\nConnection: close\r\n\r\n", b"404"),
    ],
    ids=["bad-request-line", "bad-length", "chunked-body", "unknown-path"],
)
def test_bad_requests_get_an_error_status(simulator, data, status):
    received = raw_exchange(simulator, data)

    assert received.startswith(b"HTTP/1.1 " + status)
    assert simulator.requests == []


# Recording


def test_client_close_after_three_chunks_is_recorded_at_once(simulator, client):
    request = body("default?tps=20&first_token_delay=0")
    seen = 0
    with client.stream("POST", "/chat/completions", json=request) as response:
        for line in response.iter_lines():
            seen += '"content":"' in line and '"content":""' not in line
            if seen == 3:
                break
        closed_by_us = time.monotonic()
    record = simulator.last_request

    assert record.wait_closed(1)
    assert record.client_closed and not record.completed
    assert record.client_closed_at - closed_by_us < 0.5
    assert record.chunks_sent_at_close in (3, 4, 5)
    time.sleep(0.2)  # four more chunks' worth of time
    assert record.chunks_after_close == 0 and record.chunks_sent == record.chunks_sent_at_close
    assert record.first_chunk_at <= record.client_closed_at <= record.finished_at


def test_client_close_during_first_token_delay_is_recorded(simulator, client):
    with client.stream(
        "POST", "/chat/completions", json=body("fast?first_token_delay=5")
    ) as response:
        assert response.status_code == 200
    record = simulator.last_request

    assert record.wait_closed(1) and record.client_closed
    assert record.chunks_sent_at_close == 0 and record.first_chunk_at is None


@pytest.mark.asyncio
async def test_async_client_close_is_recorded_and_awaitable(simulator):
    async with httpx.AsyncClient(base_url=simulator.base_url) as client:
        async with client.stream(
            "POST", "/chat/completions", json=body("slow?first_token_delay=0")
        ) as response:
            async for line in response.aiter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break
        [record] = await simulator.await_for_requests(1)

        assert await record.await_closed(1)
    assert (
        record.client_closed and record.chunks_sent_at_close == 1 and record.chunks_after_close == 0
    )


def test_wait_for_requests_times_out_with_the_count(simulator):
    with pytest.raises(TimeoutError, match="Expected 1 request"):
        simulator.wait_for_requests(1, timeout=0.05)


def test_requests_are_served_from_one_keep_alive_connection(simulator, client):
    post_stream(client, "fast?text=one")
    client.post("/chat/completions", json={"model": "fast?text=two", "messages": HELLO})
    with httpx.Client(base_url=simulator.base_url) as other:
        post_stream(other, "fast?text=three")
    first, second, third = simulator.requests

    assert first.connection_id == second.connection_id != third.connection_id


def test_the_connection_close_is_recorded_also_after_a_whole_response(simulator):
    with httpx.Client(base_url=simulator.base_url) as kept:
        post_stream(kept, "fast?text=one")
        first = simulator.last_request
        assert first.completed and not first.wait_connection_closed(0.1)  # kept alive
        open_until = time.monotonic()  # the client closes its connection as the block ends

    assert first.wait_connection_closed(1) and not first.client_closed
    assert open_until <= first.connection_closed_at <= time.monotonic()
    assert RecordedRequest.from_dict(first.to_dict()).wait_connection_closed(0)


def test_requests_log_is_served_as_json_and_reset_over_http(simulator, client):
    post_stream(client, "fast?text=hi")
    request_id = simulator.last_request.id
    with httpx.Client(base_url=simulator.url) as root:
        log = root.get("/_simulator/requests").json()["requests"]
        reset = root.post("/_simulator/reset")
        after = root.get("/_simulator/requests").json()

    assert [entry["id"] for entry in log] == [request_id]
    entry = log[0]
    assert entry["body"]["model"] == "fast?text=hi" and entry["completed"] is True
    assert entry["headers"]["content-type"] == "application/json"
    assert (
        isinstance(entry["received_monotonic"], float)
        and abs(entry["received_at"] - time.time()) < 5
    )
    assert entry["chunks_after_close"] == 0 and entry["client_closed"] is False
    rebuilt = RecordedRequest.from_dict(entry)
    assert rebuilt.id == request_id and rebuilt.completed and rebuilt.wait_closed(0)
    assert reset.status_code == 200
    assert after == {"requests": []} and simulator.requests == []


@pytest.mark.asyncio
async def test_200_concurrent_streams_all_complete(simulator):
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=simulator.base_url, limits=limits, timeout=10) as client:

        async def one(number: int) -> str:
            request = body(f"default?tps=100&first_token_delay=0&text=stream {number} says hello")
            async with client.stream("POST", "/chat/completions", json=request) as response:
                return text_of(chunks_of(await response.aread()))

        texts = await asyncio.gather(*(one(number) for number in range(200)))

    assert texts == [f"stream {number} says hello" for number in range(200)]
    records = simulator.requests
    assert len(records) == 200 and all(record.completed for record in records)
    assert len({record.connection_id for record in records}) > 150


def test_stop_closes_open_streams_and_the_port():
    sim = Simulator().start()
    client = httpx.Client(base_url=sim.base_url)
    with client.stream(
        "POST", "/chat/completions", json=body("stall?tps=0&first_token_delay=0")
    ) as response:
        lines = response.iter_lines()
        next(lines)
        started = time.monotonic()
        sim.stop()
        stopped = time.monotonic() - started
        with pytest.raises(httpx.HTTPError):
            list(lines)

    assert stopped < 1 and not sim.running
    with pytest.raises(httpx.ConnectError):
        client.get("/models")
    client.close()
    sim.stop()  # idempotent


# Entry points in their own processes


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "chatstream.testing", "--port", "0"],
        [
            "-c",
            "import sys, django; from django.conf import settings;"
            " settings.configure(); django.setup();"
            " from chatstream.management.commands.chatstream_simulator import Command;"
            " Command().run_from_argv(['manage.py', 'chatstream_simulator', *sys.argv[1:]])",
            "--port",
            "0",
        ],
    ],
    ids=["python-m", "manage-command"],
)
def test_entry_points_serve_until_sigterm(command):
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "DJANGO_SETTINGS_MODULE": ""}
    process = subprocess.Popen(
        [sys.executable, "-W", "error", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
    )
    try:
        line = process.stdout.readline()
        base_url = line.split(" listening on ")[1].split()[0]
        response = httpx.post(base_url + "/chat/completions", json=body("fast?text=ok"))
        assert text_of(chunks_of(response.content)) == "ok"
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=5)

    assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
    assert process.returncode == 0 and stderr == ""
