"""chatstream.sse: the WHATWG "interpreting an event stream" rules, one case each, and the
property that any split of a stream gives the events of the whole stream.

Spec: https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
Cases marked wpt- are adapted from web-platform-tests eventsource/format-*.
"""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatstream.exceptions import EventTooLargeError
from chatstream.sse import ServerSentEvent, SSEDecoder


def E(data: str, event: str = "message", id: str = "", retry: int | None = None) -> ServerSentEvent:
    return ServerSentEvent(event=event, data=data, id=id, retry=retry)


def decode_all(*chunks: bytes, **options: object) -> list[ServerSentEvent]:
    decoder = SSEDecoder(**options)  # type: ignore[arg-type]
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.close()
    return events


def reference(stream: bytes) -> tuple[list[ServerSentEvent], str, int | None]:
    """The spec algorithm transcribed line for line, over the whole stream at once."""
    text = stream.decode("utf-8", errors="replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = re.split("\r\n|\r|\n", text)
    lines.pop()  # whatever follows the last line end is an unfinished line: discarded at EOF
    events: list[ServerSentEvent] = []
    data, event_type, id_buffer, last_event_id = "", "", "", ""
    retry: int | None = None
    event_retry: int | None = None
    for line in lines:
        if line == "":
            last_event_id = id_buffer
            if data:
                events.append(
                    E(
                        data[:-1] if data.endswith("\n") else data,
                        event_type or "message",
                        last_event_id,
                        event_retry,
                    )
                )
            data, event_type, event_retry = "", "", None
            continue
        if line.startswith(":"):
            continue
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            data += value + "\n"
        elif field == "event":
            event_type = value
        elif field == "id":
            if "\0" not in value:
                id_buffer = value
        elif field == "retry":
            if value and all(c in "0123456789" for c in value):
                retry = event_retry = int(value)
    return events, last_event_id, retry


# --- one case per rule ---------------------------------------------------------------------------

RULES = [
    pytest.param([b"\xef\xbb\xbfdata: x\n\n"], [E("x")], id="bom-stripped"),
    pytest.param([b"\xef", b"\xbb", b"\xbfdata: x\n\n"], [E("x")], id="bom-split-across-chunks"),
    pytest.param([b"\xef\xbb\xbf", b"data: x\n\n"], [E("x")], id="bom-alone-in-first-chunk"),
    # wpt-format-bom-2: the second BOM is part of the field name "\ufeffdata", an unknown field.
    pytest.param(
        [b"\xef\xbb\xbf\xef\xbb\xbfdata:1\n\ndata:2\n\ndata:3\n\n"],
        [E("2"), E("3")],
        id="wpt-second-bom-kept",
    ),
    pytest.param([b"data: x\n\n\xef\xbb\xbfdata: y\n\n"], [E("x")], id="bom-after-start-kept"),
    pytest.param([b"data: a\n\n"], [E("a")], id="lf-endings"),
    pytest.param([b"data: a\r\n\r\n"], [E("a")], id="crlf-endings"),
    pytest.param([b"data: a\r\r"], [E("a")], id="cr-endings"),
    pytest.param(
        [b"data: a\r\n\rdata: b\n\r\ndata: c\r\r\n"], [E("a"), E("b"), E("c")], id="mixed-endings"
    ),
    pytest.param([b"data: a\r\ndata: b\r\n\r\n"], [E("a\nb")], id="crlf-is-one-line-end"),
    pytest.param([b"data: a\r", b"\n", b"\r\n"], [E("a")], id="crlf-split-across-chunks"),
    pytest.param([b": hello\ndata: x\n: bye\n\n"], [E("x")], id="comments-ignored"),
    pytest.param([b":\n\n: only comments\n\n"], [], id="comment-only-blocks-dispatch-nothing"),
    pytest.param([b"data\n\n"], [E("")], id="field-without-colon-has-empty-value"),
    pytest.param([b"data:x\n\n"], [E("x")], id="no-space-after-colon"),
    pytest.param([b"data: x\n\n"], [E("x")], id="one-space-removed"),
    pytest.param([b"data:  x\n\n"], [E(" x")], id="only-one-space-removed"),
    pytest.param([b"data:\tx\n\n"], [E("\tx")], id="tab-not-removed"),
    pytest.param([b"data: x \n\n"], [E("x ")], id="trailing-space-kept"),
    pytest.param([b"data: a:b: c\n\n"], [E("a:b: c")], id="colons-in-value-kept"),
    pytest.param(
        [b"data: a\ndata: b\ndata: c\n\n"], [E("a\nb\nc")], id="data-lines-joined-with-lf"
    ),
    pytest.param([b"data:\n\n"], [E("")], id="empty-data-line-dispatches-empty-string"),
    pytest.param([b"data:\ndata:\n\n"], [E("\n")], id="two-empty-data-lines-give-one-lf"),
    pytest.param([b"data: a\ndata:\n\n"], [E("a\n")], id="empty-last-data-line-keeps-lf"),
    # wpt-format-field-data
    pytest.param(
        [b"data:\n\ndata\ndata\n\ndata:test\n\n"], [E(""), E("\n"), E("test")], id="wpt-field-data"
    ),
    pytest.param([b"event: add\ndata: x\n\n"], [E("x", "add")], id="event-sets-type"),
    pytest.param(
        [b"event: add\ndata: x\n\ndata: y\n\n"],
        [E("x", "add"), E("y")],
        id="event-type-reset-after-dispatch",
    ),
    pytest.param(
        [b"event: add\n\ndata: y\n\n"], [E("y")], id="event-type-reset-by-blank-line-without-data"
    ),
    pytest.param([b"event: \ndata:data\n\n"], [E("data")], id="wpt-empty-event-type-is-message"),
    pytest.param([b"event: error\ndata: x\n\n"], [E("x", "error")], id="event-type-error"),
    pytest.param(
        [b"event: \xf0\x9f\x92\xa5 x\ndata: y\n\n"],
        [E("y", "\U0001f4a5 x")],
        id="event-type-any-text",
    ),
    pytest.param([b"event: a\nevent: b\ndata: x\n\n"], [E("x", "b")], id="last-event-field-wins"),
    pytest.param([b"id: 1\ndata: x\n\n"], [E("x", id="1")], id="id-sets-event-id"),
    pytest.param([b"data: x\nid: 1\n\n"], [E("x", id="1")], id="id-after-data-still-applies"),
    pytest.param(
        [b"id: 1\ndata: a\n\ndata: b\n\n"], [E("a", id="1"), E("b", id="1")], id="wpt-id-persists"
    ),
    pytest.param(
        [b"id: 1\ndata: 1\n\nid: 2\ndata:2\n\ndata:3\n\n"],
        [E("1", id="1"), E("2", id="2"), E("3", id="2")],
        id="wpt-id-changes-and-persists",
    ),
    pytest.param(
        [b"id: 1\ndata: 1\n\nid:\ndata:2\n\ndata:3\n\n"],
        [E("1", id="1"), E("2"), E("3")],
        id="wpt-empty-id-resets",
    ),
    pytest.param(
        [b"id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n"],
        [E("a", id="1"), E("b", id="1")],
        id="id-with-null-ignored",
    ),
    pytest.param([b"data: \x00\n\n"], [E("\x00")], id="wpt-null-in-data-kept"),
    pytest.param([b"retry: 1000\ndata: x\n\n"], [E("x", retry=1000)], id="retry-digits"),
    pytest.param(
        [b"retry: 1000\ndata: x\n\ndata: y\n\n"],
        [E("x", retry=1000), E("y")],
        id="retry-only-on-its-own-event",
    ),
    pytest.param([b"retry: 0\ndata: x\n\n"], [E("x", retry=0)], id="retry-zero"),
    pytest.param([b"retry: 007\ndata: x\n\n"], [E("x", retry=7)], id="retry-leading-zeros"),
    pytest.param([b"retry: 10x\ndata: x\n\n"], [E("x")], id="retry-trailing-letter-ignored"),
    pytest.param([b"retry: -1\ndata: x\n\n"], [E("x")], id="retry-negative-ignored"),
    pytest.param([b"retry: +1\ndata: x\n\n"], [E("x")], id="retry-plus-sign-ignored"),
    pytest.param([b"retry: 1.5\ndata: x\n\n"], [E("x")], id="retry-decimal-ignored"),
    pytest.param([b"retry:  10\ndata: x\n\n"], [E("x")], id="retry-second-space-ignored"),
    pytest.param([b"retry: 1_000\ndata: x\n\n"], [E("x")], id="retry-underscore-ignored"),
    pytest.param(
        ["retry: \u0661\u0662\ndata: x\n\n".encode()], [E("x")], id="retry-non-ascii-digits-ignored"
    ),
    pytest.param([b"retry:\ndata: x\n\n"], [E("x")], id="retry-empty-ignored"),
    pytest.param(
        [b"retry: 2000\nretry: 1000x\ndata: x\n\n"],
        [E("x", retry=2000)],
        id="wpt-retry-bogus-keeps-earlier",
    ),
    pytest.param([b"id: 7\n\n"], [], id="id-only-block-dispatches-nothing"),
    pytest.param([b"retry: 5\n\n"], [], id="retry-only-block-dispatches-nothing"),
    pytest.param([b"event: x\n\n"], [], id="event-only-block-dispatches-nothing"),
    pytest.param([b"foo: bar\ndata: x\nbar\n\n"], [E("x")], id="unknown-fields-ignored"),
    pytest.param([b"Data: x\nDATA: y\n\n"], [], id="field-names-case-sensitive"),
    pytest.param([b" data: x\n\n"], [], id="leading-space-makes-another-field"),
    pytest.param([b"data: x\n"], [], id="unterminated-event-discarded"),
    pytest.param([b"data: x"], [], id="unterminated-line-discarded"),
    pytest.param([b"data: a\n\ndata: b\n"], [E("a")], id="only-the-unterminated-event-discarded"),
    pytest.param([b"\n\n\n\ndata: x\n\n\n\n"], [E("x")], id="extra-blank-lines-harmless"),
    pytest.param([b"data: \xff\xfe\n\n"], [E("\ufffd\ufffd")], id="invalid-utf8-replaced"),
    pytest.param(
        [b"data: \xe4\xbd\n\n"], [E("\ufffd")], id="truncated-utf8-before-line-end-replaced"
    ),
    pytest.param([b"data: \xe4\xbd", b"\xa0\n\n"], [E("\u4f60")], id="utf8-split-across-chunks"),
    pytest.param(
        [b"data: \xed\xa0\x80\n\n"], [E("\ufffd\ufffd\ufffd")], id="encoded-surrogate-replaced"
    ),
    pytest.param(
        [
            b"data:1\r:\x00\n:\r\ndata:2\n:"
            + b"x" * 2048
            + b"\rdata:3\n:data:fail\r:"
            + b"x" * 2048
            + b"\ndata:4\n\n"
        ],
        [E("1\n2\n3\n4")],
        id="wpt-comment-fest",
    ),
    pytest.param(
        [b"retry:1000\ndata:test1\n\nid:test\ndata:test2"],
        [E("test1", retry=1000)],
        id="wpt-data-before-final-empty-line",
    ),
]


@pytest.mark.parametrize(("chunks", "expected"), RULES)
def test_rule(chunks: list[bytes], expected: list[ServerSentEvent]) -> None:
    assert decode_all(*chunks) == expected


@pytest.mark.parametrize(("chunks", "expected"), RULES)
def test_rule_byte_at_a_time(chunks: list[bytes], expected: list[ServerSentEvent]) -> None:
    stream = b"".join(chunks)
    assert decode_all(*(stream[i : i + 1] for i in range(len(stream)))) == expected


@pytest.mark.parametrize(("chunks", "expected"), RULES)
def test_rule_agrees_with_reference(chunks: list[bytes], expected: list[ServerSentEvent]) -> None:
    assert reference(b"".join(chunks))[0] == expected


# --- state and timing of dispatch ----------------------------------------------------------------


def test_cr_at_chunk_end_dispatches_immediately() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []
    assert decoder.feed(b"\r") == [E("x")]


def test_lf_after_cr_in_next_chunk_is_not_a_second_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []
    assert decoder.feed(b"\n") == []  # would dispatch if it counted as a blank line
    assert decoder.feed(b"\n") == [E("x")]


def test_lf_after_cr_only_skipped_once() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\r") == []
    assert decoder.feed(b"\n\n") == [E("x")]


def test_blank_line_completes_event_immediately() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x\n") == []
    assert decoder.feed(b"\n") == [E("x")]


def test_last_event_id_updated_by_id_only_block() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"id: 7\n\n") == []
    assert decoder.last_event_id == "7"
    assert decoder.feed(b"data: x\n\n") == [E("x", id="7")]


def test_last_event_id_changes_only_when_a_block_ends() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"id: 7\ndata: x\n")
    assert decoder.last_event_id == ""
    decoder.feed(b"\n")
    assert decoder.last_event_id == "7"


def test_id_of_unterminated_event_not_remembered_at_close() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"id: 1\ndata: a\n\nid: 2\ndata: b\n")
    assert decoder.close() == []
    assert decoder.last_event_id == "1"


def test_retry_only_block_sets_decoder_retry() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"retry: 500\n\n") == []
    assert decoder.retry == 500
    assert decoder.feed(b"data: x\n\n") == [E("x")]
    assert decoder.retry == 500


def test_retry_set_as_soon_as_its_line_is_read() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"retry: 500\n")
    assert decoder.retry == 500


def test_retry_with_too_many_digits_ignored() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"retry: " + b"9" * 5000 + b"\ndata: x\n\n") == [E("x")]
    assert decoder.retry is None


def test_close_discards_pending_then_decoder_starts_a_new_stream() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"id: 3\ndata: a\n\nretry: 9\n\ndata: cut")
    assert decoder.close() == []
    assert decoder.feed(b"\xef\xbb\xbfdata: b\n\n") == [
        E("b", id="3")
    ]  # a reconnection: BOM allowed again
    assert (decoder.last_event_id, decoder.retry) == ("3", 9)


def test_close_discards_a_cut_multibyte_character() -> None:
    decoder = SSEDecoder()
    decoder.feed(b"data: \xe4\xbd")
    assert decoder.close() == []
    assert decoder.feed(b"data: ok\n\n") == [E("ok")]


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([b"data: abc", b"data: x\n\n"], id="after-a-pending-piece"),
        pytest.param([b"data: 1\n\ndata: abc", b"data: x\n\n"], id="after-a-run-of-events"),
        pytest.param([b"data: abc\n", b"data: x\n\n"], id="after-a-complete-line"),
    ],
)
def test_chunk_looking_like_a_whole_event_continues_what_is_pending(chunks: list[bytes]) -> None:
    assert decode_all(*chunks)[-1] == (
        E("abc\nx") if chunks[0].endswith(b"\n") else E("abcdata: x")
    )


def test_empty_chunks_are_harmless() -> None:
    assert decode_all(b"", b"data: x", b"", b"\n", b"", b"\n", b"") == [E("x")]


@pytest.mark.parametrize(
    "text", ["é", "你", "😀", "a你😀é"], ids=["2-byte", "3-byte", "4-byte", "mixed"]
)
def test_multibyte_character_split_at_every_position(text: str) -> None:
    stream = f"event: {text}\ndata: {text}\nid: {text}\n\n".encode()
    expected = [E(text, text, text)]
    for cut in range(len(stream) + 1):
        assert decode_all(stream[:cut], stream[cut:]) == expected, cut
    for first in range(len(stream)):
        for second in range(first, len(stream) + 1):
            assert decode_all(stream[:first], stream[first:second], stream[second:]) == expected


def test_events_are_comparable_and_readable() -> None:
    event = E("x", "add", "1", 5)
    assert event == ServerSentEvent("add", "x", "1", 5)
    assert event != E("x")
    assert repr(event) == "ServerSentEvent(event='add', data='x', id='1', retry=5)"
    assert ServerSentEvent() == E("")


# --- size bound ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(b"data: " + b"x" * 11 + b"\n\n", id="one-line-fast-path"),
        pytest.param(b"event: a\ndata: " + b"x" * 11 + b"\n\n", id="one-line-general-path"),
        pytest.param(b"data: xxxxx\ndata: xxxxx\n\n", id="lines-joined-with-lf"),
        pytest.param(b"data:" + b"x" * 11 + b"\n\n", id="no-space-form"),
    ],
)
def test_event_over_max_size_raises(stream: bytes) -> None:
    with pytest.raises(EventTooLargeError) as caught:
        decode_all(stream, max_event_size=10)
    assert (caught.value.size, caught.value.limit) == (11, 10)


@pytest.mark.parametrize("split", [1, 3, 64], ids=lambda n: f"reads-of-{n}")
def test_event_over_max_size_raises_whatever_the_reads(split: int) -> None:
    stream = b"data: " + b"x" * 100 + b"\n\n"
    with pytest.raises(EventTooLargeError):
        decode_all(
            *(stream[i : i + split] for i in range(0, len(stream), split)), max_event_size=50
        )


def test_pending_line_over_max_size_raises_before_it_ends() -> None:
    decoder = SSEDecoder(max_event_size=10)
    decoder.feed(b"data: xxxx")
    with pytest.raises(EventTooLargeError):
        decoder.feed(b"xxxxxxxxx")


def test_event_of_exactly_max_size_passes() -> None:
    assert decode_all(b"data: " + "é".encode() * 10 + b"\n\n", max_event_size=10) == [E("é" * 10)]
    assert decode_all(b"data: xxxx\ndata: xxxxx\n\n", max_event_size=10) == [E("xxxx\nxxxxx")]


@pytest.mark.parametrize("split", [1, 2, 5], ids=lambda n: f"reads-of-{n}")
def test_pending_line_is_measured_in_characters_not_bytes(split: int) -> None:
    stream = "data: é€😀é€😀é€😀é\n\n".encode()  # a 16-character line of 35 bytes
    assert decode_all(
        *(stream[i : i + split] for i in range(0, len(stream), split)), max_event_size=16
    ) == [E("é€😀é€😀é€😀é")]
    with pytest.raises(EventTooLargeError) as caught:
        decode_all(
            *(stream[i : i + split] for i in range(0, len(stream), split)), max_event_size=15
        )
    assert caught.value.size == 16


def test_max_event_size_none_is_unbounded() -> None:
    data = "x" * (3 * 1024 * 1024)
    assert decode_all(f"data: {data}\n\n".encode(), max_event_size=None) == [E(data)]


def test_huge_event_in_small_reads_is_assembled() -> None:
    # 2 MB in 64-byte reads: pending pieces are kept in a list and joined once (linear).
    data = "0123456789abcdef" * (2 * 1024 * 1024 // 16)
    stream = f"data: {data}\n\n".encode()
    assert decode_all(*(stream[i : i + 64] for i in range(0, len(stream), 64))) == [E(data)]


def test_huge_multiline_event_in_small_reads_is_assembled() -> None:
    stream = b"data: 0123456789\n" * 50_000 + b"\n"
    events = decode_all(*(stream[i : i + 64] for i in range(0, len(stream), 64)))
    assert events == [E("\n".join(["0123456789"] * 50_000))]


# --- split invariance (property tests) -----------------------------------------------------------

VALUE_PIECES = st.characters(
    blacklist_characters="\r\n", blacklist_categories=["Cs"]
) | st.sampled_from([":", " ", "\0", "\ufeff", "é", "你", "😀", "data: ", "\t"])
VALUES = st.lists(VALUE_PIECES, max_size=12).map("".join)
LINES = st.one_of(
    st.tuples(
        st.sampled_from(["data", "event", "id", "retry", "foo", "", "Data"]),
        st.sampled_from([":", ": ", ":  ", ""]),
        VALUES,
    ).map(lambda t: t[0] + t[1] + t[2]),
    st.integers(0, 99999).map(lambda n: f"retry: {n}"),
    st.just(""),
    st.just(""),
)


@st.composite
def streams(draw: st.DrawFn, endings: list[str]) -> bytes:
    lines = draw(st.lists(LINES, max_size=25))
    parts = [line + draw(st.sampled_from(endings)) for line in lines]
    text = "".join(parts) + draw(st.sampled_from(["", "data: unterminated", "\n"]))
    prefix = draw(st.sampled_from([b"", b"\xef\xbb\xbf"]))
    return prefix + text.encode()


@st.composite
def splits(draw: st.DrawFn, stream: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def check_split_invariance(stream: bytes, chunks: list[bytes]) -> None:
    expected, last_event_id, retry = reference(stream)
    decoder = SSEDecoder()
    events: list[ServerSentEvent] = []
    for chunk in chunks:
        events += decoder.feed(chunk)
    events += decoder.close()
    assert events == expected
    assert (decoder.last_event_id, decoder.retry) == (last_event_id, retry)


ENDINGS = {"lf": ["\n"], "crlf": ["\r\n"], "cr": ["\r"], "mixed": ["\n", "\r\n", "\r"]}


@pytest.mark.parametrize("framing", ENDINGS)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_split_gives_the_events_of_the_whole_stream(framing: str, data: st.DataObject) -> None:
    stream = data.draw(streams(ENDINGS[framing]))
    check_split_invariance(stream, data.draw(splits(stream)))


@pytest.mark.parametrize("framing", ENDINGS)
@settings(max_examples=100)
@given(data=st.data())
def test_one_byte_at_a_time_gives_the_events_of_the_whole_stream(
    framing: str, data: st.DataObject
) -> None:
    stream = data.draw(streams(ENDINGS[framing]))
    check_split_invariance(stream, [stream[i : i + 1] for i in range(len(stream))])


@settings(max_examples=300)
@given(data=st.data())
def test_arbitrary_bytes_any_split_matches_reference(data: st.DataObject) -> None:
    # Invalid UTF-8, stray CRs, BOMs anywhere: never an exception, always the reference's events.
    alphabet = st.sampled_from(
        [
            b"\n",
            b"\r",
            b"\r\n",
            b":",
            b" ",
            b"data",
            b"id",
            b"event",
            b"retry",
            b"1",
            b"\xef\xbb\xbf",
            b"\xe4\xbd\xa0",
            b"\xe4",
            b"\xbd",
            b"\xff",
            b"\x00",
            b"x",
        ]
    )
    stream = b"".join(data.draw(st.lists(alphabet, max_size=60)))
    check_split_invariance(stream, data.draw(splits(stream)))


@settings(max_examples=200)
@given(data=st.data())
def test_completion_shaped_streams_any_split(data: st.DataObject) -> None:
    # The decoder's fast path (runs of "data: ...\n\n") mixed with all it must fall back from.
    pieces = st.one_of(
        VALUES.map(lambda v: f"data: {v}\n\n"),
        VALUES.map(lambda v: f"data:{v}\n\n"),
        st.sampled_from(
            [
                ": keep-alive\n\n",
                "id: 5\n",
                "event: x\n",
                "\n",
                "data: [DONE]\n\n",
                "retry: 3\n",
                "data: a\ndata: b\n\n",
            ]
        ),
    )
    stream = "".join(data.draw(st.lists(pieces, max_size=20))).encode()
    check_split_invariance(stream, data.draw(splits(stream)))
