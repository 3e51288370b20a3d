"""chatstream from Python (``chatstream.api``): post, run, stream, retry and stop a reply with
the same records, hooks, quotas, signals and Stop as the pages, against the simulated upstream.

Stop crosses over: a page's Stop stops a reply run from Python, ``api.stop`` one a page streams,
in one process (the live server's thread) and across two (a uvicorn process).
"""

from __future__ import annotations

import asyncio
import html
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import aclosing
from typing import Any
from urllib.parse import quote

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import PermissionDenied

from chatstream import api
from chatstream.conf import conf
from chatstream.exceptions import (
    InvalidMessage,
    NotEditable,
    QuotaExceeded,
    Refusal,
    ReplyStillLive,
    RequestRefused,
)
from chatstream.models import Conversation, Generation, Message
from chatstream.signals import generation_finished, quota_refused
from chatstream.stream import Sent
from chatstream.testing import DEFAULT_TEXT

from .conftest import Browser, generation_id
from .signal_hooks import REFUSAL
from .test_resume import Reader, wait_for
from .workers import Workers

pytestmark = pytest.mark.django_db(transaction=True)

Status = Generation.Status
SLOW = "default?tps=40"  # ~20 s of reply: still live while a test acts on it
CRLF_TEXT = "Line one\r\nline two\rthree\r\n\r\nend \U0001f389 <b>&amp;</b>"


@pytest.fixture
def user(make_user: Callable[..., Any]) -> Any:
    return make_user()


def send(how: str, user: Any, content: str, **kwargs: Any) -> Generation:
    """``api.send``, or ``api.asend`` from an event loop of its own."""
    if how == "send":
        return api.send(user, content, **kwargs)
    generation: Generation = async_to_sync(api.asend)(user, content, **kwargs)
    return generation


def stored(generation: Generation) -> Generation:
    return Generation.objects.get(pk=generation.pk)


async def astored(generation: Generation) -> Generation:
    return await Generation.objects.aget(pk=generation.pk)


async def await_for(condition: Callable[[], Any], seconds: float = 15.0) -> None:
    """Until the async ``condition()`` is true."""
    deadline = time.monotonic() + seconds
    while not await condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def collect(generation: Generation, **kwargs: Any) -> list[str]:
    return [piece async for piece in api.astream(generation, **kwargs)]


def as_sent(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


# --- send / asend ---------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["send", "asend"])
def test_send_creates_a_conversation_a_message_and_a_pending_generation(user, simulator, how):
    generation = send(how, user, "  Summarise my week  ", model="fast")
    generation = stored(generation)
    assert generation.status == Status.PENDING and generation.user == user
    assert generation.model == "fast" and generation.retry_of is None
    conversation = generation.conversation
    assert conversation.user == user and conversation.title == "Summarise my week"
    assert [(m.role, m.content) for m in conversation.messages.all()] == [
        ("user", "Summarise my week")]
    assert generation.prompt_message.content == "Summarise my week"
    assert simulator.requests == []  # nothing is sent before something runs it


@pytest.mark.parametrize("how", ["send", "asend"])
def test_send_into_an_existing_conversation_continues_it(user, how):
    first = api.run(api.send(user, "First question", model="fast"))
    generation = send(how, user, "Second question", conversation=first.conversation)
    assert generation.conversation_id == first.conversation_id
    assert Conversation.objects.count() == 1
    assert list(first.conversation.messages.filter(role="user").values_list(
        "content", flat=True).order_by("created_at")) == ["First question", "Second question"]
    assert [m["content"] for m in stored(generation).upstream_messages] == [
        "First question", DEFAULT_TEXT, "Second question"]


@pytest.mark.parametrize("how", ["send", "asend"])
def test_send_refused_by_a_quota_keeps_nothing_and_says_so(user, settings, simulator, how):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 10}
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs)

    quota_refused.connect(receiver, weak=False)
    try:
        with pytest.raises(QuotaExceeded) as info:
            send(how, user, "Hello", model="fast")
    finally:
        quota_refused.disconnect(receiver)
    assert info.value.limit == "tokens_per_day"
    assert Conversation.objects.count() == Message.objects.count() == Generation.objects.count() \
        == 0
    assert len(heard) == 1 and heard[0]["refusal"] is info.value
    assert heard[0]["user"] == user and heard[0]["request"] is None


@pytest.mark.parametrize("how", ["send", "asend"])
def test_send_refused_by_a_hook_keeps_the_message_and_a_failed_generation(
        user, settings, simulator, how):
    settings.CHATSTREAM_REQUEST_HOOKS = ["tests.signal_hooks.refuse"]
    with pytest.raises(RequestRefused) as info:
        send(how, user, "Hello", model="fast")
    refused = info.value.generation
    assert isinstance(refused, Generation)
    assert info.value.message == REFUSAL
    refused = stored(refused)
    assert (refused.status, refused.error_type, refused.reason) == (
        Status.FAILED, "refused", REFUSAL)
    assert Message.objects.get().content == "Hello"
    assert simulator.requests == []


@pytest.mark.parametrize("how", ["send", "asend"])
def test_send_into_another_users_conversation_is_denied(user, make_user, how):
    theirs = api.send(make_user("bob"), "Mine", model="fast").conversation
    with pytest.raises(PermissionDenied):
        send(how, user, "Let me in", conversation=theirs)
    assert Message.objects.filter(conversation=theirs).count() == 1
    assert Generation.objects.count() == 1


@pytest.mark.parametrize("how", ["send", "asend"])
@pytest.mark.parametrize("content", ["", "  \n\t ", "x" * 8001], ids=["empty", "blank", "long"])
def test_send_refuses_an_empty_or_too_long_message(user, how, content):
    assert conf.MAX_MESSAGE_LENGTH == 8000
    with pytest.raises(ValueError):
        send(how, user, content, model="fast")
    assert Conversation.objects.count() == Message.objects.count() == 0


def test_a_message_of_the_longest_length_is_accepted(user):
    assert api.send(user, "x" * conf.MAX_MESSAGE_LENGTH, model="fast").status == Status.PENDING


# --- run / arun -----------------------------------------------------------------------------------


def test_run_runs_to_completed_and_returns_the_stored_generation(user, simulator):
    generation = api.run(api.send(user, "Hi", model="fast"))
    assert isinstance(generation, Generation)
    assert generation.status == Status.COMPLETED and generation.content == DEFAULT_TEXT
    assert generation.finish_reason == "stop" and generation.usage_source == "provider"
    assert generation.completed_at is not None and not generation.is_live
    again = stored(generation)
    assert (again.status, again.content) == (generation.status, generation.content)
    assert Message.objects.get(generation=generation).content == DEFAULT_TEXT
    assert len(simulator.requests) == 1
    assert simulator.last_request.body["messages"] == [{"role": "user", "content": "Hi"}]


def test_run_returns_after_the_finished_receivers_have_run(user):
    ran: list[str] = []

    def slow(sender: Any, generation: Generation, **kwargs: Any) -> None:
        time.sleep(0.5)
        ran.append("sync " + generation.status)

    async def slow_async(sender: Any, generation: Generation, **kwargs: Any) -> None:
        await asyncio.sleep(0.5)
        ran.append("async " + generation.status)

    generation_finished.connect(slow, weak=False)
    generation_finished.connect(slow_async, weak=False)
    try:
        generation = api.run(api.send(user, "Hi", model="fast"))
        assert sorted(ran) == ["async completed", "sync completed"]
    finally:
        generation_finished.disconnect(slow)
        generation_finished.disconnect(slow_async)
    assert generation.status == Status.COMPLETED


def test_run_completes_in_abort_mode_with_no_browser(user, settings, use_model, simulator):
    settings.CHATSTREAM_ON_DISCONNECT = "abort"
    settings.CHATSTREAM_RECONNECT_GRACE = 0
    generation = api.run(api.send(user, "Hi", model=use_model("default?tps=300")))
    assert generation.status == Status.COMPLETED and generation.content == DEFAULT_TEXT
    assert not simulator.last_request.client_closed


async def test_arun_from_async_code(user, simulator):
    generation = await api.arun(await api.asend(user, "Hi", model="fast"))
    assert generation.status == Status.COMPLETED and generation.content == DEFAULT_TEXT


def test_run_of_a_finished_generation_returns_it_without_a_second_call(user, simulator):
    generation = api.run(api.send(user, "Hi", model="fast"))
    again = api.run(generation)
    assert (again.pk, again.status, again.content) == (
        generation.pk, Status.COMPLETED, DEFAULT_TEXT)
    assert len(simulator.requests) == 1


# --- astream --------------------------------------------------------------------------------------


async def test_astream_yields_pieces_that_join_to_the_stored_text(user, use_model, simulator):
    generation = await api.asend(user, "Hi", model=use_model("default?tps=200"))
    pieces = await collect(generation)
    assert len(pieces) > 1 and all(pieces)
    generation = await astored(generation)
    assert generation.status == Status.COMPLETED
    assert "".join(pieces) == generation.content == DEFAULT_TEXT
    assert len(simulator.requests) == 1


async def test_astream_sends_line_ends_as_lf_and_stores_them_as_sent(user, use_model):
    generation = await api.asend(user, "Hi", model=use_model(
        f"default?tps=200&first_token_delay=0&text={quote(CRLF_TEXT)}"))
    pieces = await collect(generation)
    assert (await astored(generation)).content == CRLF_TEXT  # as the provider sent it
    assert "".join(pieces) == as_sent(CRLF_TEXT)


async def test_astream_after_n_of_a_finished_reply_yields_only_the_rest(user, use_model,
                                                                         simulator):
    generation = await api.asend(user, "Hi", model=use_model(
        f"fast?text={quote(CRLF_TEXT)}"))
    await api.arun(generation)
    whole = as_sent(CRLF_TEXT)
    for have in (0, 1, 8, 9, 10, len(whole) - 1, len(whole)):
        rest = "".join(await collect(generation, after=have))
        assert rest == whole[have:], have
        sent = Sent.at(CRLF_TEXT, have)
        assert sent is not None and sent.rest(CRLF_TEXT) == rest
    assert len(simulator.requests) == 1


@pytest.mark.parametrize("after", [-1, "3", 2.0, True], ids=["negative", "str", "float", "bool"])
async def test_astream_refuses_an_after_that_is_not_a_count(user, after):
    generation = await api.arun(await api.asend(user, "Hi", model="fast"))
    with pytest.raises(ValueError):
        await collect(generation, after=after)


async def test_astream_refuses_an_after_past_the_finished_text(user, simulator):
    generation = await api.arun(await api.asend(user, "Hi", model="fast"))
    with pytest.raises(ValueError):
        await collect(generation, after=len(DEFAULT_TEXT) + 1)
    assert len(simulator.requests) == 1


async def test_astream_refuses_an_after_past_a_reply_not_started(user, simulator):
    generation = await api.asend(user, "Hi", model="fast")
    with pytest.raises(ValueError):
        await collect(generation, after=5)
    # Refused before anything ran it: still pending, for a later run.
    assert (await astored(generation)).status == Status.PENDING
    assert simulator.requests == []
    assert (await api.arun(generation)).content == DEFAULT_TEXT


async def test_leaving_astream_early_cancels_the_reply_and_keeps_its_text(
        user, use_model, simulator, settings):
    assert conf.ON_DISCONNECT == "abort"
    generation = await api.asend(user, "Hi", model=use_model(SLOW))
    got = ""
    async with aclosing(api.astream(generation)) as pieces:
        async for piece in pieces:
            got += piece
            if len(got) >= 12:
                break
    await await_for(lambda: _final(generation))
    generation = await astored(generation)
    assert (generation.status, generation.error_type) == (Status.CANCELLED, "client_disconnected")
    assert generation.content.startswith(got) and generation.content != DEFAULT_TEXT
    record = simulator.last_request
    assert await asyncio.to_thread(record.wait_closed, 5) and record.client_closed


async def _final(generation: Generation) -> bool:
    return not (await astored(generation)).is_live


def page_streaming(browser: Any, model: str, *, sent: int) -> tuple[Reader, Generation]:
    """A page streaming a new reply (read in a thread), once it has been sent ``sent``
    characters; and the reply's generation."""
    url = browser.send(browser.new_conversation(), "Hi", model)
    page = Reader(browser, url)
    page.start()
    wait_for(lambda: page.last_id >= sent)
    return page, Generation.objects.get(pk=generation_id(url))


def test_astream_follows_a_reply_a_page_streams(user, browser_for, use_model, simulator):
    browser = browser_for(user)
    page, generation = page_streaming(browser, use_model("default?tps=60"), sent=10)
    followed = "".join(async_to_sync(collect)(generation))
    page.join(30)
    generation = stored(generation)
    assert generation.status == Status.COMPLETED
    assert followed == page.text == generation.content == DEFAULT_TEXT
    assert len(simulator.requests) == 1


def test_astream_refuses_an_after_past_the_text_of_a_live_reply(user, browser_for, use_model,
                                                                simulator):
    browser = browser_for(user)
    page, generation = page_streaming(browser, use_model("stall"), sent=3)
    with pytest.raises(ValueError):
        async_to_sync(collect)(generation, after=10_000)
    api.stop(generation)
    page.join(15)
    assert stored(generation).status == Status.CANCELLED and len(simulator.requests) == 1


def test_astream_follows_a_reply_another_process_streams(user, use_model, simulator):
    model = use_model("default?tps=60")  # before the server copies the settings
    with Workers(workers=1) as server:
        browser = Browser(server.url, user)
        try:
            page, generation = page_streaming(browser, model, sent=10)
            followed = "".join(async_to_sync(collect)(generation))
            page.join(30)
        finally:
            browser.close()
    generation = stored(generation)
    assert generation.status == Status.COMPLETED
    assert followed == page.text == generation.content == DEFAULT_TEXT
    assert len(simulator.requests) == 1


# --- retry ----------------------------------------------------------------------------------------


def test_retry_makes_a_new_pending_generation_answering_the_same_message(user, simulator):
    original = api.run(api.send(user, "Hi", model="fast"))
    again = api.retry(original)
    assert again.pk != original.pk
    again = stored(again)
    assert again.status == Status.PENDING and again.retry_of_id == original.pk
    assert again.prompt_message_id == original.prompt_message_id
    assert again.conversation_id == original.conversation_id
    assert Message.objects.filter(role="user").count() == 1
    assert api.run(again).content == DEFAULT_TEXT
    assert len(simulator.requests) == 2


def test_retry_of_a_live_generation_is_refused(user):
    pending = api.send(user, "Hi", model="fast")
    with pytest.raises(ValueError):
        api.retry(pending)
    assert Generation.objects.count() == 1


def test_each_refusal_is_its_own_type_with_the_sentence_the_page_shows(user):
    """What send, edit and retry refuse: a Refusal of its own kind, with its sentence, and a
    ValueError as before; nothing is kept."""
    with pytest.raises(InvalidMessage, match="Write a message first"):
        api.send(user, " ", model="fast")
    pending = api.send(user, "Hi", model="fast")
    with pytest.raises(ReplyStillLive) as still_live:
        api.retry(pending)
    with pytest.raises(NotEditable) as not_editable:
        api.edit(pending.prompt_message, "Hi again")  # its reply is being written
    for refused in (still_live.value, not_editable.value):
        assert isinstance(refused, Refusal) and isinstance(refused, ValueError)
        assert refused.message == str(refused) and refused.message.endswith(".")
    assert (Message.objects.count(), Generation.objects.count()) == (1, 1)


def test_retry_passes_the_hooks(user, settings):
    original = api.run(api.send(user, "Hi", model="fast"))
    settings.CHATSTREAM_REQUEST_HOOKS = ["tests.signal_hooks.refuse"]
    with pytest.raises(RequestRefused) as info:
        api.retry(original)
    refused = stored(info.value.generation)
    assert refused.retry_of_id == original.pk and refused.error_type == "refused"


# --- Stop, across ---------------------------------------------------------------------------------


class Running(threading.Thread):
    """``api.run`` of a generation in a thread of the test process."""

    def __init__(self, generation: Generation) -> None:
        super().__init__(daemon=True)
        self.generation = generation
        self.result: Generation | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        from django.db import connections

        try:
            self.result = api.run(self.generation)
        except BaseException as error:
            self.error = error
        finally:
            connections.close_all()

    def outcome(self) -> Generation:
        self.join(30)
        assert not self.is_alive() and self.error is None, self.error
        assert self.result is not None
        return self.result


def streaming_with_text(generation: Generation) -> bool:
    row = stored(generation)
    return row.status == Status.STREAMING and bool(row.content)


@pytest.fixture
def started_in_python(user: Any, use_model: Callable[..., str], settings: Any,
                      simulator: Any) -> Iterator[Running]:
    """A stalling reply run by ``api.run`` in this process, with text checkpointed."""
    settings.CHATSTREAM_HEARTBEAT_INTERVAL = 1.0
    running = Running(api.send(user, "Hi", model=use_model("stall")))
    running.start()
    wait_for(lambda: streaming_with_text(running.generation))
    yield running
    running.join(30)


def test_a_pages_stop_stops_a_reply_run_from_python(user, browser_for, started_in_python,
                                                    simulator):
    browser = browser_for(user)
    pk = started_in_python.generation.pk
    assert browser.post(f"/chat/g/{pk}/cancel/").status_code == 204
    generation = started_in_python.outcome()
    assert (generation.status, generation.error_type) == (Status.CANCELLED, "stopped_by_user")
    assert generation.content and DEFAULT_TEXT.startswith(generation.content)
    assert simulator.last_request.wait_closed(5) and simulator.last_request.client_closed


async def test_a_pages_stop_stops_a_reply_arun_runs(user, browser_for, use_model, simulator):
    generation = await api.asend(user, "Hi", model=use_model("stall"))
    running = asyncio.create_task(api.arun(generation))

    async def with_text() -> bool:
        row = await astored(generation)
        return row.status == Status.STREAMING and bool(row.content)

    await await_for(with_text)
    browser = await asyncio.to_thread(browser_for, user)
    response = await asyncio.to_thread(browser.post, f"/chat/g/{generation.pk}/cancel/")
    assert response.status_code == 204
    generation = await asyncio.wait_for(running, 15)
    assert (generation.status, generation.error_type) == (Status.CANCELLED, "stopped_by_user")
    assert generation.content and DEFAULT_TEXT.startswith(generation.content)


@pytest.mark.parametrize("how", ["stop", "astop"])
def test_api_stop_stops_a_reply_a_page_streams(user, browser_for, use_model, how):
    browser = browser_for(user)
    page, generation = page_streaming(browser, use_model("stall"), sent=3)
    if how == "stop":
        api.stop(generation)
    else:
        async_to_sync(api.astop)(generation)
    page.join(15)
    assert not page.is_alive()
    assert page.events[-1].event == "done" and "cs-cancelled" in page.events[-1].data
    generation = stored(generation)
    assert (generation.status, generation.error_type) == (Status.CANCELLED, "stopped_by_user")
    assert generation.content and html.unescape(page.text) == generation.content


def test_api_stop_cancels_a_generation_nobody_started(user, simulator):
    generation = api.send(user, "Hi", model="fast")
    api.stop(generation)
    generation = stored(generation)
    assert (generation.status, generation.error_type) == (Status.CANCELLED, "stopped_by_user")
    assert api.run(generation).status == Status.CANCELLED  # nothing left to run
    assert simulator.requests == []


def test_a_stop_through_another_process_stops_a_reply_run_here(user, started_in_python,
                                                               simulator):
    # No channel layer joins the two processes: the run here reads the durable flag with its
    # next liveness write (the reply is silent: a heartbeat).
    with Workers(workers=1) as server:
        browser = Browser(server.url, user)
        try:
            pk = started_in_python.generation.pk
            assert browser.post(f"/chat/g/{pk}/cancel/").status_code == 204
        finally:
            browser.close()
        generation = started_in_python.outcome()
    assert (generation.status, generation.error_type) == (Status.CANCELLED, "stopped_by_user")
    assert generation.content and DEFAULT_TEXT.startswith(generation.content)
