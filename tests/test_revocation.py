"""A user's live replies end when the user signs out, is deactivated, is refused access or is
deleted: across worker processes, in ``detach`` mode, over the channel layer or the durable flag.

The reply streams in one worker process (its page has left: detached, it would run for ever);
the event happens in another worker process, or in the test's own process (as in a management
command or a task). The simulator says when the upstream was closed.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from chatstream import api
from chatstream.models import Generation, QuotaCharge

from .conftest import Browser, generation_id, read_events
from .workers import DATABASES, Workers, postgres_available, redis_available

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

REDIS_URL = os.environ.get("CHATSTREAM_TEST_REDIS", "redis://127.0.0.1:6379/0")
ENDLESS = "endless?tps=20"  # a reply that only a Stop ends

# What each event stores: (error_type, reason).
STORED = {
    "signed-out": ("user_signed_out", "stopped: the user signed out"),
    "signed-out-async": ("user_signed_out", "stopped: the user signed out"),
    "deactivated": ("user_deactivated", "stopped: the user was deactivated"),
    "refused-page": ("access_revoked", "stopped: the user no longer has access to the chat"),
    "refused-json-api": ("access_revoked",
                         "stopped: the user no longer has access to the chat"),
    "stop-replies-of": ("access_revoked", "stopped: the user no longer has access to the chat"),
}


def layer_settings(layer: str, settings: Any, require_service: Any
                   ) -> tuple[dict[str, str], dict[str, Any]]:
    """The workers' environment and overrides for ``layer``; this process's settings to match
    (it sees some of the events)."""
    overrides: dict[str, Any] = {
        "CHATSTREAM_ON_DISCONNECT": "detach",
        "CHATSTREAM_ACCESS": "tests.hostapp.access.chat_access",
        "CHATSTREAM_DEFAULT_QUOTA": {"TOKENS_PER_DAY": 1_000_000},
        "ROOT_URLCONF": "tests.urls_sign_out",
    }
    if layer == "redis":
        require_service("Redis", redis_available)
        settings.CHANNEL_LAYERS = {"default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]}}}
        # Nothing read from the database could stop the reply in time: the message does.
        overrides |= {"CHATSTREAM_CHECKPOINT_INTERVAL": 60, "CHATSTREAM_STOP_POLL_INTERVAL": 60,
                      "CHATSTREAM_HEARTBEAT_INTERVAL": 60, "CHATSTREAM_STALE_AFTER": 600}
        return {"REDIS_URL": REDIS_URL}, overrides
    settings.CHATSTREAM_CHANNEL_LAYER = None
    overrides |= {"CHATSTREAM_CHANNEL_LAYER": None, "CHATSTREAM_STOP_POLL_INTERVAL": 0.2}
    return {}, overrides


def stream_then_leave(browser: Browser, url: str) -> None:
    """Read the reply's first two deltas, then leave, as a closed tab: the reply goes on."""
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200
        deltas = 0
        for _at, name, _data in read_events(response):
            deltas += name == "delta"
            if deltas == 2:
                break


def happen(event: str, user: Any, elsewhere: Browser, alias: str) -> None:
    """``event``, in the other worker process (``elsewhere``) or in this one."""
    if event == "signed-out":
        assert elsewhere.post("/accounts/logout/", htmx=False).status_code in (200, 302)
    elif event == "signed-out-async":
        assert elsewhere.post("/accounts/alogout/", htmx=False).status_code == 200
    elif event == "deactivated":
        user.is_active = False
        user.save()
    elif event in ("refused-page", "refused-json-api"):
        banned, _ = Group.objects.db_manager(alias).get_or_create(name="banned")
        user.groups.add(banned)
        path = "/chat/" if event == "refused-page" else "/chat/api/conversations/"
        assert elsewhere.client.get(path).status_code == 403
    elif event == "stop-replies-of":
        assert api.stop_replies_of(user) == 1
    else:
        raise AssertionError(event)


@pytest.mark.postgres
@pytest.mark.parametrize("layer", [pytest.param("redis", marks=pytest.mark.redis),
                                   "database-poll"])
@pytest.mark.parametrize("event", list(STORED))
def test_a_detached_reply_ends_when_its_user_loses_the_right_to_it(
        simulator, use_model, require_service, settings, layer, event):
    require_service("PostgreSQL", postgres_available)
    env, overrides = layer_settings(layer, settings, require_service)
    model = use_model(ENDLESS)
    user = get_user_model().objects.db_manager("postgres").create_user("alice", password="pw")
    with Workers(workers=1, env=env, overrides=overrides, alias="postgres") as a, \
            Workers(workers=1, env=env, overrides=overrides, alias="postgres") as b:
        streamer, elsewhere = Browser(a.url, user), Browser(b.url, user)
        url = streamer.send(streamer.new_conversation(), "Hi", model)
        stream_then_leave(streamer, url)
        record = simulator.last_request
        assert not record.wait_closed(0.5)  # detached: it goes on without its page
        happen(event, user, elsewhere, "postgres")
        closed = record.wait_closed(20)
        streamer.close()
        elsewhere.close()
    assert closed and record.client_closed
    generation = Generation.objects.using("postgres").get(pk=generation_id(url))
    assert generation.status == Generation.Status.CANCELLED
    assert (generation.error_type, generation.reason) == STORED[event]
    assert generation.content  # the text so far is kept
    charge = QuotaCharge.objects.using("postgres").get(generation_id=generation.pk)
    assert charge.settled_at is not None and charge.charged > 0  # settled as for Stop


@pytest.mark.postgres
@pytest.mark.redis
def test_a_detached_reply_of_a_deleted_user_closes_its_upstream_without_a_checkpoint(
        simulator, use_model, require_service, settings):
    """Its rows go with the user: the channel layer tells the stream, long before a checkpoint
    would find the row gone."""
    require_service("PostgreSQL", postgres_available)
    env, overrides = layer_settings("redis", settings, require_service)
    model = use_model(ENDLESS)
    user = get_user_model().objects.db_manager("postgres").create_user("alice", password="pw")
    with Workers(workers=1, env=env, overrides=overrides, alias="postgres") as a:
        streamer = Browser(a.url, user)
        url = streamer.send(streamer.new_conversation(), "Hi", model)
        stream_then_leave(streamer, url)
        record = simulator.last_request
        assert not record.wait_closed(0.5)
        user.delete()
        closed = record.wait_closed(20)
        streamer.close()
    assert closed and record.client_closed
    assert not Generation.objects.using("postgres").filter(pk=generation_id(url)).exists()


# --- in one process: replies not started yet, and what does not count ----------------------------


@pytest.mark.parametrize("event", ["signed-out", "deactivated", "refused-page",
                                   "stop-replies-of"])
def test_a_reply_not_started_yet_is_cancelled_with_the_event_and_never_starts(
        make_user, browser_for, simulator, use_model, settings, event):
    settings.CHATSTREAM_ACCESS = "tests.hostapp.access.chat_access"
    model = use_model("default?tps=200")
    user = make_user()
    browser = browser_for(user)
    url = browser.send(browser.new_conversation(), "Hi", model)
    happen(event, user, browser, "default")
    browser.client.get(url)  # its ticket, or the session: nothing to start either way
    assert simulator.requests == []
    generation = Generation.objects.get(pk=generation_id(url))
    assert generation.status == Generation.Status.CANCELLED
    assert (generation.error_type, generation.reason) == STORED[event]


def test_a_sign_out_goes_through_when_the_channel_layer_is_down(
        make_user, browser_for, settings, caplog):
    """The flag is written all the same: the reply stops at its next checkpoint."""
    from .test_following import streaming_elsewhere

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.test_following.UnreachableLayer"}}
    user = make_user()
    generation = streaming_elsewhere(user)
    browser = browser_for(user)
    assert browser.post("/accounts/logout/", htmx=False).status_code == 302
    generation.refresh_from_db()
    assert generation.cancel_requested
    assert (generation.error_type, generation.reason) == STORED["signed-out"]
    assert "Could not send Stop" in caplog.text


def test_a_sign_out_waits_for_the_channel_layer_once_however_many_replies(
        make_user, monkeypatch):
    """The Stop messages of all the user's replies go out together: two waits, as one Stop."""
    import asyncio

    from chatstream.stream import StopCause, _stopping, stop_replies_of

    from .test_following import streaming_elsewhere

    user = make_user()
    generations = [streaming_elsewhere(user) for _ in range(5)]
    in_flight = 0
    most = 0
    rounds: list[int] = []
    real = _stopping.publish

    async def counted(generation_id: Any, cause: str = "") -> None:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)  # all of them start before any ends, if sent together
        await real(generation_id, cause)
        in_flight -= 1
        if in_flight == 0:
            rounds.append(most)
            most = 0

    monkeypatch.setattr(_stopping, "publish", counted)
    assert stop_replies_of(user, StopCause.SIGNED_OUT) == 5
    assert rounds == [5, 5]  # two rounds, each of the five messages at once
    for generation in generations:
        generation.refresh_from_db()
        assert generation.cancel_requested and generation.error_type == "user_signed_out"


def test_only_a_save_of_is_active_counts(make_user):
    """Saving another field of an inactive user stops nothing; a deactivation saved
    with ``update_fields`` counts."""
    from .test_following import streaming_elsewhere

    user = make_user()
    generation = streaming_elsewhere(user)
    user.is_active = False
    user.save(update_fields=["last_login"])
    generation.refresh_from_db()
    assert not generation.cancel_requested
    user.save(update_fields=["is_active"])
    generation.refresh_from_db()
    assert generation.cancel_requested and generation.error_type == "user_deactivated"

