"""The structured log line: one INFO record on ``chatstream.generations`` per finished
generation, its fields those of the stored row, and never a word of the conversation."""

from __future__ import annotations

import html
import json
import logging
import re
import shlex
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from django.urls import reverse
from django.utils import timezone

from chatstream import api, stream
from chatstream.conf import conf
from chatstream.domain import reporting
from chatstream.models import LOADED_ATTEMPTS, Attempt, Conversation, Generation, Message

from . import hooks_for_tests as hooks
from .conftest import generation_id, read_events

pytestmark = pytest.mark.django_db(transaction=True)

Status = Generation.Status
# In the user's message and in the reply (the simulator's echo): it must reach no log record.
MARKER = "zebra-quartz-7f3a91"
FIELDS = ("generation_id", "user_id", "model", "status", "error_type", "finish_reason",
          "ttft_ms", "duration_ms", "prompt_tokens", "cached_tokens", "completion_tokens",
          "usage_source")


@pytest.fixture(autouse=True)
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    hooks.reset()
    caplog.set_level(logging.DEBUG, logger="chatstream")  # every chatstream record, to search
    yield caplog
    hooks.reset()
    for record in caplog.get_records("setup") + caplog.get_records("call"):
        if record.name.startswith("chatstream"):
            assert MARKER not in _all_text(record), record


def _all_text(record: logging.LogRecord) -> str:
    text = [record.getMessage(), repr(vars(record))]
    if record.exc_info:
        text.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(text)


def lines_for(caplog: pytest.LogCaptureFixture, pk: Any) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "chatstream.generations"
            and getattr(r, "generation_id", None) == str(pk)]


def wait_for_line(caplog: pytest.LogCaptureFixture, pk: Any) -> logging.LogRecord:
    """The line, once written (the live server writes it from its own thread, after the
    final save)."""
    deadline = time.monotonic() + 10
    while not (found := lines_for(caplog, pk)):
        assert time.monotonic() < deadline, (
            f"no log line for {Generation.objects.filter(pk=pk).values().first()}")
        time.sleep(0.02)
    return found[0]


def ms(value: timedelta | None) -> int | None:
    return None if value is None else round(value.total_seconds() * 1000)


def assert_matches_the_row(record: logging.LogRecord, generation: Generation) -> None:
    generation.refresh_from_db()
    expected = {
        "generation_id": str(generation.pk), "user_id": generation.user_id,
        "model": generation.model, "status": generation.status,
        "error_type": generation.error_type, "finish_reason": generation.finish_reason,
        "ttft_ms": ms(generation.time_to_first_token), "duration_ms": ms(generation.duration),
        "prompt_tokens": generation.prompt_tokens, "cached_tokens": generation.cached_tokens,
        "completion_tokens": generation.completion_tokens,
        "usage_source": generation.usage_source,
    }
    assert {name: getattr(record, name) for name in FIELDS} == expected
    assert record.levelno == logging.INFO
    if hasattr(record, "attempts"):  # a reply the engine ended: the calls it saved
        expected["attempts"] = generation.attempts.count()
        assert record.attempts == expected["attempts"]
    # The message carries the same pairs, for a plain formatter.
    pairs = dict(re.findall(r"(\w+)=(\S+)", record.getMessage()))
    assert pairs == {k: "-" if v in (None, "") else str(v) for k, v in expected.items()}


def stream_to_end(browser: Any, url: str) -> list[tuple[str, str]]:
    with browser.client.stream("GET", url, timeout=15) as response:
        assert response.status_code == 200
        return [(name, data) for _at, name, data in read_events(response)]


def test_a_completed_reply_logs_one_line_with_its_stored_figures(
    make_user, browser_for, simulator, use_model, logs
):
    model = use_model("echo?tps=0&first_token_delay=0&cached_tokens=3")
    user = make_user()
    browser = browser_for(user)
    url = browser.send(browser.new_conversation(), f"Please repeat {MARKER} back", model)
    events = stream_to_end(browser, url)
    assert MARKER in html.unescape("".join(data for name, data in events if name == "delta"))
    generation = Generation.objects.get(pk=generation_id(url))
    record = wait_for_line(logs, generation.pk)
    assert MARKER in generation.content
    assert generation.status == Status.COMPLETED and generation.usage_source == "provider"
    assert generation.cached_tokens == 3
    assert generation.time_to_first_token is not None
    assert_matches_the_row(record, generation)
    assert record.attempts == 1  # type: ignore[attr-defined]
    # Reading the finished reply again is no new end.
    assert stream_to_end(browser, url)[-1][0] == "done"
    assert len(lines_for(logs, generation.pk)) == 1


def test_a_reply_stopped_by_the_user_logs_one_cancelled_line(
    make_user, browser_for, simulator, use_model, logs
):
    model = use_model("echo?tps=20&first_token_delay=0")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), " ".join([MARKER] * 40), model)
    with browser.client.stream("GET", url, timeout=15) as response:
        for _at, name, _data in read_events(response):
            if name == "delta":
                pk = generation_id(url)
                assert browser.post(reverse("chatstream:generation-cancel",
                                            kwargs={"pk": pk})).status_code == 204
                # The page leaves at once, as a closed tab does: while the Stop's final save
                # is under way, which must still be reported.
                break
    generation = Generation.objects.get(pk=generation_id(url))
    record = wait_for_line(logs, generation.pk)
    generation.refresh_from_db()
    assert generation.status == Status.CANCELLED
    assert_matches_the_row(record, generation)
    assert len(lines_for(logs, generation.pk)) == 1


def test_a_stop_before_the_stream_started_logs_one_cancelled_line(
    make_user, browser_for, simulator, logs
):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), MARKER, "fast")
    pk = generation_id(url)
    assert browser.post(reverse("chatstream:generation-cancel", kwargs={"pk": pk})
                        ).status_code == 204
    generation = Generation.objects.get(pk=pk)
    record = wait_for_line(logs, pk)
    assert generation.status == Status.CANCELLED and generation.time_to_first_token is None
    assert_matches_the_row(record, generation)
    assert stream_to_end(browser, url)[-1][0] == "done"
    assert simulator.requests == []
    assert len(lines_for(logs, pk)) == 1


def test_an_http_error_from_the_provider_logs_one_failed_line(
    make_user, browser_for, simulator, use_model, logs
):
    model = use_model("http-500")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), MARKER, model)
    assert stream_to_end(browser, url)[-1][0] == "done"
    generation = Generation.objects.get(pk=generation_id(url))
    record = wait_for_line(logs, generation.pk)
    assert generation.status == Status.FAILED and generation.error_type
    assert_matches_the_row(record, generation)
    assert len(lines_for(logs, generation.pk)) == 1


def test_a_refusal_by_a_hook_logs_one_failed_line(settings, make_user, browser_for, simulator,
                                                  logs):
    settings.CHATSTREAM_REQUEST_HOOKS = [hooks.SYNC_HOOK]
    hooks.state.sync_action = hooks.refuse("Not today.")
    browser = browser_for(make_user())
    response = browser.post(browser.new_conversation() + "messages/",
                            {"content": MARKER, "model": ""})
    assert response.status_code == 200, response.text
    generation = Generation.objects.get()
    record = wait_for_line(logs, generation.pk)
    assert (generation.status, generation.error_type) == (Status.FAILED, "refused")
    assert_matches_the_row(record, generation)
    assert record.ttft_ms is None  # type: ignore[attr-defined]  # never started
    assert len(lines_for(logs, generation.pk)) == 1


def test_a_hook_that_raises_logs_one_failed_line_and_its_traceback(
    settings, make_user, browser_for, simulator, logs
):
    settings.CHATSTREAM_REQUEST_HOOKS = [hooks.SYNC_HOOK]

    def explode_with_the_message(call: Any) -> None:
        raise RuntimeError("cannot handle this message")

    hooks.state.sync_action = explode_with_the_message
    browser = browser_for(make_user())
    browser.post(browser.new_conversation() + "messages/", {"content": MARKER, "model": ""})
    generation = Generation.objects.get()
    assert_matches_the_row(wait_for_line(logs, generation.pk), generation)
    assert generation.error_type == "hook_failed"


def test_a_model_taken_off_the_allow_list_logs_one_failed_line(
    settings, make_user, browser_for, simulator, logs
):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), MARKER, "fast")
    settings.CHATSTREAM_MODELS = {"other": {"PROVIDER": "default", "MODEL": "fast"}}
    assert stream_to_end(browser, url)[-1][0] == "done"
    generation = Generation.objects.get(pk=generation_id(url))
    record = wait_for_line(logs, generation.pk)
    assert generation.status == Status.FAILED
    assert_matches_the_row(record, generation)
    assert simulator.requests == []


def _streaming_row_of_a_dead_worker(user: Any) -> Generation:
    """What a worker killed mid-reply leaves: a streaming row, its last checkpoint, an old
    heartbeat."""
    conversation = Conversation.objects.create(user=user, model="fast", title="t")
    message = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                     content=f"Tell me about {MARKER}")
    long_ago = timezone.now() - timedelta(hours=1)
    return Generation.objects.create(
        conversation=conversation, user=user, prompt_message=message, model="fast",
        status=Status.STREAMING, content=f"Here is what I know about {MARKER}: it",
        created_at=long_ago, started_at=long_ago,
        first_token_at=long_ago + timedelta(milliseconds=250), heartbeat_at=long_ago)


def test_a_swept_interrupted_generation_logs_one_line(make_user, logs):
    generation = _streaming_row_of_a_dead_worker(make_user())
    assert stream.sweep()["interrupted"] == 1
    record = wait_for_line(logs, generation.pk)
    generation.refresh_from_db()
    assert generation.status == Status.INTERRUPTED
    assert_matches_the_row(record, generation)
    assert record.ttft_ms == 250  # type: ignore[attr-defined]
    assert stream.sweep() == {"interrupted": 0, "abandoned": 0, "expired": 0,
                              "lost": 0}  # swept once, logged once
    assert len(lines_for(logs, generation.pk)) == 1


def test_a_swept_abandoned_generation_logs_one_line(make_user, simulator, logs):
    generation = api.send(make_user(), MARKER)
    Generation.objects.filter(pk=generation.pk).update(
        created_at=timezone.now() - timedelta(seconds=conf.PENDING_TIMEOUT + 60))
    assert stream.sweep()["abandoned"] == 1
    record = wait_for_line(logs, generation.pk)
    generation.refresh_from_db()
    assert (generation.status, generation.error_type) == (Status.CANCELLED, "abandoned")
    assert_matches_the_row(record, generation)
    stream.sweep()
    assert len(lines_for(logs, generation.pk)) == 1


def test_no_line_is_written_for_a_generation_that_has_not_finished(
    make_user, browser_for, simulator, logs
):
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), MARKER, "fast")
    assert lines_for(logs, generation_id(url)) == []
    assert not [r for r in logs.records if r.name == "chatstream.generations"]


def test_the_line_is_not_written_when_the_logger_is_above_info(
    make_user, browser_for, simulator, logs
):
    logs.set_level(logging.WARNING, logger="chatstream.generations")
    browser = browser_for(make_user())
    url = browser.send(browser.new_conversation(), MARKER, "fast")
    assert stream_to_end(browser, url)[-1][0] == "done"
    assert Generation.objects.get().status == Status.COMPLETED
    assert not [r for r in logs.records if r.name == "chatstream.generations"]


def test_what_the_provider_sent_can_neither_end_the_line_nor_add_a_pair(
    make_user, simulator, use_model, logs
):
    forged = "stop\ngeneration status=ok\r\x1b[2K"
    model = use_model("fast?" + urlencode({"finish_reason": forged}))
    generation = api.run(api.send(make_user(), "Hi", model=model))
    message = wait_for_line(logs, generation.pk).getMessage()
    assert message.isprintable()  # no line end, no terminal escape
    pairs = shlex.split(message.removeprefix("generation "))
    assert [pair.partition("=")[0] for pair in pairs] == [*FIELDS, "attempts"]
    assert f"finish_reason={json.dumps(generation.finish_reason)}" in message
    assert generation.finish_reason.startswith("stop\ufffdgeneration")  # stored printable too


# --- attempts and fallbacks ----------------------------------------------------------------------


def _ended(user: Any, **fields: Any) -> Generation:
    conversation = Conversation.objects.create(user=user, model="fast")
    message = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                     content="Hi")
    now = timezone.now()
    return Generation.objects.create(
        conversation=conversation, user=user, prompt_message=message, model="fast",
        status=Status.COMPLETED, started_at=now, first_token_at=now, completed_at=now,
        **fields)


def test_the_line_counts_the_attempts_the_engine_made_and_names_the_fallback(
    make_user, logs, django_assert_num_queries
):
    generation = _ended(make_user(), answered_by="spare")
    setattr(generation, LOADED_ATTEMPTS, [Attempt(number=n) for n in (1, 2, 3)])  # as the engine
    with django_assert_num_queries(0):
        reporting.finished_now(generation)
    record = wait_for_line(logs, generation.pk)
    assert (record.attempts, record.answered_by) == (3, "spare")  # type: ignore[attr-defined]
    pairs = shlex.split(record.getMessage().removeprefix("generation "))
    assert [pair.partition("=")[0] for pair in pairs] == [*FIELDS, "attempts", "answered_by"]
    assert record.getMessage().endswith(" usage_source=none attempts=3 answered_by=spare")


@pytest.mark.parametrize("answered_by", ["", "fast"])
def test_the_line_leaves_out_what_it_was_not_told(make_user, logs, answered_by):
    generation = _ended(make_user(), answered_by=answered_by)
    reporting.finished_now(generation)
    record = wait_for_line(logs, generation.pk)
    assert_matches_the_row(record, generation)  # its fields, and no other pair
    assert not hasattr(record, "attempts") and not hasattr(record, "answered_by")


def test_a_single_call_is_one_attempt(make_user, logs):
    generation = _ended(make_user(), answered_by="fast")
    setattr(generation, LOADED_ATTEMPTS, [Attempt(number=1)])
    reporting.finished_now(generation)
    record = wait_for_line(logs, generation.pk)
    assert record.getMessage().endswith(" usage_source=none attempts=1")
