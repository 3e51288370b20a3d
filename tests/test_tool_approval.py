"""Tool calls that need the user's approval: server state, decided once by the reply's owner,
through the Python API, the page and the JSON API; nothing of a step runs before its last
decision, and Stop cancels what waits."""

from __future__ import annotations

import json
import re
import threading
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from chatstream import api, stream
from chatstream.conf import conf
from chatstream.domain import steps
from chatstream.exceptions import AlreadyDecided
from chatstream.models import Generation, ToolCall
from chatstream.signals import tool_call_finished

from .conftest import Browser
from .test_tool_loop import TOOLS, ran
from .workers import Workers, postgres_available

pytestmark = pytest.mark.django_db(transaction=True)

Status = ToolCall.Status
ASKING = [TOOLS[0], "tests.tools_approval.get_time"]
DATABASES = ["default", "postgres"] if postgres_available() else ["default"]


@pytest.fixture(autouse=True)
def agent(settings: Any, simulator: Any) -> None:
    ran.clear()
    settings.CHATSTREAM_MODELS = {"agent": {"PROVIDER": "default", "MODEL": "agent",
                                            "TOOLS": ASKING}}


@pytest.fixture
def user(make_user: Any) -> Any:
    return make_user()


def waiting_reply(user: Any) -> tuple[Generation, ToolCall]:
    first = api.run(api.send(user, "Weather and time?"))
    return first, ToolCall.objects.get(name="get_time")


def test_a_call_that_needs_approval_holds_its_whole_step(user, simulator):
    first, asking = waiting_reply(user)
    assert first.step == 1 and first.status == Generation.Status.COMPLETED
    assert asking.status == Status.PENDING_APPROVAL
    assert ToolCall.objects.get(name="get_weather").status == Status.APPROVED
    assert ran == [] and len(simulator.requests) == 1  # nothing runs, nothing is sent
    following = Generation.objects.get(follows=first)
    assert following.waits_for_tools and following.status == Generation.Status.PENDING
    # Nothing can start it meanwhile: a stream of it claims nothing.
    assert async_to_sync(api.arun)(following).status == Generation.Status.PENDING


def test_approving_the_last_call_runs_the_step_and_the_reply_goes_on(user, simulator):
    first, asking = waiting_reply(user)
    following = api.decide(asking, user, approve=True)
    assert following is not None and following.follows_id == first.pk
    assert sorted(name for name, *_ in ran) == ["get_time (approved)", "get_weather"]
    asking.refresh_from_db()
    assert asking.status == Status.SUCCEEDED and asking.decided_by == user
    assert asking.decided_at is not None
    last = api.run(following)
    assert last.content.endswith(" | 12:00") and len(simulator.requests) == 2


def test_denying_tells_the_model_the_user_declined(user):
    _, asking = waiting_reply(user)
    last = api.run(api.decide(asking, user, approve=False))
    assert last.content.endswith(" | Not run: the user declined this call.")
    assert [name for name, *_ in ran] == ["get_weather"]
    assert ToolCall.objects.get(pk=asking.pk).status == Status.DENIED


def test_a_call_is_decided_once_and_only_by_its_owner(user, make_user):
    _, asking = waiting_reply(user)
    with pytest.raises(ToolCall.DoesNotExist):
        api.decide(asking, make_user("mallory"), approve=True)
    api.decide(asking, user, approve=False)
    with pytest.raises(AlreadyDecided):
        api.decide(asking, user, approve=True)
    assert ToolCall.objects.get(pk=asking.pk).status == Status.DENIED


def test_two_decisions_racing_exactly_one_wins(user):
    _, asking = waiting_reply(user)
    outcomes: list[str] = []
    barrier = threading.Barrier(2)

    def decide(approve: bool) -> None:
        barrier.wait()
        try:
            api.decide(asking, user, approve=approve)
            outcomes.append("approved" if approve else "denied")
        except AlreadyDecided:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=decide, args=(approve,)) for approve in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) in (["approved", "refused"], ["denied", "refused"])
    won = next(outcome for outcome in outcomes if outcome != "refused")
    assert ToolCall.objects.get(pk=asking.pk).status == {
        "approved": Status.SUCCEEDED, "denied": Status.DENIED}[won]
    assert Generation.objects.filter(step=2, waits_for_tools=False).count() == 1


def test_stop_while_a_call_waits_cancels_the_step(user):
    first, asking = waiting_reply(user)
    api.stop(first)  # the reply's Stop, through its first step
    following = Generation.objects.get(follows=first)
    assert following.status == Generation.Status.CANCELLED
    assert set(ToolCall.objects.values_list("status", flat=True)) == {Status.CANCELLED}
    with pytest.raises(AlreadyDecided):
        api.decide(asking, user, approve=True)
    assert ran == []


def test_the_page_asks_and_its_answer_streams_the_next_step(user, make_user, browser_for):
    browser = browser_for(user)
    stream_url = browser.send(browser.new_conversation(), "Weather and time?")
    with browser.client.stream("GET", stream_url) as response:
        body = response.read().decode()
    asking = ToolCall.objects.get(name="get_time")
    approve = f"/chat/t/{asking.pk}/approve/"
    assert body.count(f'hx-post="{approve}"') == 1  # only in done: cards in `tool` have none
    assert "Waiting for your decision on the tool calls above." in body
    assert browser_for(make_user("mallory")).post(approve).status_code == 404
    assert browser.client.get(approve).status_code == 405
    answer = browser.post(approve)
    assert answer.status_code == 200
    following = Generation.objects.get(step=2)
    assert f'id="generation-{following.pk}"' in answer.text and "sse-connect=" in answer.text
    assert answer.text.count('data-status="succeeded"') == 2
    again = browser.post(f"/chat/t/{asking.pk}/deny/")
    assert again.status_code == 409 and "already decided" in again.text
    url = re.search(rf'sse-connect="([^"]*{following.pk}[^"]*)"', answer.text).group(1)
    with browser.client.stream("GET", url.replace("&amp;", "&")) as response:
        assert "Results: " in response.read().decode()


def test_the_json_api_lists_and_decides_calls(user, make_user, browser_for):
    browser = browser_for(user)
    first, asking = waiting_reply(user)
    listed = browser.client.get(f"/chat/api/generations/{first.pk}/tool-calls/").json()
    assert [(c["name"], c["status"]) for c in listed["tool_calls"]] == [
        ("get_weather", "approved"), ("get_time", "pending_approval")]
    denied = browser.post(f"/chat/api/tool-calls/{asking.pk}/deny/", htmx=False)
    assert denied.status_code == 200
    decided = denied.json()
    assert decided["tool_call"]["status"] == "denied"
    following = Generation.objects.get(follows=first)
    assert decided["next"]["id"] == str(following.pk)
    assert decided["next"]["stream_url"] == f"/chat/api/generations/{following.pk}/stream/"
    again = browser.post(f"/chat/api/tool-calls/{asking.pk}/approve/", htmx=False)
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"
    other = browser_for(make_user("mallory"))
    assert other.post(f"/chat/api/tool-calls/{asking.pk}/approve/",
                      htmx=False).status_code == 404
    assert other.client.get(f"/chat/api/generations/{first.pk}/tool-calls/").status_code == 404


def test_an_undecided_call_expires_and_the_reply_goes_on(user, settings):
    settings.CHATSTREAM_PENDING_TIMEOUT = 60
    first, asking = waiting_reply(user)
    long_ago = timezone.now() - timedelta(seconds=conf.APPROVAL_TIMEOUT + 1)
    Generation.objects.filter(follows=first).update(created_at=long_ago)
    ToolCall.objects.update(created_at=long_ago + timedelta(seconds=2))
    # Not due yet: nothing changes, and the step waiting for a decision is not "abandoned".
    assert stream.sweep() == {"interrupted": 0, "abandoned": 0, "expired": 0, "lost": 0}
    ToolCall.objects.update(created_at=long_ago)
    assert stream.sweep()["expired"] == 1
    assert ToolCall.objects.get(pk=asking.pk).status == Status.EXPIRED
    assert [name for name, *_ in ran] == ["get_weather"]  # approved: run now, by the sweep
    following = Generation.objects.get(follows=first)
    assert not following.waits_for_tools
    last = api.run(following)
    assert last.content.endswith(" | Not run: the user declined this call.")
    with pytest.raises(AlreadyDecided):
        api.decide(asking, user, approve=True)
    assert stream.sweep()["expired"] == 0


def test_a_call_whose_worker_died_while_it_ran_is_lost_and_the_model_told(user):
    first, asking = waiting_reply(user)
    # As a worker leaves them when it dies mid-call: one call running, the other decided.
    started = timezone.now() - timedelta(seconds=60 + 30 + 1)  # STALE_AFTER + its timeout
    Generation.objects.filter(follows=first).update(created_at=started)
    ToolCall.objects.update(created_at=started)
    ToolCall.objects.filter(name="get_weather").update(status=Status.RUNNING,
                                                       started_at=started)
    ToolCall.objects.filter(pk=asking.pk).update(status=Status.DENIED, decided_at=started)
    ToolCall.objects.filter(name="get_weather").update(started_at=started + timedelta(seconds=2))
    assert stream.sweep()["lost"] == 0  # within its time: maybe still running
    ToolCall.objects.filter(name="get_weather").update(started_at=started)
    heard: list[str] = []

    def receiver(sender: Any, tool_call: ToolCall, **kwargs: Any) -> None:
        heard.append(tool_call.status)

    tool_call_finished.connect(receiver)
    try:
        assert stream.sweep()["lost"] == 1
    finally:
        tool_call_finished.disconnect(receiver)
    assert heard == ["lost"]  # for the site's audit: it may have taken effect
    assert ToolCall.objects.get(name="get_weather").status == Status.LOST
    last = api.run(Generation.objects.get(follows=first))
    assert last.content == ("Results: The outcome is unknown: the server stopped while the "
                            "tool ran. It may or may not have taken effect. | Not run: the "
                            "user declined this call.")
    assert ran == []  # never run again


@pytest.mark.django_db(transaction=True, databases=DATABASES)
@pytest.mark.parametrize("alias", ["default", pytest.param("postgres", marks=pytest.mark.postgres)],
                         ids=["sqlite", "postgres"])
def test_decisions_through_two_worker_processes_one_wins_and_the_reply_goes_on(
        alias, require_service):
    if alias == "postgres":
        require_service("PostgreSQL (CHATSTREAM_TEST_POSTGRES)", postgres_available)
    user = get_user_model().objects.db_manager(alias).create_user("alice")
    calls, steps = ToolCall.objects.using(alias), Generation.objects.using(alias)
    with Workers(workers=1, alias=alias) as a, Workers(workers=1, alias=alias) as b:
        first, second = Browser(a.url, user), Browser(b.url, user)
        url = first.send(first.new_conversation(), "Weather and time?")
        with first.client.stream("GET", url) as response:
            assert "Waiting for your decision" in response.read().decode()
        asking = calls.get(name="get_time")
        answers: dict[str, Any] = {}
        barrier = threading.Barrier(2)

        def decide(browser: Browser, verb: str) -> None:
            barrier.wait()
            answers[verb] = browser.post(f"/chat/t/{asking.pk}/{verb}/")

        racing = [threading.Thread(target=decide, args=(first, "approve")),
                  threading.Thread(target=decide, args=(second, "deny"))]
        for thread in racing:
            thread.start()
        for thread in racing:
            thread.join(30)
        statuses = sorted(answer.status_code for answer in answers.values())
        assert statuses == [200, 409], statuses
        won = next(verb for verb, answer in answers.items() if answer.status_code == 200)
        following = steps.get(step=2)
        html_ = answers[won].text
        assert f'id="generation-{following.pk}"' in html_ and "sse-connect=" in html_
        # The reply goes on through the other process.
        other = second if won == "approve" else first
        stream_url = re.search(rf'sse-connect="([^"]*{following.pk}[^"]*)"', html_).group(1)
        with other.client.stream("GET", stream_url.replace("&amp;", "&")) as response:
            body = response.read().decode()
        first.close()
        second.close()
    told = " | 12:00" if won == "approve" else " | Not run: the user declined this call."
    assert told in body
    assert calls.get(pk=asking.pk).status == (
        Status.SUCCEEDED if won == "approve" else Status.DENIED)


def test_a_step_whose_round_died_goes_on_from_what_its_calls_left(user):
    first, asking = waiting_reply(user)
    following = Generation.objects.get(follows=first)
    # The last decision was taken, and its worker died before it ran the approved calls.
    ToolCall.objects.filter(pk=asking.pk).update(status=Status.APPROVED,
                                                 decided_at=timezone.now())
    assert stream.sweep()["lost"] == 0
    assert Generation.objects.get(pk=following.pk).waits_for_tools  # too soon to tell
    quiet = timezone.now() - timedelta(seconds=61)
    Generation.objects.filter(pk=following.pk).update(created_at=quiet)
    ToolCall.objects.update(created_at=quiet, decided_at=quiet)
    stream.sweep()
    assert sorted(name for name, *_ in ran) == ["get_time (approved)", "get_weather"]
    last = api.run(Generation.objects.get(pk=following.pk))
    assert last.content.endswith(" | 12:00")
    # Once every call has ended, only the step was left: the sweep lets it go, running nothing.
    second_first = api.run(api.send(user, "And in Rome?"))
    ToolCall.objects.filter(generation=second_first).update(
        status=Status.SUCCEEDED, result="done", created_at=quiet, decided_at=quiet,
        started_at=quiet, finished_at=quiet)
    Generation.objects.filter(follows=second_first).update(created_at=quiet)
    stream.sweep()
    assert not Generation.objects.get(follows=second_first).waits_for_tools
    assert len(ran) == 2


def test_the_next_step_is_let_go_only_once_every_call_of_its_step_has_ended(user):
    first, asking = waiting_reply(user)
    following = Generation.objects.get(follows=first)
    ToolCall.objects.filter(generation=first).update(status=Status.SUCCEEDED, result="x")
    ToolCall.objects.filter(pk=asking.pk).update(status=Status.RUNNING)  # another process's
    assert steps.make_ready(following) is False
    assert Generation.objects.get(pk=following.pk).waits_for_tools
    ToolCall.objects.filter(pk=asking.pk).update(status=Status.SUCCEEDED, result="12:00")
    assert steps.make_ready(following) is True
    assert steps.make_ready(following) is False  # once
    sent = Generation.objects.get(pk=following.pk).upstream_messages
    assert [m["content"] for m in sent[-2:]] == ["x", "12:00"]


def test_the_demos_tools_model_runs_its_weather_and_asks_before_the_time(user, settings):
    from project import settings as demo

    settings.CHATSTREAM_MODELS = {"demo-tools": demo.CHATSTREAM_MODELS["demo-tools"]}
    first = api.run(api.send(user, "Weather and time in Paris?"))
    asking = ToolCall.objects.get(generation=first, name="get_time")
    assert asking.status == Status.PENDING_APPROVAL
    last = api.run(api.decide(asking, user, approve=True))
    weather, time = last.content.removeprefix("Results: ").split(" | ")
    assert json.loads(weather) == {"city": "Paris", "sky": "fair", "temperature": 21,
                                   "unit": "celsius"}
    assert re.fullmatch(r"\d\d:\d\d", time)


def test_a_page_shown_while_a_steps_calls_run_looks_again_until_the_reply_goes_on(
        user, browser_for):
    first, asking = waiting_reply(user)
    browser = browser_for(user)
    page = browser.client.get(first.conversation.get_absolute_url()).text
    look_again = f'hx-get="/chat/m/{first.prompt_message_id}/" hx-trigger="load delay:2s"'
    assert look_again not in page  # waiting for the user: nothing to look for
    # After a reload, the same waiting card, from the database: its arguments and its buttons.
    assert f'action="/chat/t/{asking.pk}/approve/"' in page
    assert f'action="/chat/t/{asking.pk}/deny/"' in page
    assert "{&quot;timezone&quot;: &quot;Europe/Paris&quot;}" in page
    ToolCall.objects.filter(pk=asking.pk).update(status=Status.RUNNING)  # as a round leaves it
    page = browser.client.get(first.conversation.get_absolute_url()).text
    assert page.count(look_again) == 2  # the step's calls, and the step waiting for them
    ToolCall.objects.filter(generation=first).update(status=Status.SUCCEEDED, result="x")
    steps.make_ready(Generation.objects.get(follows=first))
    page = browser.client.get(first.conversation.get_absolute_url()).text
    assert look_again not in page and "sse-connect=" in page  # the next step streams


def test_an_approved_call_of_a_tool_the_model_no_longer_has_never_runs(user, settings):
    _, asking = waiting_reply(user)
    settings.CHATSTREAM_MODELS["agent"]["TOOLS"] = [TOOLS[0]]  # get_time taken away meanwhile
    last = api.run(api.decide(asking, user, approve=True))
    assert ToolCall.objects.get(pk=asking.pk).status == Status.CANCELLED
    assert [name for name, *_ in ran] == ["get_weather"]
    assert last.content.endswith(" | Not run: the reply was stopped before this call ran.")
