"""Streams that survive the network: `delta` ids, resuming by ``Last-Event-ID`` or ``?after=``,
and what a browser leaving does in each mode (``CHATSTREAM_ON_DISCONNECT``,
``CHATSTREAM_RECONNECT_GRACE``).

Over real HTTP: the app under uvicorn, the simulated upstream on loopback, and, across
processes, two uvicorn servers sharing the database (and Redis, or not).
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatstream.models import Generation
from chatstream.sse import ServerSentEvent, SSEDecoder
from chatstream.stream import Sent
from chatstream.testing import DEFAULT_TEXT

from .conftest import Browser, generation_id
from .workers import DATABASES, Workers

REDIS_URL = "redis://127.0.0.1:6379/0"


def as_sent(text: str) -> str:
    """A reply's text as a stream sends it: line ends as LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def session_url(url: str) -> str:
    """The stream URL without its ticket (what a page reconnects to)."""
    return url.split("?")[0]


def stream_path(generation: Generation) -> str:
    from django.urls import reverse

    return reverse("chatstream:generation-stream", args=[generation.pk])


def text_of(events: list[ServerSentEvent]) -> str:
    return html.unescape("".join(e.data for e in events if e.event == "delta"))


class Reader(threading.Thread):
    """One connection to a stream, read in the background; ``stop_after`` characters and it
    closes (a browser gone), else it reads to the end."""

    def __init__(self, browser: Browser, url: str, *, headers: dict[str, str] | None = None,
                 stop_after: int | None = None) -> None:
        super().__init__(daemon=True)
        self.browser, self.url, self.headers, self.stop_after = browser, url, headers, stop_after
        self.events: list[ServerSentEvent] = []
        self.status = 0
        self.closed_at = 0.0
        self.reached = threading.Event()

    def run(self) -> None:
        decoder = SSEDecoder()
        with self.browser.client.stream("GET", self.url, headers=self.headers) as response:
            self.status = response.status_code
            for chunk in response.iter_raw():
                self.events += decoder.feed(chunk)
                if self.stop_after is not None and self.last_id >= self.stop_after:
                    self.reached.set()
                    break
        self.closed_at = time.monotonic()
        self.reached.set()

    @property
    def last_id(self) -> int:
        ids = [int(e.id) for e in self.events if e.event == "delta"]
        return ids[-1] if ids else 0

    @property
    def text(self) -> str:
        return text_of(self.events)


def read(browser: Browser, url: str, **headers: str) -> tuple[int, list[ServerSentEvent]]:
    response = browser.client.get(url, headers=headers)
    decoder = SSEDecoder()
    return response.status_code, decoder.feed(response.content) + decoder.close()


def finished(browser: Browser, model: str) -> Generation:
    url = browser.send(browser.new_conversation(), "Hi", model)
    status, events = read(browser, url)
    assert status == 200 and events[-1].event == "done"
    return Generation.objects.get(pk=generation_id(url))


def wait_for(condition: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def final(url: str) -> Generation:
    wait_for(lambda: not Generation.objects.get(pk=generation_id(url)).is_live)
    return Generation.objects.get(pk=generation_id(url))


def left_after(browser: Browser, model: str, characters: int) -> tuple[str, Reader]:
    """A reply started by a page that reads ``characters`` of it, then goes away: its stream
    URL, and that page's reader."""
    url = browser.send(browser.new_conversation(), "Hi", model)
    starter = Reader(browser, url, stop_after=characters)
    starter.start()
    starter.join(15)
    return url, starter


# --- ids ------------------------------------------------------------------------------------------

@given(st.lists(st.text(alphabet="ab\r\n", max_size=6), max_size=12), st.data())
def test_sent_counts_the_text_as_sent_whatever_its_pieces(pieces, data):
    text = "".join(pieces)
    sent = Sent()
    out = "".join(sent.piece(piece) for piece in pieces)
    assert out == as_sent(text) and sent.count == len(out) and sent.raw == len(text)
    # A client that has any prefix of it gets exactly the rest.
    have = data.draw(st.integers(0, len(out)))
    resumed = Sent.at(text, have)
    assert resumed is not None and resumed.rest(text) == out[have:]
    assert Sent.at(text, len(out) + 1) is None


@pytest.mark.django_db(transaction=True)
def test_every_delta_carries_the_count_of_characters_sent_so_far(make_user, browser_for,
                                                                 simulator, use_model):
    text = "Line one\r\nline two\rthree <b>&amp;</b>\r\n\r\nend \U0001f389"
    model = use_model(f"default?tps=200&first_token_delay=0&text={quote(text)}")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    status, events = read(browser, url)
    deltas = [e for e in events if e.event == "delta"]
    assert status == 200 and len(deltas) >= 2
    seen = ""
    for event in deltas:
        seen += html.unescape(event.data)
        assert event.id == str(len(seen))  # characters, not bytes: the emoji counts one
    assert Generation.objects.get().content == text  # as the provider sent it
    assert seen == as_sent(text)


# --- resuming -------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["Last-Event-ID", "after"])
def test_a_finished_reply_resumes_after_the_characters_the_client_has(
        make_user, browser_for, simulator, use_model, how):
    browser = browser_for(make_user())
    generation = finished(browser, use_model("fast"))
    url = stream_path(generation)
    whole = as_sent(generation.content)
    for have in (0, 1, 57, len(whole) - 1, len(whole)):
        if how == "after":
            status, events = read(browser, f"{url}?after={have}")
        else:
            status, events = read(browser, url, **{"Last-Event-ID": str(have)})
        assert status == 200 and events[-1].event == "done"
        assert text_of(events) == whole[have:]
        ids = [int(e.id) for e in events if e.event == "delta"]
        assert all(i > have for i in ids) and (not ids or ids[-1] == len(whole))
    # The header wins over the query: it is what the browser knows last.
    status, events = read(browser, f"{url}?after=3", **{"Last-Event-ID": "10"})
    assert text_of(events) == whole[10:]
    assert len(simulator.requests) == 1  # never a second upstream call


@pytest.mark.django_db(transaction=True)
def test_a_client_claiming_more_than_a_finished_reply_has_gets_its_final_message_only(
        make_user, browser_for, simulator, use_model):
    browser = browser_for(make_user())
    generation = finished(browser, use_model("fast"))
    url = stream_path(generation)
    status, events = read(browser, f"{url}?after={len(generation.content) + 1}")
    assert status == 200 and [e.event for e in events] == ["done"]
    assert "cs-completed" in events[0].data  # the reply whole, to replace what is shown


@pytest.mark.django_db(transaction=True)
def test_a_client_claiming_text_of_a_reply_not_started_gets_it_from_nothing(
        make_user, browser_for, simulator, use_model):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", use_model("fast"))
    status, events = read(browser, f"{session_url(url)}?after=5")
    assert status == 200
    assert (events[0].event, events[0].data, events[0].id) == ("reset", "", "0")
    assert text_of(events) == DEFAULT_TEXT and events[-1].event == "done"
    assert len(simulator.requests) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("value", ["abc", "-1", "1e3", "+5", "1" * 19, "٣"])
def test_a_resume_point_that_is_not_a_whole_number_is_refused(
        make_user, browser_for, simulator, use_model, value):
    browser = browser_for(make_user())
    generation = finished(browser, use_model("fast"))
    url = stream_path(generation)
    responses = [browser.client.get(url, params={"after": value})]
    if value.isascii():
        responses.append(browser.client.get(url, headers={"Last-Event-ID": value}))
    for response in responses:
        assert response.status_code == 400
        assert "whole number" in response.text


@pytest.mark.django_db(transaction=True)
def test_resuming_someone_elses_reply_is_a_404(make_user, browser_for, simulator, use_model):
    generation = finished(browser_for(make_user()), use_model("fast"))
    other = browser_for(make_user("bob"))
    response = other.client.get(stream_path(generation), params={"after": 3})
    assert response.status_code == 404
    assert generation.content[3:20] not in response.text


@pytest.mark.django_db(transaction=True)
def test_a_live_reply_resumes_from_memory_with_no_character_twice(
        make_user, browser_for, simulator, use_model):
    model = use_model("default?tps=40")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    starter = Reader(browser, url)
    starter.start()
    wait_for(lambda: starter.last_id >= 40)
    have = starter.last_id
    # A page reconnects as EventSource does: the same URL, and the last id it got.
    resumed = Reader(browser, url, headers={"Last-Event-ID": str(have)})
    resumed.start()
    for reader in (starter, resumed):
        reader.join(30)
        assert reader.events[-1].event == "done"
    generation = final(url)
    assert generation.status == "completed"
    assert starter.text[:have] + resumed.text == generation.content == DEFAULT_TEXT
    assert starter.text == DEFAULT_TEXT
    assert len(simulator.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_a_live_reply_claimed_beyond_its_text_is_sent_whole_first(
        make_user, browser_for, simulator, use_model):
    model = use_model("stall")  # three pieces, then silence
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    starter = Reader(browser, url)
    starter.start()
    wait_for(lambda: len(starter.text) >= 3 and Generation.objects.get().status == "streaming")
    time.sleep(0.3)  # the three pieces are all in
    response_events: list[ServerSentEvent] = []
    decoder = SSEDecoder()
    with browser.client.stream("GET", session_url(url), params={"after": 10_000}) as response:
        for chunk in response.iter_raw():
            response_events += decoder.feed(chunk)
            if response_events:
                break
    first = response_events[0]
    assert first.event == "reset"
    assert html.unescape(first.data) == starter.text and first.id == str(len(starter.text))
    assert browser.post(f"/chat/g/{generation_id(url)}/cancel/").status_code == 204
    starter.join(15)
    assert len(simulator.requests) == 1


# --- what a browser leaving does ------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_detach_mode_finishes_a_reply_nobody_watches_and_counts_it(
        make_user, browser_for, simulator, use_model, settings):
    settings.CHATSTREAM_ON_DISCONNECT = "detach"
    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 100_000, "CONCURRENT_STREAMS": 3}
    model = use_model("default?tps=60")
    user = make_user()
    browser = browser_for(user)
    url, _starter = left_after(browser, model, 20)
    from chatstream import quota

    assert quota.usage(user).live == 1  # still being written, for nobody
    generation = final(url)
    assert generation.status == "completed" and generation.content == DEFAULT_TEXT
    record = simulator.last_request
    assert record.wait_closed(5) and not record.client_closed  # read to its end
    assert generation.usage_source == "provider" and generation.completion_tokens
    usage = quota.usage(user)
    assert usage.live == 0 and usage.tokens_day >= generation.completion_tokens
    # A page coming back shows the reply whole.
    status, events = read(browser, session_url(url))
    assert status == 200 and text_of(events) == DEFAULT_TEXT


@pytest.mark.django_db(transaction=True)
def test_stop_stops_a_detached_reply(make_user, browser_for, simulator, use_model, settings):
    settings.CHATSTREAM_ON_DISCONNECT = "detach"
    model = use_model("stall")
    browser = browser_for(make_user())
    url, _starter = left_after(browser, model, 3)
    time.sleep(0.3)
    assert Generation.objects.get().status == "streaming"  # gone on without its page
    stopped_at = time.monotonic()
    assert browser.post(f"/chat/g/{generation_id(url)}/cancel/").status_code == 204
    generation = final(url)
    assert (generation.status, generation.error_type) == ("cancelled", "stopped_by_user")
    record = simulator.last_request
    assert record.wait_closed(5) and record.client_closed
    assert record.client_closed_at - stopped_at < 2.0
    assert generation.content


@pytest.mark.django_db(transaction=True)
def test_a_detached_reply_is_bounded_by_max_duration(make_user, browser_for, simulator,
                                                     use_model, settings):
    settings.CHATSTREAM_ON_DISCONNECT = "detach"
    settings.CHATSTREAM_MAX_DURATION = 1.5
    model = use_model("stall")
    browser = browser_for(make_user())
    url, _starter = left_after(browser, model, 3)
    generation = final(url)
    assert (generation.status, generation.error_type) == ("interrupted", "deadline")
    assert simulator.last_request.wait_closed(5) and simulator.last_request.client_closed


@pytest.mark.django_db(transaction=True)
def test_abort_mode_waits_the_reconnect_grace_then_closes_the_upstream(
        make_user, browser_for, simulator, use_model, settings):
    settings.CHATSTREAM_RECONNECT_GRACE = 1.0
    model = use_model("stall")
    browser = browser_for(make_user())
    url, starter = left_after(browser, model, 3)
    record = simulator.last_request
    assert record.wait_closed(10) and record.client_closed
    waited = record.client_closed_at - starter.closed_at
    assert 1.0 <= waited < 2.0, waited  # the grace, then at once
    generation = final(url)
    assert (generation.status, generation.error_type) == ("cancelled", "client_disconnected")
    assert generation.content


@pytest.mark.django_db(transaction=True)
def test_abort_mode_keeps_a_reply_whose_page_comes_back_within_the_grace(
        make_user, browser_for, simulator, use_model, settings):
    settings.CHATSTREAM_RECONNECT_GRACE = 5.0
    model = use_model("default?tps=40")
    browser = browser_for(make_user())
    url, starter = left_after(browser, model, 30)
    have = starter.last_id
    time.sleep(1.0)  # a blip
    resumed = Reader(browser, f"{session_url(url)}?after={have}")
    resumed.start()
    resumed.join(30)
    generation = final(url)
    assert generation.status == "completed"
    assert starter.text[:have] + resumed.text == DEFAULT_TEXT == generation.content
    assert len(simulator.requests) == 1 and not simulator.last_request.client_closed


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("layer", ["redis", "database-poll"])
def test_a_page_resumes_on_another_process_from_its_checkpoint_then_live(
        make_user, simulator, use_model, require_service, layer):
    """The reconnect lands on another worker, whose database is behind what the page has: it
    waits for the text to reach the page's id, then sends only the rest."""
    from .workers import redis_available

    overrides: dict[str, Any] = {"CHATSTREAM_RECONNECT_GRACE": 10}
    if layer == "redis":
        require_service("Redis", redis_available)
        env = {"REDIS_URL": REDIS_URL}
    else:
        env = {}
        overrides["CHATSTREAM_CHANNEL_LAYER"] = None
    model = use_model("default?tps=40")
    user = make_user()
    with Workers(workers=1, env=env, overrides=overrides) as a, \
            Workers(workers=1, env=env, overrides=overrides) as b:
        streamer, other = Browser(a.url, user), Browser(b.url, user)
        url = streamer.send(streamer.new_conversation(), "Hi", model)
        starter = Reader(streamer, url, stop_after=30)
        starter.start()
        starter.join(15)
        have = starter.last_id
        resumed = Reader(other, session_url(url), headers={"Last-Event-ID": str(have)})
        resumed.start()
        resumed.join(30)
        streamer.close()
        other.close()
    generation = final(url)
    assert generation.status == "completed"
    assert [e.event for e in resumed.events if e.event not in ("delta", "block")] == ["done"]
    assert starter.text[:have] + resumed.text == DEFAULT_TEXT == generation.content
    assert len(simulator.requests) == 1
