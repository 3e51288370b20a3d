"""How much of a provider's reply is read: the reply cap, the byte cap, a compressed answer,
and ``max_tokens`` held to locally; end to end against the simulator's faults.

Each cut ends the reply honestly: the upstream is closed at once, the text up to the cap is
kept and was all the browser got, the row says ``interrupted`` with its own error type, and
the user reads that the reply was too long.
"""

from __future__ import annotations

import html
import json
import re
import socket
import threading
import tracemalloc
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from chatstream.models import Generation
from chatstream.testing import DEFAULT_TEXT, RecordedRequest, Script, tokenize

from .conftest import API_KEY, Browser, generation_id, read_events

pytestmark = pytest.mark.django_db(transaction=True)

Status = Generation.Status
MiB = 1024 * 1024


def stream(browser: Browser, model: str) -> tuple[Generation, str, list[tuple[str, str]]]:
    """Send "Hi" on ``model`` and read the whole stream: the row, the text the browser got,
    and every (event, data)."""
    url = browser.send(browser.new_conversation(), "Hi", model)
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200
        events = [(name, data) for _at, name, data in read_events(response)]
    assert [name for name, _ in events][-1] == "done"
    shown = html.unescape("".join(data for name, data in events if name == "delta"))
    return Generation.objects.get(pk=generation_id(url)), shown, events


def notice(events: list[tuple[str, str]]) -> str:
    return html.unescape("".join(data for name, data in events if name == "error"))


def use(settings: Any, spec: str, **entry: Any) -> str:
    settings.CHATSTREAM_MODELS = {"test": {"PROVIDER": "default", "MODEL": spec, **entry}}
    return "test"


def assert_cut(generation: Generation, shown: str, events: list[tuple[str, str]],
               error_type: str) -> None:
    assert (generation.status, generation.error_type) == (Status.INTERRUPTED, error_type)
    assert generation.content == shown  # kept, and nothing beyond it reached the browser
    assert "too long" in notice(events) and "cut" in notice(events)
    assert generation.reason and "data:" not in generation.reason


def assert_closed(record: RecordedRequest) -> None:
    """The cut closed the provider's connection (it is never read to its end, nor reused).

    Not that the simulator was still writing by then: on loopback the sockets' buffers take
    megabytes (a whole compressed flood), which it may have written before the cut, and then its
    response is complete and the close comes after it.
    """
    assert record.wait_connection_closed(10)
    assert record.chunks_after_close == 0


# --- the reply's characters -----------------------------------------------------------------------


def test_a_reply_longer_than_the_cap_is_cut_there_and_nothing_beyond_reaches_the_browser(
        make_user, browser_for, simulator, settings):
    settings.CHATSTREAM_MAX_REPLY_LENGTH = 300
    generation, shown, events = stream(browser_for(make_user()), use(settings, "long?tps=0"))
    assert_cut(generation, shown, events, "reply_too_long")
    assert shown == DEFAULT_TEXT[:300]
    assert_closed(simulator.last_request)


def test_a_reply_of_exactly_the_cap_completes(make_user, browser_for, simulator, settings):
    settings.CHATSTREAM_MAX_REPLY_LENGTH = len(DEFAULT_TEXT)
    generation, shown, _ = stream(browser_for(make_user()), use(settings, "fast"))
    assert generation.status == Status.COMPLETED and shown == DEFAULT_TEXT


def test_tool_call_arguments_count_towards_the_reply_cap(make_user, browser_for, simulator,
                                                         settings):
    settings.CHATSTREAM_MAX_REPLY_LENGTH = 500
    simulator.register("big-call", Script(
        text="", tool_calls=(("lookup", json.dumps({"q": "x" * 400_000})),),
        finish_reason="tool_calls", tokens_per_second=0, first_token_delay=0))
    generation, shown, events = stream(browser_for(make_user()), use(settings, "big-call"))
    assert_cut(generation, shown, events, "reply_too_long")
    assert len(generation.tool_calls[0]["arguments"]) < 1000
    assert_closed(simulator.last_request)


@pytest.mark.parametrize("flood_of", ["choices", "tool_calls"],
                         ids=["empty-choices", "empty-tool-calls"])
def test_choices_and_tool_calls_without_text_count_towards_the_reply_cap(
        make_user, browser_for, simulator, settings, flood_of):
    """A new choice or tool call is held (and a tool call stored) though it carries no text:
    each counts towards the cap, so a flood of them is cut there too, and what is stored of the
    tool calls stays within a small multiple of the cap."""
    settings.CHATSTREAM_MAX_REPLY_LENGTH = 20_000  # its byte cap, 5 MB, far above the flood
    model = use(settings, f"fast?flood_after=3&flood_of={flood_of}&flood_bytes={MiB}")
    generation, shown, events = stream(browser_for(make_user()), model)
    assert_cut(generation, shown, events, "reply_too_long")
    assert shown == "".join(tokenize(DEFAULT_TEXT)[:3])  # the text before the flood
    assert len(json.dumps(generation.tool_calls)) < 2 * 20_000
    assert_closed(simulator.last_request)


# --- the provider's bytes, compressed or not ------------------------------------------------------


def test_a_gzip_reply_that_ignored_accept_encoding_is_read_whole(make_user, browser_for,
                                                                 simulator, settings):
    generation, shown, _ = stream(browser_for(make_user()), use(settings, "gzip?tps=0"))
    assert generation.status == Status.COMPLETED and shown == DEFAULT_TEXT
    assert simulator.last_request.headers["accept-encoding"] == "identity"


def test_a_gzip_bomb_is_cut_at_the_reply_cap_with_its_text_kept(make_user, browser_for,
                                                                simulator, settings):
    settings.CHATSTREAM_MAX_REPLY_LENGTH = 2000
    generation, shown, events = stream(
        browser_for(make_user()), use(settings, f"gzip-bomb?tps=0&flood_bytes={64 * MiB}"))
    assert_cut(generation, shown, events, "reply_too_long")
    assert len(shown) == 2000 and shown.startswith("Sure! Here")  # 3 chunks, then the flood
    assert_closed(simulator.last_request)


def test_a_stream_of_framing_without_text_is_cut_at_the_byte_cap(make_user, browser_for,
                                                                 simulator, settings):
    """Text-free chunks cost no characters: the decoded bytes are bounded on their own."""
    settings.CHATSTREAM_MAX_REPLY_LENGTH = 1000
    model = use(settings, f"fast?text=&flood_after=0&flood_bytes={64 * MiB}")
    generation, shown, events = stream(browser_for(make_user()), model)
    assert_cut(generation, shown, events, "reply_too_long")
    assert shown == "" and "bytes" in generation.reason
    assert_closed(simulator.last_request)


def test_a_gzip_bomb_never_inflates_more_than_a_bounded_piece_at_once(make_user, browser_for,
                                                                      simulator, settings):
    """16 MiB of framing in one ~75 KB write of gzip: inflated in bounded pieces, and cut at
    the byte cap.

    The peak counts every thread of this process (the simulator compresses its 1 MiB blocks
    here too); inflating each network read whole (as httpx does) took ~60 MiB.
    """
    settings.CHATSTREAM_MAX_REPLY_LENGTH = 20_000
    model = use(settings, f"gzip-bomb?tps=0&text=&flood_after=0&flood_bytes={16 * MiB}")
    browser = browser_for(make_user())
    tracemalloc.start()
    try:
        generation, shown, events = stream(browser, model)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_cut(generation, shown, events, "reply_too_long")
    assert "bytes" in generation.reason  # cut by the byte cap, 256 x 20,000 bytes in
    assert peak < 12 * MiB, peak


@contextmanager
def answering(head: bytes, body: bytes) -> Iterator[int]:
    """A one-answer HTTP server on a free port: ``head`` (without Content-Length) and ``body``
    to every request."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # a closed listener does not wake a blocked accept()
    response = head + b"content-length: %d\r\n\r\n" % len(body) + body
    stopped = threading.Event()

    def serve() -> None:
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head_in, _, rest = data.partition(b"\r\n\r\n")
                length = re.search(rb"content-length: *(\d+)", head_in, re.IGNORECASE)
                while length and len(rest) < int(length[1]):
                    rest += conn.recv(65536)
                conn.sendall(response)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stopped.set()
        thread.join(5)
        listener.close()


def test_a_content_encoding_other_than_gzip_or_deflate_fails_the_reply_clearly(
        make_user, browser_for, settings):
    event = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\ndata: [DONE]\n\n'
    with answering(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                   b"content-encoding: compress\r\n", event) as port:
        settings.CHATSTREAM_PROVIDERS = {
            "default": {"BASE_URL": f"http://127.0.0.1:{port}/v1", "API_KEY": API_KEY}}
        generation, shown, events = stream(browser_for(make_user()), "fast")
    assert (generation.status, generation.error_type) == (Status.FAILED, "unsupported_encoding")
    assert shown == "" and "compress" in generation.reason
    assert "cannot read" in notice(events)


def test_a_deflate_reply_is_read_whole(make_user, browser_for, settings):
    text = "Deflated, and whole."
    event = ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text},
                                                 "finish_reason": "stop"}]})
             + "\n\ndata: [DONE]\n\n").encode()
    with answering(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                   b"content-encoding: deflate\r\n", zlib.compress(event)) as port:
        settings.CHATSTREAM_PROVIDERS = {
            "default": {"BASE_URL": f"http://127.0.0.1:{port}/v1", "API_KEY": API_KEY}}
        generation, shown, _ = stream(browser_for(make_user()), "fast")
    assert generation.status == Status.COMPLETED and shown == text


# --- max_tokens, held to locally ------------------------------------------------------------------


def test_a_provider_that_never_stops_is_cut_past_max_tokens(make_user, browser_for, simulator,
                                                            settings):
    settings.CHATSTREAM_MAX_DURATION = 5  # today's code: ended by the deadline, not this
    generation, shown, events = stream(
        browser_for(make_user()),
        use(settings, "endless?tps=500&first_token_delay=0", MAX_TOKENS=16))
    assert_cut(generation, shown, events, "max_tokens_exceeded")
    assert 0 < len(shown) < 2 * (16 * 16 + 64)  # checked once per read: a read's more at most
    assert simulator.last_request.body["max_tokens"] == 16
    assert simulator.last_request.wait_closed(2) and simulator.last_request.client_closed


@pytest.mark.parametrize("text", [
    pytest.param(DEFAULT_TEXT, id="english-and-code"),
    pytest.param("你好，世界！这是一个很长的回答。" * 40, id="cjk"),  # noqa: RUF001
    pytest.param(("    " * 8 + "x = 1\n") * 40, id="indented-code"),
])
def test_an_honest_reply_at_max_tokens_is_never_cut(make_user, browser_for, simulator, settings,
                                                    text):
    simulator.register("honest", Script(text=text, tokens_per_second=0, first_token_delay=0))
    generation, shown, _ = stream(browser_for(make_user()), use(settings, "honest",
                                                                MAX_TOKENS=64))
    assert generation.status == Status.COMPLETED, generation.reason
    assert generation.finish_reason == "length" and len(shown) > 64


def test_the_simulator_floods_and_never_ends_as_scripted(simulator):
    """The faults these tests rely on, seen raw."""
    body = {"stream": True, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    url = simulator.base_url + "/chat/completions"
    with httpx.stream("POST", url, json={**body, "model": "gzip-bomb?tps=0&flood_bytes=2000000"},
                      headers={"Accept-Encoding": "identity"}) as response:
        assert response.headers["content-encoding"] == "gzip"
        raw = b"".join(response.iter_raw())
    inflated = zlib.decompress(raw, wbits=31)
    assert len(raw) < 20_000 and 2_000_000 <= len(inflated) < 2_100_000
    assert inflated.endswith(b"data: [DONE]\n\n")
    read = 0
    with httpx.stream("POST", url, json={**body, "model": "endless?tps=0"}) as response:
        for chunk in response.iter_bytes():
            read += len(chunk)
            if read > 200_000:  # far past max_tokens=4, and still going
                break
    assert read > 200_000
