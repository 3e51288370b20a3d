"""Pages that follow a reply another request streams: each gets the whole text once, the
followers of one reply cost what one does, and their number is bounded."""

from __future__ import annotations

import html
import re
import threading
import time
from typing import Any

import pytest

from chatstream.models import Generation
from chatstream.sse import SSEDecoder
from chatstream.store import _orm
from chatstream.web.wire import PageWire

from .conftest import Browser, generation_id, read_events
from .workers import DATABASES, Workers

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

REDIS_URL = "redis://127.0.0.1:6379/0"


def session_url(url: str) -> str:
    """The stream URL a page shows once its reply has started (no ticket)."""
    return url.split("?")[0]


class Follower(threading.Thread):
    """A page following the reply at ``url`` to its end: what it received, and its status."""

    def __init__(self, browser: Browser, url: str) -> None:
        super().__init__(daemon=True)
        self.browser, self.url = browser, url
        self.status = 0
        self.events: list[tuple[str, str]] = []
        self.opened = threading.Event()

    def run(self) -> None:
        with self.browser.client.stream("GET", self.url) as response:
            self.status = response.status_code
            self.opened.set()
            if response.status_code == 200:
                self.events = [(n, d) for _at, n, d in read_events(response)]
            else:
                response.read()

    @property
    def text(self) -> str:
        return html.unescape("".join(d for n, d in self.events if n == "delta"))


def start_streaming(browser: Browser, url: str) -> Follower:
    """The page that starts the reply, reading it in the background; returns once it streams."""
    starter = Follower(browser, url)
    starter.start()
    deadline = time.monotonic() + 10
    while Generation.objects.get(pk=generation_id(url)).status == "pending":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return starter


def counting(monkeypatch: Any, name: str) -> list[int]:
    """Count the calls of the store's ORM function ``name`` (which still runs)."""
    calls: list[int] = []
    real = getattr(_orm, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_orm, name, counted)
    return calls


def test_pages_following_a_reply_of_this_process_read_nothing_from_the_database(
        make_user, browser_for, simulator, use_model, monkeypatch):
    model = use_model("default?tps=20&tokens=50")  # about 2.5 s
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), "Hi", model)
    reads = counting(monkeypatch, "follow")
    starter = start_streaming(browser, url)
    followers = [Follower(browser, session_url(url)) for _ in range(3)]
    for follower in followers:
        follower.start()
    for each in (starter, *followers):
        each.join(30)
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == "completed"
    for follower in followers:
        assert follower.status == 200 and follower.events[-1][0] == "done"
        assert follower.text == generation.content  # every character, once
    assert len(simulator.requests) == 1
    # Polled per page, three pages over 2.5 s read the row a dozen times; fanned out, never.
    assert len(reads) == 0, len(reads)


def test_followers_are_bounded_per_reply_and_per_user(make_user, browser_for, simulator,
                                                      use_model, settings):
    settings.CHATSTREAM_MAX_FOLLOWERS = 2
    settings.CHATSTREAM_MAX_FOLLOWERS_PER_USER = 3
    model = use_model("default?tps=10&tokens=60")
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    first = browser.send(conversation, "One", model)
    starter = start_streaming(browser, first)
    followers = [Follower(browser, session_url(first)) for _ in range(2)]
    for follower in followers:
        follower.start()
        assert follower.opened.wait(10) and follower.status == 200
    refused = browser.client.get(session_url(first))
    assert refused.status_code == 429 and refused.headers["retry-after"]
    assert "too many pages" in refused.text
    # Another reply of the same user: one more follower fits the user's bound, then none.
    second = browser.send(conversation, "Two", model)
    second_starter = start_streaming(browser, second)
    third = Follower(browser, session_url(second))
    third.start()
    assert third.opened.wait(10) and third.status == 200
    assert browser.client.get(session_url(second)).status_code == 429
    # Someone else's followers are theirs to count.
    other = browser_for(make_user("bob"))
    other_url = other.send(other.new_conversation(), "Hi", model)
    other_starter = start_streaming(other, other_url)
    bobs = Follower(other, session_url(other_url))
    bobs.start()
    assert bobs.opened.wait(10) and bobs.status == 200
    for each in (starter, second_starter, other_starter, *followers, third, bobs):
        each.join(30)
    # A place is given back when a follower leaves.
    done = browser.client.get(session_url(first))
    assert done.status_code == 200 and "event: done" in done.text
    assert len(simulator.requests) == 3


@pytest.mark.parametrize("layer", ["redis", "database-poll"])
def test_pages_following_a_reply_streamed_by_another_process_share_their_reads(
        make_user, simulator, use_model, require_service, layer):
    from .workers import redis_available

    if layer == "redis":
        require_service("Redis", redis_available)
        env = {"REDIS_URL": REDIS_URL}
        overrides: dict[str, Any] = {}
    else:
        env, overrides = {}, {"CHATSTREAM_CHANNEL_LAYER": None}
    # Django logs every query when DEBUG is on: the follower's process says what it read.
    overrides |= {"DEBUG": True, "LOGGING": {
        "version": 1, "disable_existing_loggers": False,
        "handlers": {"console": {"class": "logging.StreamHandler"}},
        "loggers": {"django.db.backends": {"handlers": ["console"], "level": "DEBUG"}}}}
    model = use_model("default?tps=20&tokens=60")  # about 3 s
    user = make_user()
    with Workers(workers=1, env=env, overrides=overrides) as a, \
            Workers(workers=1, env=env, overrides=overrides) as b:
        streamer, watcher = Browser(a.url, user), Browser(b.url, user)
        url = streamer.send(streamer.new_conversation(), "Hi", model)
        starter = start_streaming(streamer, url)
        before = b.output()
        followers = [Follower(watcher, session_url(url)) for _ in range(3)]
        for follower in followers:
            follower.start()
        for each in (starter, *followers):
            each.join(30)
        log = b.output()[len(before):]
        streamer.close()
        watcher.close()
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == "completed"
    for follower in followers:
        assert follower.status == 200 and follower.events[-1][0] == "done"
        assert follower.text == generation.content
    assert len(simulator.requests) == 1
    # The reply's row read with its conversation, as a follower reads it: per page and per
    # second when each page polls (~12 here); shared by the three pages, a few in all.
    reads = len(re.findall(r'FROM "chatstream_generation" INNER JOIN', log))
    limit = 4 if layer == "redis" else 8
    assert 1 <= reads <= limit, reads


def streaming_elsewhere(user: Any) -> Generation:
    """A reply stored as streaming ("So far"), which no run of this process streams."""
    from chatstream.models import Conversation, Message

    conversation = Conversation.objects.create(user=user, model="fast")
    message = Message.objects.create(conversation=conversation, role="user", content="Hi")
    return Generation.objects.create(conversation=conversation, user=user,
                                     prompt_message=message, model="fast",
                                     status="streaming", content="So far")


def test_a_follower_dropped_before_its_first_read_gives_its_place_back(make_user, settings):
    """A browser gone before its response started: the body is never iterated, so its
    ``finally`` never runs; the place it took is given back all the same."""
    import asyncio
    import gc

    from asgiref.sync import sync_to_async

    from chatstream.stream import TooManyFollowers, _following

    from .conftest import in_thread

    settings.CHATSTREAM_MAX_FOLLOWERS = 1
    settings.CHATSTREAM_CHANNEL_LAYER = None  # the feed reads the database every 0.1 s
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = settings.CHATSTREAM_STOP_POLL_INTERVAL = 0.1
    user = make_user()
    generation = streaming_elsewhere(user)

    async def scenario() -> list[bytes]:
        body = _following.admit(generation.pk, user.pk, PageWire(str))
        with pytest.raises(TooManyFollowers):
            _following.admit(generation.pk, user.pk, PageWire(str))
        del body
        gc.collect()
        again = _following.admit(generation.pk, user.pk, PageWire(str))
        first = await anext(again)
        await sync_to_async(Generation.objects.filter(pk=generation.pk).update)(
            status="completed")
        rest = [event async for event in again]
        await asyncio.sleep(0)
        return [first, *rest]

    events = in_thread(lambda: asyncio.run(scenario()))
    assert events[0] == b"event: delta\nid: 6\ndata: So far\n\n"
    assert [e.event for e in SSEDecoder().feed(events[-1])][-1] == "done"  # after any block


class UnreachableLayer:
    """A channel layer whose server is down: every call fails."""

    extensions: list[str] = []

    def __init__(self, **_config: Any) -> None:
        pass

    async def new_channel(self, prefix: str = "specific.") -> str:
        raise ConnectionError("the layer's server is down")

    async def group_add(self, group: str, channel: str) -> None:
        raise ConnectionError("the layer's server is down")

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        raise ConnectionError("the layer's server is down")


def test_followers_read_the_database_when_the_channel_layer_fails(make_user, settings):
    import asyncio

    from asgiref.sync import sync_to_async

    from chatstream.stream import _following

    from .conftest import in_thread

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.test_following.UnreachableLayer"}}
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = settings.CHATSTREAM_STOP_POLL_INTERVAL = 0.1
    user = make_user()
    generation = streaming_elsewhere(user)

    async def scenario() -> list[bytes]:
        body = _following.admit(generation.pk, user.pk, PageWire(str))
        events = [await anext(body)]
        rows = Generation.objects.filter(pk=generation.pk)
        await sync_to_async(rows.update)(content="So far, and more")
        await asyncio.sleep(0.5)
        await sync_to_async(rows.update)(status="completed")
        events += [event async for event in body]
        return events

    events = in_thread(lambda: asyncio.run(scenario()))
    assert events[:2] == [b"event: delta\nid: 6\ndata: So far\n\n",
                          b"event: delta\nid: 16\ndata: , and more\n\n"]
    assert [e.event for e in SSEDecoder().feed(events[-1])][-1] == "done"  # after any block
