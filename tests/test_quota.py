"""Quotas: every limit's refusal, exact periods, settlement on every outcome, overrides,
validation, what users and staff see, and exact admission under a 200-request burst across two
worker processes on PostgreSQL and on SQLite."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import IntegrityError, connections, transaction
from django.db.transaction import TransactionManagementError
from django.forms import modelform_factory
from django.test import Client
from django.utils import timezone

from chatstream import quota
from chatstream.checks import check_quota
from chatstream.domain.usage import estimate_tokens
from chatstream.exceptions import QuotaExceeded
from chatstream.models import (
    Conversation,
    Generation,
    GroupQuota,
    Message,
    QuotaAccount,
    QuotaCharge,
    UserQuota,
)
from chatstream.testing import Script

from .conftest import Browser, generation_id, read_events
from .workers import Workers, postgres_available

Status = Generation.Status
Source = QuotaCharge.Source
MAX_TOKENS = 1024  # CHATSTREAM_MAX_TOKENS' default: what "fast" reserves for the reply
PARIS = ZoneInfo("Europe/Paris")


def cost(text: str = "Hello") -> int:
    """What one message of ``text`` in a new conversation reserves."""
    return quota.estimate_prompt([{"role": "user", "content": text}]) + MAX_TOKENS


COST = cost()


def limit(settings: Any, **limits: Any) -> None:
    settings.CHATSTREAM_DEFAULT_QUOTA = {key.upper(): value for key, value in limits.items()}


def start(user: Any, content: str = "Hello", *, now: datetime | None = None,
          model: str = "fast", conversation: Conversation | None = None) -> Generation:
    """A pending generation, created and admitted in one transaction as message-create does."""
    with transaction.atomic():
        conversation = conversation or Conversation.objects.create(user=user, model=model)
        message = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                         content=content)
        generation = Generation.objects.create(conversation=conversation, user=user,
                                               prompt_message=message, model=model)
        quota.admit(generation, now=now)
    return generation


def end(generation: Generation, *, status: str = Status.COMPLETED, usage_source: str = "provider",
        prompt: Any = 9, completion: Any = 100, content: str = "x" * 400) -> QuotaCharge | None:
    """The generation's final save as the lifecycle makes it: outcome and usage, then settle."""
    with transaction.atomic():
        Generation.objects.filter(pk=generation.pk).update(status=status, content=content)
        generation.status, generation.content = status, content
        generation.usage_source = usage_source
        generation.prompt_tokens, generation.completion_tokens = prompt, completion
        return quota.settle(generation)


def charge_of(generation: Generation | str, using: str = "default") -> QuotaCharge:
    pk = generation.pk if isinstance(generation, Generation) else generation
    return QuotaCharge.objects.using(using).get(generation_id=pk)


def refused(user: Any, content: str = "Hello", **kwargs: Any) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as info:
        start(user, content, **kwargs)
    return info.value


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def user(django_user_model: Any) -> Any:
    return django_user_model.objects.create_user("alice", password="pw")


@pytest.fixture
def client_for() -> Callable[[Any], Client]:
    def make(user: Any) -> Client:
        client = Client(headers={"HX-Request": "true"})
        client.force_login(user)
        return client

    return make


def post_message(client: Client, conversation: Conversation, content: str = "Hello",
                 model: str = "") -> Any:
    return client.post(f"/chat/c/{conversation.pk}/messages/",
                       {"content": content, "model": model})


# --- each limit refuses, names itself and says when it resets ---------------------------------


@pytest.mark.django_db
def test_tokens_per_day_refusal_names_the_limit_and_when_enough_frees_up(
    settings, user, client_for
):
    limit(settings, tokens_per_day=COST)
    client = client_for(user)
    conversation = Conversation.objects.create(user=user, model="fast")
    assert post_message(client, conversation).status_code == 200
    end(Generation.objects.get())  # settles at 109 tokens; 1,033 - 109 is too little for more

    response = post_message(client, Conversation.objects.create(user=user, model="fast"))
    assert response.status_code == 429
    assert int(response["Retry-After"]) == 24 * 3600  # the first charge leaves the window then
    assert "1,033 tokens for the last 24 hours" in response.content.decode()
    assert "1 day" in response.content.decode()
    # Nothing of the refused message was kept.
    assert Message.objects.count() == 1 and Generation.objects.count() == 1
    assert QuotaCharge.objects.count() == 1


@pytest.mark.django_db
def test_tokens_held_by_replies_in_flight_refuse_with_a_short_retry(settings, user):
    limit(settings, tokens_per_day=COST)
    start(user)  # still pending: holds its whole reservation
    refusal = refused(user)
    assert refusal.limit == "tokens_per_day"
    assert refusal.retry_after == quota.IN_FLIGHT_RETRY_AFTER
    assert "still being written hold the rest of your 1,033 tokens per 24 hours" in refusal.message


@pytest.mark.django_db
def test_a_message_larger_than_the_whole_limit_is_refused_without_a_retry_time(
    settings, user, client_for
):
    limit(settings, tokens_per_day=COST - 1)
    client = client_for(user)
    response = post_message(client, Conversation.objects.create(user=user, model="fast"))
    assert response.status_code == 429
    assert "Retry-After" not in response  # waiting would not help
    assert f"needs about {COST:,} tokens" in response.content.decode()
    assert "reply of up to 1,024" in response.content.decode()


@pytest.mark.django_db
def test_tokens_per_month_resets_at_midnight_on_the_first_in_the_site_time_zone(settings, user):
    settings.TIME_ZONE = "Europe/Paris"
    limit(settings, tokens_per_month=COST)
    start(user, now=datetime(2026, 1, 10, 12, 0, tzinfo=PARIS))
    end(Generation.objects.get())
    late = datetime(2026, 1, 31, 23, 59, 59, 900000, tzinfo=PARIS)
    refusal = refused(user, now=late)
    assert refusal.limit == "tokens_per_month"
    assert refusal.retry_after == 1  # 0.1 s, rounded up
    assert "January 2026" in refusal.message
    assert "resets on 1 February 2026, 00:00 (Europe/Paris)" in refusal.message
    start(user, now=datetime(2026, 2, 1, 0, 0, tzinfo=PARIS))  # a new month: admitted


@pytest.mark.django_db
def test_requests_per_minute_window_edges_with_frozen_time(settings, user):
    limit(settings, requests_per_minute=3)
    t0 = datetime(2026, 3, 1, 12, 0, tzinfo=ZoneInfo("UTC"))
    for offset in (0, 10, 20):
        end(start(user, now=t0 + timedelta(seconds=offset)))
    refusal = refused(user, now=t0 + timedelta(seconds=59, microseconds=999000))
    assert refusal.limit == "requests_per_minute"
    assert refusal.retry_after == 1
    assert "3 messages in the last minute" in refusal.message
    # At t0 + 60 s exactly, the first request has left the window.
    start(user, now=t0 + timedelta(seconds=60))
    refusal = refused(user, now=t0 + timedelta(seconds=61))
    assert refusal.retry_after == 9  # the request at t0 + 10 s leaves at t0 + 70 s


@pytest.mark.django_db
def test_a_third_concurrent_reply_is_refused_with_a_retry_after(settings, user, client_for):
    limit(settings, concurrent_streams=2)
    client = client_for(user)
    conversation = Conversation.objects.create(user=user, model="fast")
    assert post_message(client, conversation).status_code == 200
    assert post_message(client, conversation, "Again").status_code == 200
    response = post_message(client, conversation, "Third")
    assert response.status_code == 429
    assert response["Retry-After"] == str(quota.IN_FLIGHT_RETRY_AFTER)
    assert "2 replies being written" in response.content.decode()


@pytest.mark.django_db
def test_a_prompt_over_max_prompt_tokens_is_refused(settings, user, client_for):
    limit(settings, max_prompt_tokens=50)
    client = client_for(user)
    conversation = Conversation.objects.create(user=user, model="fast")
    response = post_message(client, conversation, "x" * 400)
    assert response.status_code == 429
    assert "Retry-After" not in response
    assert "too long to send: about 107 tokens, over your limit of 50" in response.content.decode()
    assert post_message(client, conversation, "short").status_code == 200


@pytest.mark.django_db
def test_a_model_outside_the_allowed_models_is_refused(settings, user, client_for):
    settings.CHATSTREAM_MODELS = {"fast": {"MODEL": "fast"}, "pricey": {"MODEL": "fast"}}
    limit(settings, models=["fast"])
    client = client_for(user)
    conversation = Conversation.objects.create(user=user, model="fast")
    response = post_message(client, conversation, model="pricey")
    assert response.status_code == 429
    assert "“pricey” is not included in your plan" in response.content.decode()
    assert post_message(client, conversation, model="fast").status_code == 200


@pytest.mark.django_db
def test_the_binding_refusal_is_the_one_that_lasts_longest(settings, user):
    limit(settings, requests_per_minute=1, tokens_per_day=COST)
    now = timezone.now()
    end(start(user, now=now))
    refusal = refused(user, now=now + timedelta(seconds=1))
    assert refusal.limit == "tokens_per_day"  # 24 h, not the 59 s of the minute's limit


@pytest.mark.django_db
def test_retry_passes_the_same_gate(settings, user, client_for):
    limit(settings, requests_per_minute=1)
    client = client_for(user)
    assert post_message(client, Conversation.objects.create(user=user)).status_code == 200
    original = Generation.objects.get()
    end(original)
    response = client.post(f"/chat/g/{original.pk}/retry/")
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert Generation.objects.count() == 1

    limit(settings, requests_per_minute=None)
    assert client.post(f"/chat/g/{original.pk}/retry/").status_code == 200
    retry = Generation.objects.get(retry_of=original)
    assert charge_of(retry).reserved == COST


# --- periods ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_usage_at_235959_9_and_at_midnight_is_counted_once_in_its_own_period(settings, user):
    settings.TIME_ZONE = "Europe/Paris"
    before = datetime(2026, 1, 31, 23, 59, 59, 900000, tzinfo=PARIS)
    midnight = datetime(2026, 2, 1, 0, 0, tzinfo=PARIS)
    end(start(user, now=before), prompt=10, completion=1)  # 11 tokens in January
    end(start(user, now=midnight), prompt=20, completion=2)  # 22 tokens in February

    january = quota.usage(user, now=before + timedelta(microseconds=50000))
    february = quota.usage(user, now=midnight + timedelta(microseconds=500000))
    assert january.tokens_month == 11
    assert february.tokens_month == 22
    assert february.tokens_day == 33  # the rolling day holds both, once each
    # Each counts for exactly 24 hours from its instant.
    assert quota.usage(user, now=before + timedelta(hours=24)).tokens_day == 22
    assert quota.usage(user, now=midnight + timedelta(hours=24)).tokens_day == 0
    assert quota.usage(user, now=midnight + timedelta(hours=24, microseconds=-1)).tokens_day == 22


@pytest.mark.django_db
def test_some_figures_only_are_those_of_the_whole_usage(settings, user):
    settings.TIME_ZONE = "Europe/Paris"
    before = datetime(2026, 1, 31, 23, 59, 59, 900000, tzinfo=PARIS)
    midnight = datetime(2026, 2, 1, 0, 0, tzinfo=PARIS)
    end(start(user, now=before), prompt=10, completion=1)
    end(start(user, now=midnight), prompt=20, completion=2)
    figures = ("tokens_day", "tokens_month", "requests_minute")
    for now in (before + timedelta(seconds=1), midnight + timedelta(seconds=30),
                midnight + timedelta(hours=24, microseconds=-1), midnight + timedelta(days=40)):
        whole = quota.usage(user, now=now)
        for name in figures:
            some = quota.usage(user, now=now, only=[name])
            assert [getattr(some, f) for f in figures] == [
                getattr(whole, f) if f == name else 0 for f in figures], (now, name)
        assert quota.usage(user, now=now, only=figures).tokens_day == whole.tokens_day
    with pytest.raises(ValueError, match="live"):
        quota.usage(user, only=["live"])


def test_month_bounds_follow_the_site_time_zone_not_utc(settings):
    settings.TIME_ZONE = "Europe/Paris"
    # 23:30 UTC on 31 January is already February in Paris.
    start_, end_ = quota.month_bounds(datetime(2026, 1, 31, 23, 30, tzinfo=ZoneInfo("UTC")))
    assert start_ == datetime(2026, 2, 1, tzinfo=PARIS)
    assert end_ == datetime(2026, 3, 1, tzinfo=PARIS)
    start_, end_ = quota.month_bounds(datetime(2026, 12, 15, tzinfo=PARIS))
    assert end_ == datetime(2027, 1, 1, tzinfo=PARIS)


# --- settlement -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_settling_twice_changes_nothing(user):
    generation = start(user)
    first = end(generation, prompt=9, completion=100)
    assert first is not None and first.charged == 109 and first.source == Source.PROVIDER
    assert end(generation, prompt=9, completion=5000) is None
    assert charge_of(generation).charged == 109


@pytest.mark.django_db
def test_a_live_generation_is_never_settled(user):
    generation = start(user)
    assert quota.settle(generation) is None
    assert charge_of(generation).is_open


@pytest.mark.django_db
@pytest.mark.parametrize(("prompt", "completion"), [
    (2**30, 10), (-5, 10), (9, -1), (None, 10), ("12", 3), (True, 3),
], ids=["absurd", "negative-prompt", "negative-completion", "missing", "string", "bool"])
def test_implausible_provider_usage_is_charged_at_the_estimate(user, prompt, completion):
    generation = start(user)
    charge = end(generation, prompt=prompt, completion=completion, content="y" * 40)
    assert charge is not None
    assert charge.source == Source.ESTIMATED
    assert charge.charged == charge.prompt_estimate + estimate_tokens("y" * 40)


@pytest.mark.django_db
def test_nothing_generated_releases_the_whole_reservation(user):
    generation = start(user)
    charge = end(generation, status=Status.FAILED, usage_source="none", prompt=None,
                 completion=None, content="")
    assert charge is not None and charge.charged == 0 and charge.source == Source.RELEASED
    assert quota.usage(user).tokens_day == 0 and quota.usage(user).live == 0


@pytest.mark.django_db
def test_a_hold_whose_generation_ended_unsettled_never_blocks_a_slot(settings, user):
    limit(settings, concurrent_streams=1)
    orphan = start(user)
    # An exit path that forgot to settle: the row ended, its hold stayed open.
    Generation.objects.filter(pk=orphan.pk).update(status=Status.FAILED)
    start(user)  # admitted: the slot was the orphan's
    charge = charge_of(orphan)
    assert charge.source == Source.RELEASED and charge.settled_at is not None


@pytest.mark.django_db
def test_an_admission_settles_the_holds_left_open_and_only_those(user):
    live, ended, gone = start(user), start(user), start(user)
    Generation.objects.filter(pk=ended.pk).update(status=Status.FAILED)  # never settled
    # A hold whose generation is gone without settling it (rows deleted below the ORM).
    Generation.objects.filter(pk=gone.pk)._raw_delete("default")
    start(user)
    assert charge_of(live).settled_at is None  # a live reply settles its own hold
    assert charge_of(ended).source == Source.RELEASED and charge_of(ended).settled_at
    assert charge_of(gone).charged == charge_of(gone).reserved  # charged in full
    assert charge_of(gone).source == Source.RESERVATION and charge_of(gone).settled_at


@pytest.mark.django_db
def test_deleting_a_conversation_closes_its_holds_and_keeps_its_charges(user):
    pending = start(user)
    done = start(user)
    end(done, prompt=9, completion=100)
    pending.conversation.delete()
    done.conversation.delete()
    assert charge_of(pending).charged == 0  # never streamed: released
    assert charge_of(done).charged == 109  # deleting a conversation refunds nothing
    assert quota.usage(user).tokens_day == 109


@pytest.mark.django_db(transaction=True)
def test_admit_outside_a_transaction_is_refused(user):
    conversation = Conversation.objects.create(user=user)
    message = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                     content="Hi")
    generation = Generation.objects.create(conversation=conversation, user=user,
                                           prompt_message=message, model="fast")
    with pytest.raises(TransactionManagementError, match="inside the transaction"):
        quota.admit(generation)


# --- settlement through the real stream (uvicorn in a thread, the simulator) --------------------


def _stream(browser: Browser, stream_url: str) -> str:
    return browser.client.get(stream_url).text


@pytest.mark.django_db(transaction=True)
def test_a_reply_settles_to_the_providers_usage_and_releases_the_rest(
    settings, make_user, browser_for, simulator
):
    limit(settings, tokens_per_day=50_000)
    browser = browser_for(make_user())
    stream_url = browser.send(browser.new_conversation(), "Hello", "fast")
    assert "event: done" in _stream(browser, stream_url)
    generation = Generation.objects.get(pk=generation_id(stream_url))
    charge = charge_of(generation)
    assert generation.usage_source == Generation.UsageSource.PROVIDER
    assert charge.reserved == COST
    assert charge.source == Source.PROVIDER
    assert charge.charged == generation.prompt_tokens + generation.completion_tokens
    assert charge.charged < charge.reserved  # the unused rest is back
    assert len(simulator.requests) == 1
    assert str(quota.remaining(browser.user)) == (
        f"{50_000 - charge.charged:,} of 50,000 tokens left (rolling 24 hours)"
    )


@pytest.mark.django_db(transaction=True)
def test_a_failure_before_any_content_releases_the_reservation(
    settings, make_user, browser_for, simulator, use_model
):
    limit(settings, tokens_per_day=COST, concurrent_streams=1)
    model = use_model("http-500")
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    stream_url = browser.send(conversation, "Hello", model)
    _stream(browser, stream_url)
    charge = charge_of(generation_id(stream_url))
    assert charge.charged == 0 and charge.source == Source.RELEASED
    # The whole allowance and the slot are back (a new conversation: the same prompt size).
    browser.send(browser.new_conversation(), "Hello", model)


@pytest.mark.django_db(transaction=True)
def test_an_interrupted_stream_is_charged_the_estimate(
    settings, make_user, browser_for, simulator, use_model
):
    model = use_model("drop?tps=0&first_token_delay=0")
    browser = browser_for(make_user())
    stream_url = browser.send(browser.new_conversation(), "Hello", model)
    _stream(browser, stream_url)
    generation = Generation.objects.get(pk=generation_id(stream_url))
    assert generation.status == Status.INTERRUPTED and generation.content
    charge = charge_of(generation)
    assert charge.source == Source.ESTIMATED
    assert charge.charged == generation.prompt_tokens + generation.completion_tokens > 0


@pytest.mark.django_db(transaction=True)
def test_stop_mid_stream_charges_the_estimate_of_what_was_written(
    settings, make_user, browser_for, simulator, use_model
):
    model = use_model("default?tps=20&first_token_delay=0")
    browser = browser_for(make_user())
    stream_url = browser.send(browser.new_conversation(), "Hello", model)
    pk = generation_id(stream_url)
    with browser.client.stream("GET", stream_url) as response:
        events = read_events(response)
        for _at, name, _data in events:
            if name == "delta":
                assert browser.post(f"/chat/g/{pk}/cancel/").status_code in (200, 204)
                break
        for _event in events:  # the stream ends with the saved outcome
            pass
    wait_for(lambda: not charge_of(pk).is_open)
    generation = Generation.objects.get(pk=pk)
    assert generation.status == Status.CANCELLED and generation.content
    charge = charge_of(pk)
    assert charge.source in (Source.ESTIMATED, Source.PROVIDER)
    assert charge.charged == generation.prompt_tokens + generation.completion_tokens > 0


def _end_by(way: str, browser: Browser, stream_url: str, settings: Any) -> None:
    pk = generation_id(stream_url)
    if way in ("completed", "failed"):
        _stream(browser, stream_url)
    elif way == "disconnected":
        with browser.client.stream("GET", stream_url) as response:
            for _at, name, _data in read_events(response):
                if name == "delta":
                    break
    elif way == "stopped":
        assert browser.post(f"/chat/g/{pk}/cancel/").status_code in (200, 204)
    elif way == "swept":
        settings.CHATSTREAM_PENDING_TIMEOUT = 0.05
        time.sleep(0.1)
        call_command("chatstream_sweep", stdout=io.StringIO())
    wait_for(lambda: not charge_of(pk).is_open)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("way", ["completed", "failed", "disconnected", "stopped", "swept"])
def test_the_stream_slot_is_freed_however_the_reply_ends(
    way, settings, make_user, browser_for, simulator, use_model
):
    limit(settings, concurrent_streams=1)
    spec = {"failed": "http-500", "disconnected": "default?tps=20&first_token_delay=0"}
    model = use_model(spec.get(way, "fast"))
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    stream_url = browser.send(conversation, "Hello", model)
    blocked = browser.post(conversation + "messages/", {"content": "Again", "model": model})
    assert blocked.status_code == 429
    _end_by(way, browser, stream_url, settings)
    assert Generation.objects.get(pk=generation_id(stream_url)).status != Status.PENDING
    browser.send(conversation, "Again", model)  # the slot is free


@pytest.mark.django_db(transaction=True)
def test_the_sweeper_releases_the_reservation_of_a_killed_worker(
    settings, make_user, simulator, use_model
):
    limit(settings, concurrent_streams=1)
    model = use_model("default?tps=20&first_token_delay=0")
    user = make_user()
    with Workers(workers=1, overrides={"CHATSTREAM_CHECKPOINT_INTERVAL": 0.1}) as workers:
        browser = Browser(workers.url, user)
        conversation = browser.new_conversation()
        stream_url = browser.send(conversation, "Hello", model)
        pk = generation_id(stream_url)
        reader = threading.Thread(target=_read_quietly, args=(browser, stream_url), daemon=True)
        reader.start()
        wait_for(lambda: bool(Generation.objects.get(pk=pk).content))
        assert workers.process is not None
        os.killpg(workers.process.pid, signal.SIGKILL)  # no finally, no final save
        reader.join(10)
        browser.close()
    generation = Generation.objects.get(pk=pk)
    assert generation.status == Status.STREAMING and charge_of(pk).is_open
    assert quota.usage(user).live == 1  # the dead worker's slot is held...

    settings.CHATSTREAM_STALE_AFTER = 0.2
    time.sleep(0.3)
    call_command("chatstream_sweep", stdout=io.StringIO())
    generation.refresh_from_db()
    charge = charge_of(pk)
    assert generation.status == Status.INTERRUPTED
    assert charge.source == Source.ESTIMATED and not charge.is_open  # ...until the sweeper
    assert charge.charged == generation.prompt_tokens + generation.completion_tokens > 0
    assert quota.usage(user).live == 0
    call_command("chatstream_sweep", stdout=io.StringIO())
    assert charge_of(pk).charged == charge.charged  # twice changes nothing


@pytest.mark.django_db(transaction=True)
def test_deleting_a_conversation_while_its_reply_thinks_charges_the_thinking_shown(
    settings, make_user, browser_for, simulator
):
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = 0.1
    simulator.register("thinker", Script(reasoning="Thinking slowly. " * 100, text="Done.",
                                         tokens_per_second=40, first_token_delay=0))
    settings.CHATSTREAM_MODELS = {"thinker": {"PROVIDER": "default", "MODEL": "thinker"}}
    browser = browser_for(make_user())
    conversation = browser.new_conversation()
    stream_url = browser.send(conversation, "Hello", "thinker")
    pk = generation_id(stream_url)
    with browser.client.stream("GET", stream_url) as response:
        events = read_events(response)  # the page shows the thinking as it comes
        for _at, name, _data in events:
            assert name in ("thinking", "ping")
            shown = Generation.objects.get(pk=pk).reasoning  # as checkpointed
            if shown.count("slowly") >= 10:
                break
        assert browser.post(f"{conversation}delete/", htmx=False).status_code == 302
    charge = charge_of(pk)
    assert charge.source == Source.ESTIMATED and not charge.is_open
    # At least the thinking checkpointed before the delete (more may have been since).
    assert charge.charged >= charge.prompt_estimate + estimate_tokens(shown)
    assert charge.charged <= charge.prompt_estimate + estimate_tokens("Thinking slowly. " * 100)


@pytest.mark.django_db
def test_the_sweeper_charges_the_thinking_of_a_reply_its_worker_left_behind(settings, user):
    generation = start(user)
    Generation.objects.filter(pk=generation.pk).update(
        status=Status.STREAMING, reasoning="Hmm, " * 100, content="",
        heartbeat_at=timezone.now() - timedelta(minutes=5))
    settings.CHATSTREAM_STALE_AFTER = 1
    call_command("chatstream_sweep", stdout=io.StringIO())
    generation.refresh_from_db()
    charge = charge_of(generation)
    assert generation.status == Status.INTERRUPTED
    assert generation.completion_tokens == estimate_tokens("Hmm, " * 100)
    assert charge.source == Source.ESTIMATED
    assert charge.charged == generation.prompt_tokens + generation.completion_tokens


def _read_quietly(browser: Browser, url: str) -> None:
    try:
        with browser.client.stream("GET", url) as response:
            for _ in response.iter_raw():
                pass
    except httpx.HTTPError:
        pass


# --- overrides ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_user_override_beats_group_which_beats_the_default(settings, user):
    limit(settings, tokens_per_day=1_000, requests_per_minute=5)
    assert quota.limits_for(user).tokens_per_day == 1_000
    group = Group.objects.create(name="staff")
    user.groups.add(group)
    GroupQuota.objects.create(group=group, tokens_per_day=5_000)
    assert quota.limits_for(user).tokens_per_day == 5_000
    UserQuota.objects.create(user=user, tokens_per_day=2_000)
    limits = quota.limits_for(user)
    assert limits.tokens_per_day == 2_000  # the user's own, even though lower than the group's
    assert limits.requests_per_minute == 5  # not set anywhere else: the default


@pytest.mark.django_db
def test_a_member_of_several_groups_gets_the_most_generous_of_each_limit(settings, user):
    settings.CHATSTREAM_MODELS = {"fast": {}, "pricey": {}, "other": {}}
    limit(settings, tokens_per_day=1_000, requests_per_minute=5, models=["fast"])
    small, large = Group.objects.create(name="small"), Group.objects.create(name="large")
    user.groups.add(small, large)
    GroupQuota.objects.create(group=small, tokens_per_day=5_000, requests_per_minute=50,
                              allowed_models="pricey")
    GroupQuota.objects.create(group=large, tokens_per_day=8_000,
                              unlimited_requests_per_minute=True, allowed_models="other")
    limits = quota.limits_for(user)
    assert limits.tokens_per_day == 8_000
    assert limits.requests_per_minute is None
    assert limits.models == {"pricey", "other"}


@pytest.mark.django_db
def test_unlimited_is_explicit_and_an_empty_override_inherits(settings, user, django_user_model):
    limit(settings, tokens_per_day=COST)
    UserQuota.objects.create(user=user, note="nothing set: inherits everything")
    assert quota.limits_for(user).tokens_per_day == COST
    UserQuota.objects.filter(user=user).update(unlimited_tokens_per_day=True)
    assert quota.limits_for(user).tokens_per_day is None
    for _ in range(3):
        start(user)  # far past the default
    other = django_user_model.objects.create_user("bob")
    start(other)
    assert refused(other).limit == "tokens_per_day"  # the default still applies to others


@pytest.mark.django_db
def test_with_no_default_quota_every_user_is_unlimited_and_sees_no_quota_line(
    settings, user, client_for
):
    settings.CHATSTREAM_DEFAULT_QUOTA = {}
    assert quota.limits_for(user).unlimited
    for _ in range(5):
        start(user)
    assert quota.remaining(user) is None
    conversation = Conversation.objects.create(user=user)
    page = client_for(user).get(f"/chat/c/{conversation.pk}/").content.decode()
    assert "cs-quota" not in page


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(("data", "field"), [
    ({"tokens_per_day": "0"}, "tokens_per_day"),
    ({"tokens_per_day": "-1"}, "tokens_per_day"),
    ({"tokens_per_day": "NaN"}, "tokens_per_day"),
    ({"tokens_per_day": "inf"}, "tokens_per_day"),
    ({"tokens_per_day": "1e309"}, "tokens_per_day"),
    ({"tokens_per_month": str(10**14)}, "tokens_per_month"),
    ({"requests_per_minute": "2.5"}, "requests_per_minute"),
    ({"concurrent_streams": "3", "unlimited_concurrent_streams": "on"}, "concurrent_streams"),
    ({"allowed_models": "fast, nope"}, "allowed_models"),
    ({"allowed_models": "fast", "all_models": "on"}, "allowed_models"),
], ids=["zero", "negative", "nan", "inf", "1e309", "absurd", "fraction", "number-and-unlimited",
        "unknown-model", "models-and-all"])
def test_override_form_rejects_bad_values_with_a_message(user, data, field):
    form = modelform_factory(UserQuota, exclude=[])(data={"user": user.pk, **data})
    assert not form.is_valid()
    assert field in form.errors, form.errors
    assert all(str(message) for message in form.errors[field])


@pytest.mark.django_db
@pytest.mark.parametrize("fields", [
    {"tokens_per_day": 0}, {"max_prompt_tokens": 10**10},
    {"concurrent_streams": 2, "unlimited_concurrent_streams": True},
    {"allowed_models": "fast", "all_models": True},
], ids=["zero", "absurd", "number-and-unlimited", "models-and-all"])
def test_the_database_refuses_an_override_that_skipped_validation(user, fields):
    with pytest.raises(IntegrityError), transaction.atomic():
        UserQuota.objects.create(user=user, **fields)


BAD_NUMBERS = [0, -1, 1.5, float("nan"), float("inf"), 1e309, True, "100", 10**13]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=[repr(v) for v in BAD_NUMBERS])
def test_check_E022_refuses_zero_negative_fractional_nan_and_absurd_limits(settings, value):
    limit(settings, tokens_per_day=value)
    errors = check_quota()
    assert [e.id for e in errors] == ["chatstream.E022"]
    assert repr(value) in errors[0].msg and errors[0].hint


def test_check_E020_refuses_a_quota_that_is_not_a_dict(settings):
    settings.CHATSTREAM_DEFAULT_QUOTA = [("TOKENS_PER_DAY", 10)]
    assert [e.id for e in check_quota()] == ["chatstream.E020"]


def test_check_E021_refuses_a_misspelt_key_that_would_mean_unlimited(settings):
    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAYS": 50_000}
    errors = check_quota()
    assert [e.id for e in errors] == ["chatstream.E021"]
    assert "TOKENS_PER_DAYS" in errors[0].msg


@pytest.mark.parametrize("value", [[], "fast", [1]], ids=["empty", "string", "not-keys"])
def test_check_E023_refuses_a_malformed_model_list(settings, value):
    limit(settings, models=value)
    assert [e.id for e in check_quota()] == ["chatstream.E023"]


def test_check_E024_refuses_a_model_not_in_the_allow_list(settings):
    limit(settings, models=["fast", "gone"])
    errors = check_quota()
    assert [e.id for e in errors] == ["chatstream.E024"]
    assert "'gone'" in errors[0].msg


def test_check_W022_warns_when_no_request_could_ever_be_admitted(settings):
    limit(settings, tokens_per_day=MAX_TOKENS)
    assert [e.id for e in check_quota()] == ["chatstream.W022"]


def test_check_W020_warns_about_sqlite_without_immediate_transactions(monkeypatch):
    params = connections["default"].settings_dict
    assert params["OPTIONS"]["transaction_mode"] == "IMMEDIATE"  # the tests' own setup
    monkeypatch.setitem(params, "OPTIONS", {"timeout": 20})
    assert [e.id for e in check_quota()] == ["chatstream.W020"]


def test_check_W021_warns_about_postgresql_above_read_committed(monkeypatch):
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    params = {**connections["default"].settings_dict, "ENGINE": "django.db.backends.postgresql",
              "OPTIONS": {"isolation_level": IsolationLevel.REPEATABLE_READ}}
    monkeypatch.setattr(connections["default"], "settings_dict", params)
    assert [e.id for e in check_quota()] == ["chatstream.W021"]
    params["OPTIONS"] = {"isolation_level": IsolationLevel.READ_COMMITTED}
    assert check_quota() == []


def test_a_valid_quota_passes_every_check(settings):
    limit(settings, tokens_per_day=50_000, tokens_per_month=None, requests_per_minute=20,
          concurrent_streams=2, max_prompt_tokens=8_000, models=None)
    assert check_quota() == []


@pytest.mark.django_db
def test_admission_fails_closed_on_a_bad_setting_the_checks_did_not_stop(settings, user):
    limit(settings, tokens_per_day=-1)
    with pytest.raises(ImproperlyConfigured, match="TOKENS_PER_DAY"):
        start(user)
    assert not QuotaCharge.objects.exists()


# --- what users and staff see --------------------------------------------------------------------


@pytest.mark.django_db
def test_remaining_says_how_many_tokens_are_left_of_each_limit(settings, user, client_for):
    limit(settings, tokens_per_day=50_000, tokens_per_month=1_000_000)
    end(start(user), usage_source="estimated", prompt=37_000, completion=600)
    assert str(quota.remaining(user)) == (
        "12,400 of 50,000 tokens left (rolling 24 hours) · 962,400 of 1,000,000 tokens left "
        "this month"
    )
    conversation = Conversation.objects.create(user=user)
    page = client_for(user).get(f"/chat/c/{conversation.pk}/").content.decode()
    assert "12,400 of 50,000 tokens left" in page


@pytest.mark.django_db
def test_remaining_never_goes_below_zero(settings, user):
    limit(settings, tokens_per_day=COST)
    end(start(user), prompt=COST, completion=500)  # the provider counted more than estimated
    assert quota.remaining(user).tokens_day == 0  # type: ignore[union-attr]
    assert str(quota.remaining(user)).startswith("0 of 1,033")


@pytest.mark.django_db
def test_admin_lists_each_accounts_usage_against_its_limits(settings, admin_client, user):
    limit(settings, tokens_per_day=50_000, concurrent_streams=2)
    end(start(user), prompt=900, completion=100)
    start(user)
    page = admin_client.get("/admin/chatstream/quotaaccount/").content.decode()
    assert "alice" in page
    assert f"{1_000 + COST:,} / 50,000" in page  # a settled charge plus a live hold
    assert "1 / 2" in page  # live replies
    assert "/ ∞" in page  # no monthly limit


@pytest.mark.django_db
def test_admin_edits_overrides_and_refuses_bad_values(admin_client, user):
    url = "/admin/chatstream/userquota/add/"
    response = admin_client.post(url, {"user": user.pk, "tokens_per_day": "0"})
    assert response.status_code == 200 and not UserQuota.objects.exists()
    assert "Ensure this value is greater than or equal to 1" in response.content.decode()
    response = admin_client.post(url, {"user": user.pk, "tokens_per_day": "5000",
                                       "unlimited_requests_per_minute": "on"})
    assert response.status_code == 302
    override = UserQuota.objects.get(user=user)
    assert override.tokens_per_day == 5_000 and override.unlimited_requests_per_minute
    group = Group.objects.create(name="staff")
    response = admin_client.post("/admin/chatstream/groupquota/add/",
                                 {"group": group.pk, "concurrent_streams": "4",
                                  "all_models": "on"})
    assert response.status_code == 302
    users = admin_client.get("/admin/chatstream/userquota/").content.decode()
    assert "5,000" in users and "unlimited" in users  # "-" cells inherit
    groups = admin_client.get("/admin/chatstream/groupquota/").content.decode()
    assert "staff" in groups and ">4<" in groups and ">all<" in groups
    assert admin_client.get("/admin/chatstream/quotacharge/").status_code == 200


# --- exact under concurrency: 200 messages at once, two worker processes -------------------------

BURST = 200
ADMITTED = 10
DATABASES = ["default", "postgres"] if postgres_available() else ["default"]


async def _post_all(browser: Browser, url: str, paths: list[str]) -> list[httpx.Response]:
    headers = {"X-CSRFToken": browser.csrf, "HX-Request": "true"}
    async with httpx.AsyncClient(base_url=url, cookies=browser.client.cookies, timeout=120,
                                 limits=httpx.Limits(max_connections=BURST)) as client:
        return await asyncio.gather(*(
            client.post(path, data={"content": "Hello", "model": "fast"}, headers=headers)
            for path in paths
        ))


def _stream_url(fragment: str) -> str:
    match = re.search(r'sse-connect="([^"]+)"', fragment)
    assert match, fragment
    return match.group(1)


def _worker_databases(alias: str) -> dict[str, Any]:
    """The workers' database, configured for a burst as a production site would be.

    PostgreSQL: under ASGI every request in flight has its own thread and so its own
    connection; 200 at once would pass max_connections (100 by default). A bounded pool
    (Django 5.1+, or pgbouncer) makes the excess wait for a connection instead.
    SQLite: 200 writers queue for the one write lock; a longer busy timeout lets the last of
    them wait their turn instead of failing with "database is locked".
    """
    params = connections[alias].settings_dict
    if params["ENGINE"].endswith("sqlite3"):
        return {"default": {
            "ENGINE": params["ENGINE"], "NAME": str(params["NAME"]),
            "OPTIONS": {**params["OPTIONS"], "timeout": 120},
        }}
    return {"default": {
        "ENGINE": params["ENGINE"], "NAME": params["NAME"], "USER": params["USER"],
        "PASSWORD": params["PASSWORD"], "HOST": params["HOST"], "PORT": params["PORT"],
        "CONN_MAX_AGE": 0, "OPTIONS": {"pool": {"min_size": 1, "max_size": 8, "timeout": 120}},
    }}


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=pytest.mark.postgres)],
                         ids=["sqlite", "postgres"])
@pytest.mark.parametrize("kind", ["tokens_per_day", "requests_per_minute", "cost_per_day"])
def test_a_burst_of_200_messages_admits_exactly_the_quota(alias, kind, simulator,
                                                          require_service, settings):
    if alias == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
    # Each reply holds 9 prompt tokens at INPUT and 1,024 at OUTPUT: 0.002057.
    settings.CHATSTREAM_MODELS["fast"]["PRICE"] = {"INPUT": "1.00", "OUTPUT": "2.00"}
    hold = quota.hold_of(["fast"], prompt=COST - MAX_TOKENS, max_tokens=MAX_TOKENS)
    assert hold is not None
    allowance = {"tokens_per_day": ADMITTED * COST, "requests_per_minute": ADMITTED,
                 "cost_per_day": str(ADMITTED * hold)}[kind]
    user = get_user_model().objects.db_manager(alias).create_user("burst", password="pw")
    conversations = Conversation.objects.using(alias).bulk_create(
        [Conversation(user=user, model="fast") for _ in range(BURST)]
    )
    overrides = {"CHATSTREAM_DEFAULT_QUOTA": {kind.upper(): allowance},
                 "DATABASES": _worker_databases(alias)}
    with Workers(workers=2, alias=alias, overrides=overrides) as workers:
        browser = Browser(workers.url, user)
        try:
            paths = [f"/chat/c/{c.pk}/messages/" for c in conversations]
            responses = asyncio.run(_post_all(browser, workers.url, paths))
            admitted = [r for r in responses if r.status_code == 200]
            streams = [_stream_url(r.text) for r in admitted]
            # One at a time: admission is what this test is about, not connection pressure.
            bodies = [browser.client.get(stream).text for stream in streams]
        finally:
            browser.close()

    refused = [r for r in responses if r.status_code == 429]
    others = [r for r in responses if r.status_code not in (200, 429)]
    assert not others, (others[0].status_code, others[0].text[:500])
    assert len(admitted) == ADMITTED, sorted({r.status_code for r in responses})
    assert len(refused) == BURST - ADMITTED
    phrase = {"tokens_per_day": "tokens per 24 hours", "requests_per_minute":
              "in the last minute", "cost_per_day": " USD per 24 hours"}[kind]
    for response in refused:
        assert int(response.headers["Retry-After"]) >= 1
        assert phrase in response.text
    assert all("event: done" in body for body in bodies)
    assert len(simulator.requests) == ADMITTED

    # The ledger adds up: one settled charge per generation, equal to its usage.
    charges = list(QuotaCharge.objects.using(alias).filter(user=user))
    generations = list(Generation.objects.using(alias).filter(user=user))
    assert len(charges) == len(generations) == ADMITTED
    assert {c.generation_id for c in charges} == {g.pk for g in generations}
    assert all(g.status == Status.COMPLETED for g in generations)
    assert all(not c.is_open and c.charged is not None and c.charged >= 0 for c in charges)
    used = sum(c.charged for c in charges)  # type: ignore[misc]
    assert used == sum(g.prompt_tokens + g.completion_tokens for g in generations)
    assert used <= ADMITTED * COST
    assert all(c.reserved == COST and c.reserved_cost == hold for c in charges)
    # The money adds up too: never more than the allowance, each charge its reply's cost.
    assert all(c.charged_cost == g.cost for c, g in zip(
        sorted(charges, key=lambda c: c.generation_id), sorted(generations, key=lambda g: g.pk),
        strict=True))
    assert sum(c.charged_cost for c in charges) <= ADMITTED * hold  # type: ignore[misc]
    assert Message.objects.using(alias).filter(conversation__user=user).count() == 2 * ADMITTED
    assert QuotaAccount.objects.using(alias).get(user=user).admissions == ADMITTED
