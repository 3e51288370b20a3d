"""Retries, fallbacks and the circuit breaker, against the simulated upstream.

A reply's call that fails before its first content is made again (``CHATSTREAM_RETRIES``) or
given to the model's ``FALLBACKS``; once content has arrived, never. Each call is an ``Attempt``
row. A model that fails keeps cooling down in every process (the ``Cooldown`` rows).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.checks import run_checks
from django.db import connection
from django.utils import timezone

from chatstream import api, quota
from chatstream.domain.notices import describe
from chatstream.models import Attempt, Cooldown, Generation, UserQuota
from chatstream.stream import breaker
from chatstream.testing import DEFAULT_TEXT

from . import hooks_for_tests
from .conftest import Browser, generation_id, read_events
from .test_lifecycle import DATABASES, db_alias, user_in  # noqa: F401 (db_alias: a fixture)
from .test_quota import charge_of
from .workers import Workers

pytestmark = pytest.mark.django_db(transaction=True)

Status = Generation.Status


@pytest.fixture
def models(settings: Any) -> Callable[..., None]:
    """Allow-list ``primary`` (a simulator scenario) with fallbacks ``backup`` and ``spare``."""

    def use(primary: str, backup: str = "default?tps=0", spare: str = "default?tps=0",
            **primary_entry: Any) -> None:
        settings.CHATSTREAM_MODELS = {
            "primary": {"MODEL": primary, "FALLBACKS": ["backup", "spare"], **primary_entry},
            "backup": {"MODEL": backup, "PARAMS": {"temperature": 0.5}, "MAX_TOKENS": 99999},
            "spare": {"MODEL": spare},
        }

    return use


def attempts_of(generation: Generation) -> list[tuple[Any, ...]]:
    return list(generation.attempts.order_by("number").values_list(
        "number", "model", "status", "http_status", "error_type", "retry_after"))


def reply(user: Any, model: str = "primary", content: str = "Hi") -> Generation:
    return api.run(api.send(user, content, model=model))


def test_a_model_failing_before_its_first_token_falls_back(make_user, simulator, models):
    # A 503 with Retry-After: the model cools down for it, so its fallback is called at once.
    models("http-503?tps=0")
    generation = reply(make_user())
    assert generation.status == Status.COMPLETED
    assert generation.content == DEFAULT_TEXT
    assert (generation.model, generation.answered_by) == ("primary", "backup")
    assert attempts_of(generation) == [
        (1, "primary", "failed", 503, "http_503", 1.0),
        (2, "backup", "succeeded", 200, "", None),
    ]
    first, second = simulator.requests
    assert (first.model, second.model) == ("http-503?tps=0", "default?tps=0")
    # The fallback's own parameters, and no more tokens than the model asked for had.
    assert second.body["temperature"] == 0.5
    assert second.body["max_tokens"] == first.body["max_tokens"] == 1024
    assert second.body["messages"] == first.body["messages"]
    assert generation.request_id == second.id and generation.http_status == 200
    [succeeded, failed] = Attempt.objects.filter(generation=generation).order_by("-number")
    assert failed.finished_at <= succeeded.started_at <= succeeded.first_token_at


def test_a_failing_model_is_called_again_before_its_fallbacks(make_user, simulator, models,
                                                              settings):
    settings.CHATSTREAM_RETRIES = 1
    models("http-500?tps=0")  # no Retry-After: a backoff of 0.25-0.5 s
    generation = reply(make_user())
    assert [r.model for r in simulator.requests] == ["http-500?tps=0"] * 2 + ["default?tps=0"]
    gap = simulator.requests[1].received_monotonic - simulator.requests[0].received_monotonic
    assert 0.25 <= gap < 2
    assert [a[:3] for a in attempts_of(generation)] == [
        (1, "primary", "failed"), (2, "primary", "failed"), (3, "backup", "succeeded")]
    assert generation.status == Status.COMPLETED and generation.answered_by == "backup"


def test_the_calls_a_checkpoint_wrote_are_not_written_again_by_the_final_save(
        make_user, simulator, models, settings, monkeypatch):
    from chatstream.store import _orm

    written: list[list[Any]] = []
    checkpoint = _orm.checkpoint

    def spied(rows: Any, using: Any = None, *, calls: Any = ()) -> Any:
        written.append([(c.number, c.model) for c in calls])
        return checkpoint(rows, using, calls=calls)

    monkeypatch.setattr(_orm, "checkpoint", spied)
    settings.CHATSTREAM_CHECKPOINT_INTERVAL = settings.CHATSTREAM_STOP_POLL_INTERVAL = 0.05
    models("http-503?tps=0", backup="default?tps=100&first_token_delay=0")
    generation = reply(make_user())
    assert [calls for calls in written if calls] == [[(1, "primary")]]  # once, with "backup"
    assert len(written) > 2  # the reply went on past it
    assert (generation.status, generation.answered_by) == (Status.COMPLETED, "backup")
    assert attempts_of(generation) == [(1, "primary", "failed", 503, "http_503", 1.0),
                                       (2, "backup", "succeeded", 200, "", None)]


def test_retry_after_is_waited_for_and_a_longer_one_is_not(make_user, simulator, settings,
                                                           use_model):
    use_model("http-429?tps=0&retry_after=1")
    generation = reply(make_user(), "test")
    first, second = simulator.requests
    assert second.received_monotonic - first.received_monotonic >= 1.0
    assert attempts_of(generation) == [(1, "test", "failed", 429, "http_429", 1.0),
                                       (2, "test", "failed", 429, "http_429", 1.0)]
    assert (generation.status, generation.error_type) == (Status.FAILED, "http_429")
    assert generation.answered_by == "test"

    simulator.reset()
    Cooldown.objects.all().delete()  # the Retry-After's, which every process now honours
    breaker.forget()
    settings.CHATSTREAM_MAX_RETRY_WAIT = 0.5  # less than the Retry-After: no second call
    generation = reply(make_user("bob"), "test")
    assert len(simulator.requests) == 1
    assert [a[0] for a in attempts_of(generation)] == [1]


def test_once_content_has_arrived_the_reply_is_never_moved(make_user, simulator, models):
    models("drop?drop_after=4&tps=0")
    generation = reply(make_user())
    assert len(simulator.requests) == 1
    assert generation.status == Status.INTERRUPTED and generation.content
    assert generation.answered_by == "primary"
    [attempt] = generation.attempts.all()
    assert (attempt.status, attempt.error_type) == ("failed", "connection_lost")
    assert attempt.first_token_at is not None


def test_an_error_event_before_any_content_falls_back(make_user, simulator, models):
    models("error-mid?error_after=0&tps=0")
    generation = reply(make_user())
    assert [r.model for r in simulator.requests][-1] == "default?tps=0"
    assert generation.status == Status.COMPLETED and generation.answered_by == "backup"
    assert attempts_of(generation)[0][4] == "stream_error"


def test_a_stream_that_ends_before_any_content_falls_back(make_user, simulator, models,
                                                          settings):
    settings.CHATSTREAM_RETRIES = 0
    # HTTP 200, then the stream ends with no content, no finish reason and no [DONE].
    models("no-done?text=&tps=0")
    generation = reply(make_user())
    assert [r.model for r in simulator.requests] == ["no-done?text=&tps=0", "default?tps=0"]
    assert generation.status == Status.COMPLETED and generation.answered_by == "backup"
    assert attempts_of(generation)[0] == (1, "primary", "failed", 200, "incomplete", None)

    # Cut after some text: the reply is the first call's, ended as it was cut.
    simulator.reset()
    models("no-done?text=Half+a+sentence&tps=0")
    generation = reply(make_user("bob"))
    assert len(simulator.requests) == 1
    assert (generation.status, generation.error_type) == (Status.INTERRUPTED, "incomplete")
    assert generation.content == "Half a sentence" and generation.answered_by == "primary"


def test_fallbacks_the_user_may_not_use_or_that_cannot_stand_in_are_skipped(
        make_user, simulator, models, settings):
    settings.CHATSTREAM_RETRIES = 0
    # spare's context cannot hold the request; backup is not in alice's plan.
    models("http-500?tps=0")
    settings.CHATSTREAM_MODELS["spare"]["CONTEXT_TOKENS"] = 1
    alice = make_user()
    UserQuota.objects.create(user=alice, allowed_models="primary,spare")
    generation = reply(alice, content="A question of a few more tokens than one.")
    assert generation.fallbacks == ["spare"]
    assert [r.model for r in simulator.requests] == ["http-500?tps=0"]
    assert generation.status == Status.FAILED and generation.answered_by == "primary"

    # CHATSTREAM_ACCESS, and a fallback with other tools, leave them out when it is sent.
    settings.CHATSTREAM_ACCESS = "tests.hooks_for_tests.access"
    settings.CHATSTREAM_MODELS["spare"]["TOOLS"] = ["tests.hostapp.tools.order_status"]
    hooks_for_tests.state.access["bob"] = ["primary", "spare"]
    try:
        assert api.send(make_user("bob"), "Hi", model="primary").fallbacks == []
        hooks_for_tests.state.access["carol"] = True
        assert api.send(make_user("carol"), "Hi", model="primary").fallbacks == ["backup"]
    finally:
        hooks_for_tests.reset()


def test_a_model_failing_in_a_row_cools_down_for_every_reply(make_user, simulator, models,
                                                             settings):
    settings.CHATSTREAM_RETRIES = 0
    settings.CHATSTREAM_BREAKER_FAILURES = 2
    models("http-500?tps=0")
    user = make_user()
    for _ in range(2):
        assert reply(user).answered_by == "backup"
    cooldown = Cooldown.objects.get(model="primary")
    assert cooldown.error_type == "http_500"
    assert abs((cooldown.until - timezone.now()).total_seconds() - 30) < 5
    simulator.reset()
    generation = reply(user)  # the primary is not called while it cools down
    assert [r.model for r in simulator.requests] == ["default?tps=0"]
    assert attempts_of(generation) == [(1, "backup", "succeeded", 200, "", None)]


def test_a_cooldown_written_by_another_process_is_honoured(make_user, simulator, models,
                                                           use_model):
    models("default?tps=0")
    Cooldown.objects.create(model="primary", until=timezone.now() + timedelta(seconds=60))
    breaker.forget()  # what a process that never read it knows
    assert reply(make_user()).answered_by == "backup"
    assert [r.model for r in simulator.requests] == ["default?tps=0"]
    assert simulator.requests[0].body["temperature"] == 0.5  # the backup's request

    # With nothing to fall back to, and the cooldown longer than the wait allowed: no call.
    use_model("default?tps=0", key="primary")
    simulator.reset()
    generation = reply(make_user("bob"))
    assert (generation.status, generation.error_type) == (Status.FAILED, "cooling_down")
    assert "paused its calls" in describe(generation.status, error_type=generation.error_type)
    assert simulator.requests == [] and not generation.attempts.exists()
    assert generation.answered_by == ""


def test_a_new_cooldown_never_shortens_a_running_one():
    far = timezone.now() + timedelta(seconds=600)
    Cooldown.objects.create(model="primary", until=far)
    async_to_sync(breaker.failed)("primary", retry_after=1.0, error_type="http_429")
    assert Cooldown.objects.get(model="primary").until == far
    assert Cooldown.objects.get(model="primary").error_type == "http_429"
    async_to_sync(breaker.failed)("other", retry_after=2.0, error_type="http_429")
    left = (Cooldown.objects.get(model="other").until - timezone.now()).total_seconds()
    assert 0 < left <= 2
    connection.close()


def test_a_cooldown_ended_in_the_database_ends_in_every_process():
    async def run() -> float:
        await breaker.failed("primary", retry_after=20.0, error_type="http_429")
        assert breaker.cooling("primary") > 15  # known here at once
        await sync_to_async(Cooldown.objects.filter(model="primary").delete)()  # staff ended it
        deadline = time.monotonic() + 3
        while breaker.cooling("primary") and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        return breaker.cooling("primary")

    assert async_to_sync(run)() == 0
    connection.close()


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_the_attempts_are_saved_with_the_reply_in_a_worker_process(
        simulator, db_alias, settings):  # noqa: F811 (the fixture)
    settings.CHATSTREAM_MODELS = {
        "primary": {"MODEL": "http-503?tps=0", "FALLBACKS": ["backup"]},
        "backup": {"MODEL": "default?tps=0"},
    }
    user = user_in(db_alias)
    with Workers(workers=1, alias=db_alias) as workers:
        browser = Browser(workers.url, user)
        try:
            url = browser.send(browser.new_conversation(), "Hi", "primary")
            with browser.client.stream("GET", url) as response:
                body = "".join(response.iter_text())
        finally:
            browser.client.close()
    assert "event: done" in body
    generation = Generation.objects.using(db_alias).get()
    assert (generation.status, generation.answered_by) == (Status.COMPLETED, "backup")
    assert attempts_of(generation) == [(1, "primary", "failed", 503, "http_503", 1.0),
                                       (2, "backup", "succeeded", 200, "", None)]


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_a_fallback_killed_mid_reply_is_swept_as_its_answer_with_its_calls_and_price(
        simulator, db_alias, settings):  # noqa: F811 (the fixture)
    import os
    import signal
    import subprocess
    import sys

    from .test_lifecycle import wait_for
    from .workers import ROOT, database_env

    settings.CHATSTREAM_MODELS = {
        "primary": {"MODEL": "http-503?tps=0", "FALLBACKS": ["backup"],
                    "PRICE": {"INPUT": "0.10", "OUTPUT": "0.10"}},
        "backup": {"MODEL": "default?tps=20&first_token_delay=0",
                   "PRICE": {"INPUT": "30", "OUTPUT": "60"}},
    }
    settings.CHATSTREAM_RETRIES = 0
    settings.CHATSTREAM_DEFAULT_QUOTA = {"COST_PER_DAY": "1.00"}
    user = user_in(db_alias)
    rows = Generation.objects.using(db_alias)
    overrides = {"CHATSTREAM_HEARTBEAT_INTERVAL": 0.2, "CHATSTREAM_CHECKPOINT_INTERVAL": 0.2,
                 "CHATSTREAM_STALE_AFTER": 1.0}
    with Workers(workers=1, overrides=overrides, alias=db_alias) as workers:
        browser = Browser(workers.url, user)
        url = browser.send(browser.new_conversation(), "Hi", "primary")
        with browser.client.stream("GET", url) as response:
            seen = 0
            events = read_events(response)  # kept referenced: closing it would disconnect
            for _at, name, _data in events:
                seen += name == "delta"
                if seen == 10:
                    break
            row = wait_for(lambda: rows.filter(pk=generation_id(url)).exclude(content="").first())
            # Its first checkpoint after the fallback's first words names it, with the call
            # that failed before.
            assert row.answered_by == "backup"
            assert attempts_of(row) == [(1, "primary", "failed", 503, "http_503", 1.0)]
            os.kill(int(row.worker.rsplit(":", 1)[1]), signal.SIGKILL)
            killed_at = time.monotonic()
        browser.close()
        sweep_env = {**workers.env, **database_env(db_alias)}
    time.sleep(max(0.0, 1.2 - (time.monotonic() - killed_at)))
    subprocess.run([sys.executable, "manage.py", "chatstream_sweep"], cwd=ROOT, env=sweep_env,
                   check=True, capture_output=True)
    generation = rows.get(pk=row.pk)
    assert (generation.status, generation.error_type) == (Status.INTERRUPTED, "worker_lost")
    assert (generation.model, generation.answered_by) == ("primary", "backup")
    assert attempts_of(generation) == [(1, "primary", "failed", 503, "http_503", 1.0),
                                       (2, "backup", "failed", None, "worker_lost", None)]
    lost = generation.attempts.get(number=2)
    assert lost.first_token_at == generation.first_token_at
    assert lost.finished_at == generation.completed_at
    # Priced, and charged, at the price of the model that was answering.
    assert generation.cost == quota.cost_of("backup", prompt=generation.prompt_tokens,
                                            completion=generation.completion_tokens) > 0
    assert charge_of(generation, db_alias).charged_cost == generation.cost


@pytest.mark.django_db(transaction=True, databases=DATABASES)
def test_a_model_cooled_down_in_one_process_gets_no_call_from_another(
        simulator, db_alias, settings):  # noqa: F811 (the fixture)
    settings.CHATSTREAM_MODELS = {
        "primary": {"MODEL": "http-500?tps=0", "FALLBACKS": ["backup"]},
        "backup": {"MODEL": "default?tps=0"},
    }
    settings.CHATSTREAM_RETRIES = 0
    settings.CHATSTREAM_BREAKER_FAILURES = 1
    user = user_in(db_alias)

    def reply_in(workers: Workers, model: str = "primary") -> None:
        browser = Browser(workers.url, user)
        try:
            url = browser.send(browser.new_conversation(), "Hi", model)
            with browser.client.stream("GET", url) as response:
                assert "event: done" in "".join(response.iter_text())
        finally:
            browser.client.close()

    with Workers(workers=1, alias=db_alias) as a, Workers(workers=1, alias=db_alias) as b:
        reply_in(b, "backup")  # b has read the cooldowns: none
        reply_in(a)  # the primary fails in a: it cools down
        time.sleep(2.1)  # what b knows is old now
        assert [r.model for r in simulator.requests] == ["default?tps=0", "http-500?tps=0",
                                                         "default?tps=0"]
        simulator.reset()
        reply_in(b)
        assert [r.model for r in simulator.requests] == ["default?tps=0"]  # not the primary
    assert Cooldown.objects.using(db_alias).get().model == "primary"


@pytest.mark.parametrize(("fallbacks", "words", "check_id"), [
    pytest.param("backup", "must be a list of model keys", "chatstream.E032", id="not-a-list"),
    pytest.param(["primary"], "'primary': itself", "chatstream.E032", id="itself"),
    pytest.param(["nope"], "a model not in CHATSTREAM_MODELS", "chatstream.E032", id="unknown"),
    pytest.param(["backup", "backup"], "a model twice", "chatstream.E032", id="twice"),
    pytest.param(["tools"], "whose TOOLS differ", "chatstream.W030", id="other-tools"),
])
def test_fallbacks_are_checked_at_startup(settings, fallbacks, words, check_id):
    settings.CHATSTREAM_MODELS = {
        "primary": {"MODEL": "x", "FALLBACKS": fallbacks},
        "backup": {"MODEL": "y"},
        "tools": {"MODEL": "z", "TOOLS": ["tests.hostapp.tools.order_status"]},
    }
    found = [m for m in run_checks() if m.id == check_id]
    assert found and words in found[0].msg and found[0].hint
