"""chatstream.completions: provider-shaped streams end to end (SSEDecoder, then the accumulator),
then the accumulation rules one by one.

The fixtures under fixtures/streams/ are hand-written in the shapes real providers send, each
named after the provider (or proxy) whose quirk it shows.
"""

from __future__ import annotations

import itertools
import json
import sys
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from chatstream.completions import (
    ENTRY_SIZE,
    META_LENGTH,
    SHORT_LENGTH,
    ChatCompletionAccumulator,
    ToolCall,
)
from chatstream.exceptions import MalformedChunkError, UpstreamError, UpstreamStreamError
from chatstream.sse import SSEDecoder
from chatstream.stream import _bounds

STREAMS = Path(__file__).parent / "fixtures" / "streams"

read_sizes = pytest.mark.parametrize(
    "read_size", [None, 1, 7, 100], ids=["whole", "1-byte", "7-byte", "100-byte"]
)


@dataclass
class Replay:
    acc: ChatCompletionAccumulator
    deltas: list[str] = field(
        default_factory=list
    )  # what feed() returned, one per event (the browser's share)
    error: Exception | None = None


def replay(name: str, read_size: int | None = None) -> Replay:
    """Feed a capture through decoder and accumulator as the lifecycle does, to the first error."""
    stream = (STREAMS / name).read_bytes()
    size = read_size or len(stream)
    decoder, result = SSEDecoder(), Replay(ChatCompletionAccumulator())
    for start in range(0, len(stream), size):
        for event in decoder.feed(stream[start : start + size]):
            try:
                result.deltas.append(result.acc.feed(event.data, event=event.event))
            except (UpstreamStreamError, MalformedChunkError) as exc:
                result.error = exc
                return result
    decoder.close()
    return result


def chunk(
    delta: dict | None = None, *, index: int = 0, finish_reason: str | None = None, **top: object
) -> str:
    choice: dict = {"index": index, "finish_reason": finish_reason}
    if delta is not None:
        choice["delta"] = delta
    return json.dumps({"object": "chat.completion.chunk", "choices": [choice], **top})


# --- provider streams, end to end ----------------------------------------------------------------


@read_sizes
def test_openai_stream_with_usage_chunk(read_size: int | None) -> None:
    run = replay("openai_usage.sse", read_size)
    choice = run.acc.choices[0]
    assert choice.content == "Héllo, wörld ✓ 你好\n"
    assert (choice.role, choice.finish_reason, choice.refusal, choice.tool_calls) == (
        "assistant",
        "stop",
        "",
        [],
    )
    assert run.acc.usage is not None and run.acc.usage["total_tokens"] == 26
    assert run.acc.done and run.error is None
    assert [d for d in run.deltas if d] == ["Héllo", ", wörld", " ✓ 你好\n"]
    assert len(run.deltas) == 7
    assert (run.acc.id, run.acc.model, run.acc.system_fingerprint) == (
        "chatcmpl-BZq1fX0aYkTQ8mcHZ9j2u0nC",
        "gpt-4.1-2025-04-14",
        "fp_b3f1157249",
    )


@read_sizes
def test_azure_empty_first_chunk_annotation_chunk_and_crlf(read_size: int | None) -> None:
    run = replay("azure_content_filter.sse", read_size)
    assert run.error is None and run.acc.done
    assert run.acc.content == "Azure says hello."
    assert run.acc.finish_reason == "content_filter"
    assert list(run.acc.choices) == [0]
    assert (run.acc.id, run.acc.model) == (
        "chatcmpl-AZ1",
        "gpt-4o-2024-11-20",
    )  # not Azure's empty first values


@read_sizes
def test_openrouter_keepalives_repeated_role_and_error_finish(read_size: int | None) -> None:
    run = replay("openrouter_error.sse", read_size)
    assert isinstance(run.error, UpstreamStreamError)
    assert (run.error.detail, run.error.code) == ("Provider returned error", 502)
    choice = run.acc.choices[0]
    assert choice.content == "Bonjour à tous"
    assert choice.role == "assistant"
    assert choice.finish_reason == "error"  # recorded before raising
    assert not run.acc.done


@read_sizes
def test_ollama_repeated_role_reasoning_and_whole_tool_call(read_size: int | None) -> None:
    run = replay("ollama_tools.sse", read_size)
    choice = run.acc.choices[0]
    assert choice.role == "assistant"
    assert choice.reasoning == "The user wants the weather."
    assert choice.content == ""
    assert choice.tool_calls == [
        ToolCall(0, "call_k1x9vq2m", "function", "get_weather", '{"city":"Zürich"}')
    ]
    assert choice.finish_reason == "tool_calls"
    assert run.acc.usage == {"prompt_tokens": 152, "completion_tokens": 31, "total_tokens": 183}
    assert run.acc.system_fingerprint == "fp_ollama"
    assert run.acc.done


@read_sizes
def test_groq_usage_from_x_groq(read_size: int | None) -> None:
    run = replay("groq_x_groq.sse", read_size)
    assert run.acc.content == "Fast reply."
    assert run.acc.usage is not None
    assert (run.acc.usage["total_tokens"], run.acc.usage["queue_time"]) == (21, 0.00251)
    assert run.acc.finish_reason == "stop" and run.acc.done


@read_sizes
def test_vllm_reasoning_then_error_keeps_what_came_before(read_size: int | None) -> None:
    run = replay("vllm_reasoning_error.sse", read_size)
    assert isinstance(run.error, UpstreamStreamError)
    assert (run.error.detail, run.error.code) == ("CUDA out of memory.", 500)
    choice = run.acc.choices[0]
    assert (
        choice.reasoning == "Let me think step by step."
    )  # both field names read, the doubled one once
    assert choice.content == "The answer"
    assert choice.finish_reason is None


@read_sizes
def test_llamacpp_null_content_in_first_delta(read_size: int | None) -> None:
    run = replay("llamacpp_null_content.sse", read_size)
    assert run.acc.content == "Hi there"
    assert run.acc.choices[0].role == "assistant"
    assert run.acc.usage == {"completion_tokens": 2, "prompt_tokens": 9, "total_tokens": 11}
    assert run.acc.done


@read_sizes
def test_llamacpp_legacy_error_field_is_no_event_and_stream_looks_truncated(
    read_size: int | None,
) -> None:
    run = replay("llamacpp_legacy_error.sse", read_size)
    assert run.error is None
    assert (
        len(run.deltas) == 2
    )  # the "error:" line is an unknown field: nothing is dispatched for it
    assert run.acc.content == "Once"
    assert (run.acc.done, run.acc.finish_reason) == (
        False,
        None,
    )  # the caller sees an incomplete stream


@read_sizes
def test_deepseek_keepalives_and_reasoning_content(read_size: int | None) -> None:
    run = replay("deepseek_reasoning.sse", read_size)
    choice = run.acc.choices[0]
    assert choice.reasoning == "9.11 vs 9.9: compare decimals."
    assert choice.content == "9.9 is larger."
    assert [d for d in run.deltas if d] == [
        "9.9 is larger."
    ]  # reasoning is never forwarded as content
    assert run.acc.usage is not None and run.acc.usage["completion_tokens_details"] == {
        "reasoning_tokens": 35
    }


@read_sizes
def test_gemini_tool_calls_without_index(read_size: int | None) -> None:
    run = replay("gemini_tool_calls.sse", read_size)
    choice = run.acc.choices[0]
    assert choice.tool_calls == [
        ToolCall(0, "function-call-1480", "function", "get_weather", '{"city":"Paris"}'),
        ToolCall(1, "function-call-1481", "function", "get_weather", '{"city":"Tokyo"}'),
    ]
    assert (choice.role, choice.finish_reason) == ("assistant", "stop")


@read_sizes
def test_mistral_content_blocks(read_size: int | None) -> None:
    run = replay("mistral_thinking.sse", read_size)
    choice = run.acc.choices[0]
    assert choice.reasoning == "Count the r's: three."
    assert choice.content == "There are three."
    assert [d for d in run.deltas if d] == ["There are ", "three."]


@read_sizes
def test_two_choices_interleaved(read_size: int | None) -> None:
    run = replay("openai_n2.sse", read_size)
    assert sorted(run.acc.choices) == [0, 1]
    first, second = run.acc.choices[0], run.acc.choices[1]
    assert (first.content, first.finish_reason, first.role) == ("No, no.", "stop", "assistant")
    assert (second.content, second.finish_reason, second.role) == (
        "Yes, yes.",
        "length",
        "assistant",
    )
    assert [d for d in run.deltas if d] == ["No", ", no."]  # only choice 0 is forwarded
    assert run.acc.usage is not None and run.acc.usage["total_tokens"] == 20


@read_sizes
def test_parallel_tool_calls_fragmented(read_size: int | None) -> None:
    run = replay("openai_parallel_tools.sse", read_size)
    choice = run.acc.choices[0]
    assert choice.tool_calls == [
        ToolCall(0, "call_AAA", "function", "get_weather", '{"city": "Paris"}'),
        ToolCall(1, "call_BBB", "function", "get_time", '{"tz": "Asia/Tokyo"}'),
    ]
    assert (choice.content, choice.finish_reason) == ("", "tool_calls")


@read_sizes
def test_refusal(read_size: int | None) -> None:
    run = replay("openai_refusal.sse", read_size)
    choice = run.acc.choices[0]
    assert choice.refusal == "I'm sorry, I can't help with that."
    assert choice.content == ""
    assert all(d == "" for d in run.deltas)


@read_sizes
def test_legacy_function_call_becomes_a_tool_call(read_size: int | None) -> None:
    run = replay("openai_function_call.sse", read_size)
    choice = run.acc.choices[0]
    assert choice.tool_calls == [ToolCall(0, "", "function", "get_weather", '{"city":"Oslo"}')]
    assert choice.finish_reason == "function_call"


@read_sizes
def test_proxy_numbering_every_parallel_call_zero(read_size: int | None) -> None:
    run = replay("proxy_index_zero_tools.sse", read_size)
    assert [(c.index, c.id, c.arguments) for c in run.acc.choices[0].tool_calls] == [
        (0, "call_one", '{"q":"a"}'),
        (1, "call_two", '{"q":"b"}'),
    ]


@read_sizes
def test_openai_mid_stream_error_without_done(read_size: int | None) -> None:
    run = replay("openai_error.sse", read_size)
    assert isinstance(run.error, UpstreamStreamError)
    assert run.error.detail.startswith("The server had an error")
    assert run.error.code == "server_error"  # no code given: the error's type stands in
    assert run.acc.content == "Partial answ"


@pytest.mark.parametrize(
    ("name", "content"),
    [
        pytest.param("kimi_no_space.sse", "月が綺麗ですね", id="data-without-space"),
        pytest.param("starlette_crlf_ping.sse", "Ping\npong", id="crlf-with-ping-comments"),
        pytest.param("multiline_data.sse", "multi-line", id="json-over-several-data-lines"),
    ],
)
@read_sizes
def test_framing_variants(name: str, content: str, read_size: int | None) -> None:
    run = replay(name, read_size)
    assert run.error is None and run.acc.done
    assert run.acc.content == content
    assert "".join(run.deltas) == content


@pytest.mark.parametrize("name", sorted(p.name for p in STREAMS.glob("*.sse")))
def test_returned_deltas_add_up_to_choice_zero_content(name: str) -> None:
    run = replay(name, 3)
    assert "".join(run.deltas) == run.acc.content


# --- accumulation rules (chatstream.completions' docstring) ---------------------------------------


def test_role_repeated_on_every_delta_is_set_once() -> None:
    acc = ChatCompletionAccumulator()
    for text in ["a", "b", "c"]:
        acc.feed(chunk({"role": "assistant", "content": text}))
    assert (acc.choices[0].role, acc.content) == ("assistant", "abc")


def test_tool_call_id_and_name_repeated_on_every_fragment_are_set_once() -> None:
    acc = ChatCompletionAccumulator()
    for part in ['{"a"', ": 1}"]:
        acc.feed(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": part},
                        }
                    ]
                }
            )
        )
    assert acc.choices[0].tool_calls == [ToolCall(0, "call_1", "function", "f", '{"a": 1}')]


def test_tool_calls_listed_in_index_order() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(
        chunk({"tool_calls": [{"index": 2, "id": "c", "function": {"name": "h", "arguments": ""}}]})
    )
    acc.feed(
        chunk(
            {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}
        )
    )
    assert [call.id for call in acc.choices[0].tool_calls] == ["a", "c"]


def test_index_less_tool_fragments_without_id_continue_the_last_call() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(
        chunk(
            {
                "tool_calls": [
                    {
                        "id": "g1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x":'},
                    }
                ]
            }
        )
    )
    acc.feed(chunk({"tool_calls": [{"function": {"arguments": " 1}"}}]}))
    acc.feed(
        chunk({"tool_calls": [{"id": "g1", "function": {"arguments": ""}}]})
    )  # same id again: same call
    acc.feed(chunk({"tool_calls": [{"id": "g2", "function": {"name": "g", "arguments": "{}"}}]}))
    assert acc.choices[0].tool_calls == [
        ToolCall(0, "g1", "function", "f", '{"x": 1}'),
        ToolCall(1, "g2", "", "g", "{}"),
    ]


def test_tool_call_object_arguments_are_serialised() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "c",
                        "function": {"name": "f", "arguments": {"city": "Zürich"}},
                    }
                ]
            }
        )
    )
    assert json.loads(acc.choices[0].tool_calls[0].arguments) == {"city": "Zürich"}


def test_tool_call_as_dict_is_the_message_shape() -> None:
    call = ToolCall(0, "call_1", "", "f", "{}")
    assert call.as_dict() == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }
    assert repr(call) == "ToolCall(index=0, id='call_1', type='', name='f', arguments='{}')"


def test_both_choices_in_one_chunk() -> None:
    acc = ChatCompletionAccumulator()
    payload = {
        "choices": [
            {"index": 0, "delta": {"content": "a"}},
            {"index": 1, "delta": {"content": "b"}},
        ]
    }
    assert acc.feed(json.dumps(payload)) == "a"
    assert (acc.choices[0].content, acc.choices[1].content) == ("a", "b")


def test_choice_without_index_takes_its_position() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(json.dumps({"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "b"}}]}))
    assert (acc.choices[0].content, acc.choices[1].content) == ("a", "b")


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({"choices": []}, id="empty-choices"),
        pytest.param({"choices": None}, id="null-choices"),
        pytest.param({}, id="no-choices"),
        pytest.param({"choices": "nonsense"}, id="choices-not-a-list"),
        pytest.param({"choices": ["nonsense", 3]}, id="choice-not-an-object"),
        pytest.param(
            {"choices": [{"index": 0, "content_filter_offsets": {}}]}, id="choice-without-delta"
        ),
        pytest.param({"choices": [{"index": 0, "delta": None}]}, id="null-delta"),
        pytest.param({"choices": [{"index": 0, "delta": "text"}]}, id="delta-not-an-object"),
        pytest.param({"choices": [{"index": 0, "delta": {"content": None}}]}, id="null-content"),
        pytest.param({"choices": [{"index": 0, "delta": {"content": ""}}]}, id="empty-content"),
        pytest.param({"choices": [{"index": 0, "delta": {"content": 42}}]}, id="content-not-text"),
        pytest.param(
            {"choices": [{"index": 0, "delta": {"future_field": {"x": 1}}}], "moderation": {}},
            id="unknown-fields",
        ),
        pytest.param({"error": None, "choices": []}, id="null-error"),
        pytest.param({"error": {}, "choices": []}, id="empty-error-object"),
    ],
)
def test_odd_but_harmless_payloads_are_ignored(payload: dict) -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"content": "kept"}))
    assert acc.feed(json.dumps(payload)) == ""
    assert acc.content == "kept"


def test_unknown_finish_reason_recorded() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({}, finish_reason="insufficient_system_resource"))
    assert acc.finish_reason == "insufficient_system_resource"


def test_later_usage_wins_and_null_usage_does_not_erase_it() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"content": "a"}, usage={"total_tokens": 1}))
    acc.feed(chunk({"content": "b"}, usage={"total_tokens": 2}))
    acc.feed(chunk({"content": "c"}, usage=None))
    assert acc.usage == {"total_tokens": 2}


def test_accumulator_defaults_before_any_chunk() -> None:
    acc = ChatCompletionAccumulator()
    assert (acc.content, acc.finish_reason, acc.usage, acc.done, acc.choices) == (
        "",
        None,
        None,
        False,
        {},
    )
    with pytest.raises(KeyError):
        acc.choices[0]


def test_feed_returns_exactly_the_appended_text() -> None:
    acc = ChatCompletionAccumulator()
    assert acc.feed(chunk({"role": "assistant", "content": ""})) == ""
    assert acc.feed(chunk({"content": "Hé"})) == "Hé"
    assert (
        acc.feed(
            chunk({"content": [{"type": "text", "text": "l"}, {"type": "text", "text": "lo"}]})
        )
        == "llo"
    )
    assert acc.feed(chunk({"reasoning_content": "hmm"})) == ""
    assert acc.feed(chunk({"content": "x"}, index=1)) == ""
    assert acc.content == "Héllo"


def test_content_read_after_every_chunk_stays_right() -> None:
    acc = ChatCompletionAccumulator()
    expected = ""
    for i in range(200):
        expected += acc.feed(chunk({"content": f"{i},"}))
        assert acc.content == expected
    assert acc.content is acc.content  # joined once, then cached


# --- end of stream, errors -----------------------------------------------------------------------


@pytest.mark.parametrize("done", ["[DONE]", " [DONE]", "[DONE]\n", "\t[DONE] "], ids=repr)
def test_done_sentinel(done: str) -> None:
    acc = ChatCompletionAccumulator()
    assert acc.feed(done) == ""
    assert acc.done


def test_everything_after_done_is_ignored() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"content": "a"}))
    acc.feed("[DONE]")
    assert acc.feed(chunk({"content": "b"})) == ""
    assert acc.feed("{not json") == ""
    assert acc.feed('{"error": {"message": "late"}}') == ""
    assert acc.feed("x", event="error") == ""
    assert acc.content == "a"


@pytest.mark.parametrize("payload", ["", "   ", "\n"], ids=["empty", "spaces", "newline"])
def test_blank_payload_is_a_keepalive(payload: str) -> None:
    acc = ChatCompletionAccumulator()
    assert acc.feed(payload) == ""
    assert not acc.done


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        pytest.param("{not json", "not valid JSON", id="invalid-json"),
        pytest.param('{"choices": [', "not valid JSON", id="truncated-json"),
        pytest.param(": OPENROUTER PROCESSING", "not valid JSON", id="comment-wrapped-as-data"),
        pytest.param("[DONE", "not valid JSON", id="near-done"),
        pytest.param("[1, 2]", "not an object", id="array"),
        pytest.param('"text"', "not an object", id="string"),
        pytest.param("42", "not an object", id="number"),
        pytest.param("null", "not an object", id="null"),
    ],
)
def test_malformed_payload_raises_and_keeps_state(payload: str, says: str) -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"content": "kept"}))
    with pytest.raises(MalformedChunkError) as caught:
        acc.feed(payload)
    assert says in caught.value.message
    assert caught.value.data == payload
    assert acc.content == "kept"
    assert acc.feed(chunk({"content": "!"})) == "!"  # still usable


def test_malformed_payload_data_is_truncated() -> None:
    with pytest.raises(MalformedChunkError) as caught:
        ChatCompletionAccumulator().feed("{" + "x" * 1000)
    assert len(caught.value.data) == 200
    assert len(caught.value.message) < 400


@pytest.mark.parametrize(
    ("payload", "message", "code"),
    [
        pytest.param(
            '{"error": {"message": "Overloaded", "type": "overloaded", "code": "overloaded"}}',
            "Overloaded",
            "overloaded",
            id="object",
        ),
        pytest.param(
            '{"error": {"message": "Bad gateway", "code": 502}}',
            "Bad gateway",
            502,
            id="numeric-code",
        ),
        pytest.param(
            '{"error": {"message": "Oops", "type": "server_error"}}',
            "Oops",
            "server_error",
            id="type-as-code",
        ),
        pytest.param(
            '{"error": "model \\"x\\" not found"}',
            'model "x" not found',
            None,
            id="string-ollama-native",
        ),
        pytest.param('{"error": {"code": 7}}', None, 7, id="no-message"),
        pytest.param('{"error": true}', None, None, id="bare-true"),
    ],
)
def test_error_payload_raises_upstream_stream_error(
    payload: str, message: str | None, code: object
) -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"content": "kept"}))
    with pytest.raises(UpstreamStreamError) as caught:
        acc.feed(payload)
    assert caught.value.message.startswith("The provider sent an error in the stream")
    assert caught.value.detail == (message or "")  # the provider's words: never the message
    assert caught.value.code == code
    assert acc.content == "kept" and not acc.done


# What the provider wrote is the reply's (or echoes the prompt): an error's message, stored as the
# reason a reply ended and logged, says what happened without quoting it.
SECRET = "the user wrote violet harbour 7731"


@pytest.mark.parametrize(
    ("payload", "event", "kind"),
    [
        pytest.param(
            '{"choices": [{"delta": {"content": "' + SECRET,
            "message",
            MalformedChunkError,
            id="cut-chunk",
        ),
        pytest.param(json.dumps([SECRET]), "message", MalformedChunkError, id="json-not-object"),
        pytest.param(
            json.dumps({"error": {"message": SECRET, "type": "invalid_request_error"}}),
            "message",
            UpstreamStreamError,
            id="error-object",
        ),
        pytest.param(
            json.dumps({"error": SECRET}), "message", UpstreamStreamError, id="error-string"
        ),
        pytest.param(SECRET, "error", UpstreamStreamError, id="error-event-plain-text"),
        pytest.param(
            json.dumps({"message": SECRET}), "error", UpstreamStreamError, id="error-event-json"
        ),
    ],
)
def test_an_error_s_message_and_repr_never_quote_the_payload(
    payload: str, event: str, kind: type[UpstreamError]
) -> None:
    with pytest.raises(kind) as caught:
        ChatCompletionAccumulator().feed(payload, event=event)
    for shown in (str(caught.value), repr(caught.value), caught.value.message):
        assert "violet harbour" not in shown


@pytest.mark.parametrize(
    ("code", "kept"),
    [
        pytest.param("context_length_exceeded", "context_length_exceeded", id="slug"),
        pytest.param("rate-limit:tokens.v2", "rate-limit:tokens.v2", id="punctuated"),
        pytest.param(429, 429, id="number"),
        pytest.param("Your prompt: " + SECRET, None, id="sentence"),
        pytest.param("x" * 65, None, id="too-long"),
        pytest.param("<b>x</b>", None, id="markup"),
        pytest.param(True, None, id="bool"),
    ],
)
def test_a_provider_error_code_is_kept_only_when_it_looks_like_an_identifier(
    code: object, kept: object
) -> None:
    with pytest.raises(UpstreamStreamError) as caught:
        ChatCompletionAccumulator().feed(json.dumps({"error": {"message": "x", "code": code}}))
    assert caught.value.code == kept
    if kept is not None:
        assert f"({kept})" in caught.value.message


def test_size_counts_every_text_held_in_every_choice_and_every_entry_past_the_first() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"content": "abc"}))
    acc.feed(chunk({"content": "de", "refusal": "no", "reasoning_content": "why"}))
    acc.feed(
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"q":'}}
                ]
            },
            index=1,
        )
    )
    acc.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, index=1))
    acc.feed(
        chunk({"content": [{"type": "text", "text": "xy"}, {"type": "thinking", "thinking": "hm"}]})
    )
    assert acc.choices[0].size == len("abc" + "de" + "no" + "why" + "xy" + "hm")
    assert acc.choices[1].size == len("c1" + "f" + '{"q":1}')
    # Choice 1 and its tool call are entries past the first: each counts ENTRY_SIZE more.
    assert acc.size == acc.choices[0].size + acc.choices[1].size + 2 * ENTRY_SIZE
    assert acc.largest == acc.choices[0].size


def test_error_chunk_with_content_and_finish_reason_records_both_before_raising() -> None:
    acc = ChatCompletionAccumulator()
    with pytest.raises(UpstreamStreamError):
        acc.feed(
            chunk(
                {"content": "last words"},
                finish_reason="error",
                error={"message": "boom", "code": 500},
                usage={"total_tokens": 3},
            )
        )
    assert (acc.content, acc.finish_reason, acc.usage) == (
        "last words",
        "error",
        {"total_tokens": 3},
    )


@pytest.mark.parametrize(
    ("data", "message", "code"),
    [
        pytest.param(
            '{"message": "Overloaded", "code": "overloaded"}',
            "Overloaded",
            "overloaded",
            id="message-field",
        ),
        pytest.param(
            '{"error": {"message": "Rate limited", "type": "rate_limit"}}',
            "Rate limited",
            "rate_limit",
            id="error-object",
        ),
        pytest.param("upstream went away", "upstream went away", None, id="plain-text"),
        pytest.param("", None, None, id="empty"),
        pytest.param('{"detail": "x"}', None, None, id="json-without-message"),
    ],
)
def test_error_event_raises_upstream_stream_error(
    data: str, message: str | None, code: object
) -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(chunk({"content": "kept"}))
    with pytest.raises(UpstreamStreamError) as caught:
        acc.feed(data, event="error")
    if message is not None:
        assert caught.value.detail == message
    assert caught.value.code == code
    assert acc.content == "kept"


def test_error_event_end_to_end() -> None:
    decoder, acc = SSEDecoder(), ChatCompletionAccumulator()
    events = decoder.feed(
        (
            "data: "
            + chunk({"content": "hi"})
            + '\n\nevent: error\ndata: {"message": "Overloaded"}\n\n'
        ).encode()
    )
    assert acc.feed(events[0].data, event=events[0].event) == "hi"
    with pytest.raises(UpstreamStreamError) as caught:
        acc.feed(events[1].data, event=events[1].event)
    assert caught.value.detail == "Overloaded"


def test_id_model_and_fingerprint_keep_the_first_non_empty_value() -> None:
    acc = ChatCompletionAccumulator()
    acc.feed(json.dumps({"id": "", "model": "", "choices": []}))  # Azure's first chunk
    acc.feed(json.dumps({"id": "first", "model": "", "choices": []}))
    acc.feed(
        json.dumps({"id": "second", "model": "m", "system_fingerprint": "fp_1", "choices": []})
    )
    acc.feed(chunk({"content": "x"}, id="third", model="other", system_fingerprint="fp_2"))
    assert (acc.id, acc.model, acc.system_fingerprint) == ("first", "m", "fp_1")


# --- what a hostile stream can make the accumulator hold ------------------------------------------

CAP = 8_000  # the reply cap the run would check size against


def _fragments(shape: str) -> Iterator[str]:
    """Payloads of one hostile shape, for ever: each adds little or no text."""
    for n in itertools.count(1):
        if shape == "one-character deltas":
            yield chunk({"content": "a"})
        elif shape == "one-cjk-character deltas":
            yield chunk({"content": "你"})
        elif shape == "one-character reasoning":
            yield chunk({"reasoning_content": "a"})
        elif shape == "one-character arguments":
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": "a"}}]})
        elif shape == "empty choices":
            yield json.dumps({"choices": [{"index": n}]})
        elif shape == "empty tool calls":
            yield chunk({"tool_calls": [{"index": n}]})
        elif shape == "tool calls sharing an index":
            yield chunk({"tool_calls": [{"index": 0, "id": f"c{n}"}]})
        elif shape == "tool calls without an index":
            yield chunk({"tool_calls": [{"id": f"c{n}", "type": "x" * 1000}]})
        elif shape == "long metadata on empty choices":
            yield json.dumps({"choices": [{"index": n, "delta": {"role": "r" * 1000},
                                           "finish_reason": "f" * 1000}]})


@pytest.mark.parametrize("shape", [
    "one-character deltas", "one-cjk-character deltas", "one-character reasoning",
    "one-character arguments", "empty choices", "empty tool calls",
    "tool calls sharing an index", "tool calls without an index",
    "long metadata on empty choices",
])
def test_a_hostile_stream_is_held_in_a_few_bytes_per_character_of_the_cap(shape: str) -> None:
    """Fed until its size passes the cap (where the run cuts it), whatever it sends, the
    accumulator holds at most 16 bytes per character of the cap: empty choices and tool calls
    count towards the size, and tiny fragments are joined."""
    payloads = _fragments(shape)
    tracemalloc.start()
    try:
        acc = ChatCompletionAccumulator()
        acc.feed(chunk({"role": "assistant", "content": "Hi"}))
        for payload in itertools.islice(payloads, 2 * CAP):  # far more than the cap allows
            acc.feed(payload)
            if acc.size > CAP:
                break
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert acc.size > CAP, "never passed the cap: the run would have read on"
    assert held < 16 * CAP, f"{held / CAP:.1f} bytes per character of the cap"
    choice = acc.choices[0]
    stored = json.dumps([call.as_dict() for call in choice.tool_calls])
    assert len(stored) < 4 * CAP


def _lines_run(count: int) -> int:
    """Python lines run to feed ``count`` new choices, checking the bounds after each as the run
    does after each network read."""
    payloads = [json.dumps({"choices": [{"index": n}]}) for n in range(count)]
    acc = ChatCompletionAccumulator()
    lines = 0

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return trace

    # Whatever traced before goes on after: coverage's tracer, say, which would otherwise stop
    # measuring this thread for the rest of the run.
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        for payload in payloads:
            acc.feed(payload)
            _bounds.past_bounds(acc, 10**9, 10**9, 1)
    finally:
        sys.settrace(previous)
    return lines


def test_the_bounds_are_checked_without_walking_every_choice() -> None:
    """Four times the choices, four times the work (not sixteen): the size is kept as the chunks
    arrive. Counted in Python lines run, which no machine's load changes."""
    small, large = _lines_run(300), _lines_run(1200)
    assert large < 6 * small, (small, large)


def test_what_the_size_does_not_count_is_cut() -> None:
    acc = ChatCompletionAccumulator()
    long = "x" * 10_000
    acc.feed(json.dumps({"id": long, "model": long, "system_fingerprint": long, "choices": [
        {"index": 0, "delta": {"role": long, "tool_calls": [{"index": 0, "type": long}]},
         "finish_reason": long}]}))
    assert len(acc.id) == len(acc.model) == len(acc.system_fingerprint) == META_LENGTH
    choice = acc.choices[0]
    assert len(choice.role) == len(choice.finish_reason) == SHORT_LENGTH
    assert len(choice.tool_calls[0].type) == SHORT_LENGTH


@pytest.mark.parametrize("entries", ["choices", "tool calls"])
def test_one_payload_takes_in_no_entry_past_the_limit(entries: str) -> None:
    """One payload can carry a great many empty entries: with a limit, those past it are not
    taken in (the run, seeing the size past its cap, ends the reply)."""
    many = 50_000
    if entries == "choices":
        payload = json.dumps({"choices": [{"index": n} for n in range(many)]})
    else:
        payload = chunk({"tool_calls": [{"index": n} for n in range(many)]})
    acc = ChatCompletionAccumulator(limit=CAP)
    acc.feed(payload)
    acc.feed(payload.replace('"index": 1', '"index": 10'))  # more of them, later
    held = len(acc.choices) if entries == "choices" else len(acc.choices[0].tool_calls)
    assert CAP < acc.size <= CAP + ENTRY_SIZE and held <= CAP // ENTRY_SIZE + 2
