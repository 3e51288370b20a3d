"""The signals a host site receives (``chatstream.signals``), over the real path: the app under
uvicorn, the simulated upstream, a logged-in HTTP client.

``generation_started`` once per claimed generation; ``generation_finished`` exactly once per
generation that reaches a final status, after that status is committed, however it got there;
``quota_refused`` when a limit refuses a message. Receivers, sync or async, never hold the
browser's stream, and one that raises is logged and changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.dispatch import Signal
from django.http import HttpRequest
from django.utils import timezone

from chatstream import stream
from chatstream.domain import reporting
from chatstream.exceptions import QuotaExceeded
from chatstream.models import Conversation, Generation, Message
from chatstream.signals import generation_finished, generation_started, quota_refused
from chatstream.testing import DEFAULT_TEXT

from .conftest import Browser, generation_id
from .signal_hooks import REFUSAL
from .test_resume import Reader, final, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SETTLE = 0.5  # seconds to wait for a second signal that must not come


@dataclass
class Heard:
    """One signal as a receiver got it: the generation as passed, and as stored (read in a
    connection of its own)."""

    signal: str
    generation_id: UUID | None
    status: str  # of the generation passed
    stored: tuple[str, str, str] | None  # (status, error_type, content), read at that moment
    arguments: dict[str, Any] = field(default_factory=dict)


def read_stored(pk: UUID) -> tuple[str, str, str] | None:
    """The row as another connection sees it now: what was committed, nothing else."""
    result: list[tuple[str, str, str] | None] = []

    def read() -> None:
        try:
            row = Generation.objects.filter(pk=pk).first()
            result.append(None if row is None else (row.status, row.error_type, row.content))
        finally:
            connections.close_all()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(10)
    return result[0] if result else None


class Ears:
    """Receivers on the three signals, recording what they hear."""

    def __init__(self) -> None:
        self.heard: list[Heard] = []
        self.lock = threading.Lock()

    def started(self, sender: Any, generation: Generation, **kwargs: Any) -> None:
        self._add(Heard("started", generation.pk, generation.status, None,
                        {"sender": sender, **kwargs}))

    def finished(self, sender: Any, generation: Generation, **kwargs: Any) -> None:
        self._add(Heard("finished", generation.pk, generation.status, read_stored(generation.pk),
                        {"sender": sender, "generation": generation, **kwargs}))

    def refused(self, sender: Any, **kwargs: Any) -> None:
        self._add(Heard("quota_refused", None, "", None, {"sender": sender, **kwargs}))

    def _add(self, heard: Heard) -> None:
        with self.lock:
            self.heard.append(heard)

    def of(self, signal: str, pk: UUID | str | None = None) -> list[Heard]:
        with self.lock:
            return [h for h in self.heard if h.signal == signal
                    and (pk is None or str(h.generation_id) == str(pk))]

    def finished_once(self, pk: UUID | str) -> Heard:
        """The one ``generation_finished`` of ``pk``: waits for it, then for a second one that
        must not come."""
        wait_for(lambda: self.of("finished", pk))
        time.sleep(SETTLE)
        heard = self.of("finished", pk)
        assert len(heard) == 1, heard
        assert heard[0].arguments["sender"] is Generation
        return heard[0]


@contextmanager
def connected(receivers: list[tuple[Signal, Callable[..., Any]]]) -> Iterator[None]:
    for signal, receiver in receivers:
        signal.connect(receiver, sender=Generation, weak=False)
    try:
        yield
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver, sender=Generation)


@pytest.fixture
def ears() -> Iterator[Ears]:
    ears = Ears()
    with connected([(generation_started, ears.started), (generation_finished, ears.finished),
                    (quota_refused, ears.refused)]):
        yield ears


@pytest.fixture
def browser(make_user: Callable[..., Any], browser_for: Callable[[Any], Browser]) -> Browser:
    return browser_for(make_user())


def read_to_the_end(browser: Browser, url: str) -> list[tuple[str, str]]:
    """(event, data) of a whole stream."""
    from chatstream.sse import SSEDecoder

    decoder = SSEDecoder()
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200
        events = [e for chunk in response.iter_raw() for e in decoder.feed(chunk)]
    return [(e.event, e.data) for e in events]


def live_reply(browser: Browser, model: str) -> tuple[str, Reader]:
    """A reply a page streams, with some text written already: its URL and that page."""
    url = browser.send(browser.new_conversation(), "Hi", model)
    reader = Reader(browser, url)
    reader.start()
    wait_for(lambda: reader.last_id >= 3)
    return url, reader


# --- generation_started ---------------------------------------------------------------------------


def test_started_is_sent_once_with_the_claimed_generation_streaming(browser, ears, use_model):
    url = browser.send(browser.new_conversation(), "Hi", use_model("default?tps=40"))
    events = read_to_the_end(browser, url)
    assert events[-1][0] == "done"
    wait_for(lambda: ears.of("started"))
    ears.finished_once(generation_id(url))
    started = ears.of("started")
    assert len(started) == 1
    assert str(started[0].generation_id) == generation_id(url)
    assert started[0].arguments["sender"] is Generation
    assert started[0].status == Generation.Status.STREAMING  # the claim, not the end


def test_started_is_never_sent_for_a_reply_a_hook_refused(browser, ears, settings, simulator):
    settings.CHATSTREAM_REQUEST_HOOKS = ["tests.signal_hooks.refuse"]
    response = browser.post(browser.new_conversation() + "messages/",
                            {"content": "Hi", "model": "fast"})
    assert response.status_code == 200 and REFUSAL in response.text
    generation = Generation.objects.get()
    heard = ears.finished_once(generation.pk)
    assert heard.stored == (Generation.Status.FAILED, "refused", "")
    assert ears.of("started") == [] and simulator.requests == []


def test_started_is_never_sent_for_a_reply_refused_at_its_start(browser, ears, settings,
                                                               simulator):
    url = browser.send(browser.new_conversation(), "Hi", "fast")
    settings.CHATSTREAM_MODELS = {"other": {"PROVIDER": "default", "MODEL": "fast"}}
    assert read_to_the_end(browser, url)[-1][0] == "done"
    heard = ears.finished_once(generation_id(url))
    assert heard.stored is not None and heard.stored[0] == Generation.Status.FAILED
    assert ears.of("started") == [] and simulator.requests == []


# --- generation_finished, once per way a generation ends ------------------------------------------


def test_finished_is_sent_once_a_completed_reply_is_committed(browser, ears, simulator):
    url = browser.send(browser.new_conversation(), "Hi", "fast")
    assert read_to_the_end(browser, url)[-1][0] == "done"
    heard = ears.finished_once(generation_id(url))
    assert heard.status == Generation.Status.COMPLETED
    assert heard.stored == (Generation.Status.COMPLETED, "", DEFAULT_TEXT)
    assert heard.arguments["generation"].content == DEFAULT_TEXT


def test_finished_is_sent_once_for_a_reply_stopped_by_its_page(browser, ears, use_model):
    url, reader = live_reply(browser, use_model("stall"))
    assert browser.post(f"/chat/g/{generation_id(url)}/cancel/").status_code == 204
    reader.join(15)
    assert reader.events[-1].event == "done"
    heard = ears.finished_once(generation_id(url))
    assert heard.stored is not None
    status, error_type, content = heard.stored
    assert (status, error_type) == ("cancelled", "stopped_by_user")
    assert content and DEFAULT_TEXT.startswith(content)  # the partial text, kept


def test_finished_is_sent_once_for_a_reply_whose_browser_left(browser, ears, use_model,
                                                              simulator):
    url = browser.send(browser.new_conversation(), "Hi", use_model("stall"))
    reader = Reader(browser, url, stop_after=3)
    reader.start()
    reader.join(15)
    heard = ears.finished_once(generation_id(url))
    assert heard.stored is not None
    status, error_type, content = heard.stored
    assert (status, error_type) == ("cancelled", "client_disconnected")
    assert content
    assert simulator.last_request.wait_closed(5) and simulator.last_request.client_closed


def test_finished_is_sent_once_for_an_upstream_http_error(browser, ears, use_model):
    url = browser.send(browser.new_conversation(), "Hi", use_model("http-500"))
    assert read_to_the_end(browser, url)[-1][0] == "done"
    heard = ears.finished_once(generation_id(url))
    assert heard.stored is not None
    assert heard.stored[:2] == (Generation.Status.FAILED, "http_500")
    assert len(ears.of("started")) == 1  # it was claimed: the upstream call failed


def test_finished_is_sent_once_for_a_pending_reply_stopped_before_any_stream(browser, ears,
                                                                             simulator):
    url = browser.send(browser.new_conversation(), "Hi", "fast")
    async_to_sync(stream.arequest_stop)(UUID(generation_id(url)))
    heard = ears.finished_once(generation_id(url))
    assert heard.stored == (Generation.Status.CANCELLED, "stopped_by_user", "")
    assert ears.of("started") == [] and simulator.requests == []


def test_finished_is_sent_once_for_each_generation_the_sweeper_closes(browser, ears):
    stale_url = browser.send(browser.new_conversation(), "Hi", "fast")
    pending_url = browser.send(browser.new_conversation(), "Hello", "fast")
    long_ago = timezone.now() - timedelta(days=1)
    Generation.objects.filter(pk=generation_id(stale_url)).update(
        status=Generation.Status.STREAMING, started_at=long_ago, heartbeat_at=long_ago,
        content="Half a rep")
    Generation.objects.filter(pk=generation_id(pending_url)).update(created_at=long_ago)
    assert stream.sweep() == {"interrupted": 1, "abandoned": 1, "expired": 0, "lost": 0}
    assert stream.sweep() == {"interrupted": 0, "abandoned": 0, "expired": 0, "lost": 0}
    interrupted = ears.finished_once(generation_id(stale_url))
    assert interrupted.stored == (Generation.Status.INTERRUPTED, "worker_lost", "Half a rep")
    abandoned = ears.finished_once(generation_id(pending_url))
    assert abandoned.stored == (Generation.Status.CANCELLED, "abandoned", "")


def test_each_of_many_replies_is_finished_once(browser, ears):
    urls = [browser.send(browser.new_conversation(), f"Hi {n}", "fast") for n in range(3)]
    for url in urls:
        assert read_to_the_end(browser, url)[-1][0] == "done"
    for url in urls:
        assert ears.finished_once(generation_id(url)).stored is not None
    assert len(ears.of("finished")) == 3 and len(ears.of("started")) == 3


# --- receivers: sync and async, failing, slow -----------------------------------------------------


def test_sync_and_async_receivers_both_run(browser):
    heard: dict[str, list[str]] = {"sync": [], "async": []}

    def sync_receiver(sender: Any, generation: Generation, **kwargs: Any) -> None:
        heard["sync"].append(generation.status)

    async def async_receiver(sender: Any, generation: Generation, **kwargs: Any) -> None:
        await asyncio.sleep(0)
        heard["async"].append(generation.status)

    with connected([(generation_started, sync_receiver), (generation_started, async_receiver),
                        (generation_finished, sync_receiver),
                        (generation_finished, async_receiver)]):
        url = browser.send(browser.new_conversation(), "Hi", "fast")
        assert read_to_the_end(browser, url)[-1][0] == "done"
        wait_for(lambda: len(heard["sync"]) == len(heard["async"]) == 2)
    assert sorted(heard["sync"]) == sorted(heard["async"])
    assert "completed" in heard["sync"] and "completed" in heard["async"]


def test_a_receiver_that_raises_is_logged_without_its_words_and_changes_nothing(
    browser, ears, caplog
):
    # Its words quote the text it was given: the log line above DEBUG says where it failed.
    def broken(sender: Any, generation: Generation, **kwargs: Any) -> None:
        raise RuntimeError(f"a broken receiver read {generation.prompt_message.content!r}")

    async def broken_async(sender: Any, generation: Generation, **kwargs: Any) -> None:
        raise RuntimeError(f"a broken async receiver read {generation.content!r}")

    # Connected after ``ears``' receivers (the next test has a broken one first).
    receivers = [(generation_started, broken), (generation_finished, broken),
                 (generation_finished, broken_async)]
    with caplog.at_level(logging.DEBUG, logger="chatstream.signals"):
        with connected(receivers):
            url = browser.send(browser.new_conversation(), "Hi violet-harbour", "fast")
            events = read_to_the_end(browser, url)
            heard = ears.finished_once(generation_id(url))
    assert [name for name, _ in events if name not in ("delta", "block")] == ["done"]
    assert "cs-completed" in events[-1][1]
    assert heard.stored == (Generation.Status.COMPLETED, "", DEFAULT_TEXT)
    assert len(ears.of("started")) == 1
    formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
    failures = [formatter.format(r) for r in caplog.records
                if r.name == "chatstream.signals" and r.levelno >= logging.ERROR]
    assert len(failures) == 3
    assert all("RuntimeError" in line and "Traceback" in line for line in failures)
    logged = "\n".join(failures)
    assert "violet-harbour" not in logged and DEFAULT_TEXT[:20] not in logged
    assert {str(r.exc_info[1]).split(" read ")[0] for r in caplog.records
            if r.levelno == logging.DEBUG and r.exc_info} == {
        "a broken receiver", "a broken async receiver"}


def test_receivers_that_raise_before_the_others_do_not_stop_them(browser, caplog):
    heard: list[str] = []

    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("first, and broken")

    def after(sender: Any, generation: Generation, **kwargs: Any) -> None:
        heard.append(generation.status)

    with caplog.at_level(logging.ERROR, logger="chatstream.signals"):
        with connected([(generation_finished, broken), (generation_finished, after)]):
            url = browser.send(browser.new_conversation(), "Hi", "fast")
            assert read_to_the_end(browser, url)[-1][0] == "done"
            # The failure is logged once every receiver has run: after ``after``.
            wait_for(lambda: heard and any(r.name == "chatstream.signals"
                                           for r in caplog.records))
    assert heard == ["completed"]


def test_slow_receivers_never_delay_the_browsers_done(browser):
    ended = {"sync started": threading.Event(), "sync finished": threading.Event(),
             "async finished": threading.Event()}

    def slow(name: str) -> Callable[..., None]:
        def receiver(sender: Any, **kwargs: Any) -> None:
            time.sleep(3)
            ended[name].set()

        return receiver

    async def slow_async(sender: Any, **kwargs: Any) -> None:
        await asyncio.sleep(3)
        ended["async finished"].set()

    receivers = [(generation_started, slow("sync started")),
                 (generation_finished, slow("sync finished")),
                 (generation_finished, slow_async)]
    with connected(receivers):
        url = browser.send(browser.new_conversation(), "Hi", "fast")
        events = read_to_the_end(browser, url)
        # The whole stream, done included, came while every receiver was still at work.
        running = {name for name, event in ended.items() if not event.is_set()}
        assert events[-1][0] == "done" and "cs-completed" in events[-1][1]
        assert running == set(ended)
        for event in ended.values():
            assert event.wait(15)
    assert Generation.objects.get().status == Generation.Status.COMPLETED


async def test_waiting_for_the_signals_returns_when_the_last_has_just_ended():
    """``chatstream.api.run`` waits for its loop's signals before the loop ends. A signal's
    task that has ended is forgotten by a callback the loop runs a moment later: a wait that
    begins in between still returns (it once spun forever, never letting that callback run)."""
    with connected([(generation_started, lambda sender, **kwargs: None)]):
        reporting.started(Generation())
        loop = asyncio.get_running_loop()
        (task,) = [each for each in reporting._sending if each.get_loop() is loop]
        # One loop step at a time: the first step that finds the task done comes before the
        # step that runs its done callbacks.
        while not task.done():  # noqa: ASYNC110
            await asyncio.sleep(0)
        assert task in reporting._sending  # ended, not yet forgotten
        rescued: list[bool] = []

        def rescue() -> None:  # only ever needed by a wait that spins
            rescued.append(True)
            reporting._sending.discard(task)

        timer = threading.Timer(10, rescue)
        timer.start()
        try:
            await reporting.sent()
        finally:
            timer.cancel()
        assert not rescued


# --- quota_refused --------------------------------------------------------------------------------


def test_quota_refused_names_the_user_the_refusal_and_the_request(browser, ears, settings,
                                                                  simulator):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 10}  # less than any message costs
    conversation = browser.new_conversation()
    response = browser.post(conversation + "messages/", {"content": "Hi", "model": "fast"})
    assert response.status_code == 429
    heard = ears.of("quota_refused")
    assert len(heard) == 1
    arguments = heard[0].arguments
    assert arguments["sender"] is Generation
    assert arguments["user"].pk == browser.user.pk
    refusal = arguments["refusal"]
    assert isinstance(refusal, QuotaExceeded) and refusal.limit == "tokens_per_day"
    assert refusal.message in response.content.decode()
    request = arguments["request"]
    assert isinstance(request, HttpRequest) and request.method == "POST"
    # Nothing of the refused message was kept, nothing was sent, nothing else was signalled.
    assert Message.objects.count() == 0 and Generation.objects.count() == 0
    assert Conversation.objects.count() == 1  # the one the page made before
    assert simulator.requests == []
    assert ears.of("started") == [] and ears.of("finished") == []


def test_no_quota_refused_for_a_message_that_is_admitted(browser, ears, settings):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 100_000}
    url = browser.send(browser.new_conversation(), "Hi", "fast")
    assert read_to_the_end(browser, url)[-1][0] == "done"
    final(url)
    ears.finished_once(generation_id(url))
    assert ears.of("quota_refused") == []
