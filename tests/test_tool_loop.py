"""The tool loop against the simulated upstream: a reply that asks for tool calls leads to the
calls, then to the next upstream call with their results, as one reply of several steps.

The simulator's ``agent`` scenario asks for ``get_weather`` and ``get_time`` and, asked again
with their results, answers "Results: <first> | <second>".
"""

from __future__ import annotations

import html
import json
import logging
import re
import threading
import time
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection

from chatstream import api
from chatstream.exceptions import QuotaExceeded, RequestRefused, TooManyReplies
from chatstream.models import Generation, QuotaCharge, ToolCall
from chatstream.signals import tool_call_finished
from chatstream.tools import ToolContext, tool

from . import hooks_for_tests
from .conftest import read_events

pytestmark = pytest.mark.django_db(transaction=True)

Status = ToolCall.Status
ran: list[tuple[str, Any]] = []


@tool
def get_weather(city: str, unit: str, context: ToolContext) -> dict[str, Any]:
    """The weather in a city."""
    ran.append(("get_weather", city, context.call.pk, context.user.username))
    return {"city": city, "sky": "clear", "unit": unit}


@tool
async def get_time(timezone: str) -> str:
    """The time in a timezone."""
    ran.append(("get_time", timezone))
    return "12:00"


TOOLS = ["tests.test_tool_loop.get_weather", "tests.test_tool_loop.get_time"]


@pytest.fixture(autouse=True)
def agent(settings: Any, simulator: Any) -> str:
    ran.clear()
    settings.CHATSTREAM_MODELS = {"agent": {"PROVIDER": "default", "MODEL": "agent",
                                            "TOOLS": TOOLS}}
    return "agent"


@pytest.fixture
def user(make_user: Any) -> Any:
    return make_user()


def steps_of(first: Generation) -> list[Generation]:
    chain = [first]
    while (following := Generation.objects.filter(follows=chain[-1]).first()) is not None:
        chain.append(following)
    return chain


def test_a_reply_that_asks_for_tools_runs_them_and_answers_with_their_results(user, simulator):
    first = api.send(user, "Weather and time in Paris?")
    last = api.run(first)
    first.refresh_from_db()
    assert last.step == 2 and last.follows_id == first.pk
    assert last.status == Generation.Status.COMPLETED
    assert last.content == ('Results: {"city":"Paris","sky":"clear","unit":"celsius"} | 12:00')
    calls = list(ToolCall.objects.filter(generation=first))
    assert [(c.name, c.status) for c in calls] == [("get_weather", Status.SUCCEEDED),
                                                   ("get_time", Status.SUCCEEDED)]
    assert sorted(ran) == [("get_time", "Europe/Paris"),  # run at once: in either order
                           ("get_weather", "Paris", calls[0].pk, user.username)]
    # Two upstream calls: the first offered the tools, the second carried their results.
    first_request, second_request = (r.body for r in simulator.requests)
    assert [t["function"]["name"] for t in first_request["tools"]] == ["get_weather", "get_time"]
    assert [m["role"] for m in second_request["messages"]] == ["user", "assistant", "tool", "tool"]
    asked = second_request["messages"][1]["tool_calls"]
    assert [c["function"]["name"] for c in asked] == ["get_weather", "get_time"]
    results = second_request["messages"][2:]
    assert [r["tool_call_id"] for r in results] == [c["id"] for c in asked]
    assert json.loads(results[0]["content"]) == {"city": "Paris", "sky": "clear",
                                                 "unit": "celsius"}
    assert second_request["messages"] == last.upstream_messages
    # Each step is admitted and charged on its own.
    assert QuotaCharge.objects.filter(generation_id__in=[first.pk, last.pk]).count() == 2


def test_the_last_step_is_sent_without_tools(user, simulator, settings):
    settings.CHATSTREAM_MAX_TOOL_STEPS = 1
    last = api.run(api.send(user, "Weather?"))
    assert last.step == 1 and "tools" not in simulator.last_request.body
    assert not ToolCall.objects.exists() and ran == []


def test_a_next_step_the_quota_refuses_runs_none_of_the_calls(user, simulator, settings):
    # Room for the first step, not for a second that holds two results at their longest.
    settings.CHATSTREAM_DEFAULT_QUOTA = {"TOKENS_PER_DAY": 12_000}
    settings.CHATSTREAM_MAX_TOOL_RESULT = 40_000
    first = api.send(user, "Weather?")
    last = api.run(first)
    assert last.pk == first.pk and ran == []
    assert set(ToolCall.objects.values_list("status", flat=True)) == {Status.CANCELLED}
    assert Generation.objects.count() == 1 and len(simulator.requests) == 1


def test_request_hooks_run_for_every_step_and_may_refuse_one(user, settings):
    settings.CHATSTREAM_REQUEST_HOOKS = [hooks_for_tests.SYNC_HOOK]
    hooks_for_tests.reset()
    seen_steps: list[int] = []

    def refuse_the_second(call: Any) -> None:
        seen_steps.append(call.step)
        if call.step == 2:
            assert [m["role"] for m in call.messages][-2:] == ["tool", "tool"]
            raise RequestRefused("No second step here.")

    hooks_for_tests.state.sync_action = refuse_the_second
    first = api.send(user, "Weather?")
    last = api.run(first)
    assert seen_steps == [1, 2]
    assert last.step == 2 and last.status == Generation.Status.FAILED
    assert last.reason == "No second step here."
    assert [c.status for c in ToolCall.objects.all()] == [Status.SUCCEEDED] * 2


def test_a_tool_that_raises_tells_the_model_its_sentence(user, settings):
    settings.CHATSTREAM_MODELS["agent"]["TOOLS"] = [TOOLS[0], "tests.tools_failing.get_time"]
    last = api.run(api.send(user, "Weather?"))
    assert last.content.endswith(" | The clock is broken.")
    assert ToolCall.objects.get(name="get_time").status == Status.FAILED


def test_a_call_of_a_tool_the_model_does_not_have_is_told_so(user, settings):
    settings.CHATSTREAM_MODELS["agent"]["TOOLS"] = [TOOLS[0]]
    last = api.run(api.send(user, "Weather?"))
    assert last.content.endswith(
        " | Not run: there is no tool named 'get_time'. The tools are: get_weather.")
    assert ran == [("get_weather", "Paris", ToolCall.objects.get(name="get_weather").pk,
                    user.username)]


def events_of(browser: Any, url: str) -> list[tuple[str, str]]:
    with browser.client.stream("GET", url) as response:
        assert response.status_code == 200
        return [(name, data) for _, name, data in read_events(response) if name != "ping"]


def test_the_json_stream_tells_each_call_and_the_next_step(user, browser_for):
    browser = browser_for(user)
    first = api.send(user, "Weather?")
    events = events_of(browser, f"/chat/api/generations/{first.pk}/stream/")
    names = [name for name, _ in events]
    assert names[-2:] == ["step", "done"]
    told = [json.loads(data) for name, data in events if name == "tool"]
    calls = {call.name: str(call.pk) for call in ToolCall.objects.all()}
    news = {id_: [t["status"] for t in told if t["id"] == id_] for id_ in calls.values()}
    # Each call is told as it changes (news that come together are told once, as they left
    # it): recorded, started, ended, in that order.
    order = ["approved", "running", "succeeded"]
    for statuses in news.values():
        assert statuses[-1] == "succeeded" and statuses == sorted(set(statuses), key=order.index)
    last = {t["id"]: t for t in told}
    assert last[calls["get_time"]]["result"] == "12:00"
    assert last[calls["get_weather"]]["arguments"] == '{"city": "Paris", "unit": "celsius"}'
    assert {t["result"] for t in told if t["status"] != "succeeded"} <= {None}
    following = Generation.objects.get(follows=first)
    assert json.loads(events[-2][1]) == {
        "id": str(following.pk), "stream_url": f"/chat/api/generations/{following.pk}/stream/"}
    done = json.loads(events[-1][1])
    assert (done["id"], done["step"], done["follows"]) == (str(first.pk), 1, None)
    assert done["tool_calls_url"] == f"/chat/api/generations/{first.pk}/tool-calls/"
    rest = events_of(browser, json.loads(events[-2][1])["stream_url"])
    answered = json.loads(rest[-1][1])
    assert answered["content"].startswith("Results: ") and answered["step"] == 2
    assert (answered["follows"], answered["tool_calls_url"]) == (str(first.pk), None)


def test_the_page_shows_the_calls_as_cards_and_streams_the_next_step(user, browser_for):
    browser = browser_for(user)
    stream_url = browser.send(browser.new_conversation(), "Weather?")
    events = events_of(browser, stream_url)
    cards = [data for name, data in events if name == "tool"]
    assert cards and all(card.startswith('<div class="cs-toolcall" id="toolcall-')
                         for card in cards)
    assert any('data-status="running"' in card or 'data-status="succeeded"' in card
               for card in cards)
    (name, final), following = events[-1], Generation.objects.get(step=2)
    assert name == "done" and events[-2] == ("step", f"/chat/g/{following.pk}/stream/")
    # The step's final form holds its cards as they ended, then the next step's element.
    assert final.count('class="cs-toolcall"') == 2 and final.count('data-status="succeeded"') == 2
    assert "&quot;city&quot;: &quot;Paris&quot;" in final
    assert f'id="generation-{following.pk}"' in final and "sse-connect=" in final
    next_url = re.search(rf'sse-connect="([^"]*{following.pk}[^"]*)"', final).group(1)
    rest = events_of(browser, html.unescape(next_url))
    assert rest[-1][0] == "done" and "Results: " in rest[-1][1]
    # After a reload, the page shows the same cards and the answer.
    page = browser.client.get(f"/chat/c/{following.conversation_id}/").text
    assert page.count('class="cs-toolcall"') == 2 and "Results: " in page


def test_a_later_turn_carries_the_earlier_turns_tool_calls_and_results(user, simulator):
    first = api.run(api.send(user, "Weather?"))
    api.run(api.send(user, "And tomorrow?", conversation=first.conversation))
    asked = [r.body["messages"] for r in simulator.requests]
    third = asked[2]  # the second question's first step
    assert [m["role"] for m in third] == ["user", "assistant", "tool", "tool", "assistant",
                                          "user"]
    assert third[1:4] == first.upstream_messages[1:4]  # as the first reply's steps sent them
    assert third[4] == {"role": "assistant", "content": first.content}
    assert third[5] == {"role": "user", "content": "And tomorrow?"}


def test_retry_repeats_only_the_last_step_and_no_call_runs_again(user, simulator):
    first = api.send(user, "Weather?")
    last = api.run(first)
    assert len(ran) == 2
    again = api.run(api.retry(first))  # Retry of the reply, asked through its first step
    assert again.step == 2 and again.follows_id == first.pk and again.retry_of_id == last.pk
    assert again.content == last.content and len(ran) == 2
    assert ToolCall.objects.count() == 2
    assert simulator.requests[-1].body["messages"] == last.upstream_messages
    assert "tools" in simulator.requests[-1].body  # step 2 of 8 may still call tools


def test_a_reply_in_steps_counts_once_toward_the_replies_bound(user, settings):
    settings.CHATSTREAM_MAX_REPLIES_PER_MESSAGE = 2
    first = api.send(user, "Weather?")
    api.run(first)
    api.run(api.retry(first))
    with pytest.raises(TooManyReplies):
        api.retry(first)


def test_each_call_that_ran_is_told_to_the_site_and_logged(user, caplog):
    heard: list[tuple[str, str, Any]] = []

    def receiver(sender: Any, tool_call: ToolCall, **kwargs: Any) -> None:
        heard.append((tool_call.name, tool_call.status, sender))

    tool_call_finished.connect(receiver)
    try:
        with caplog.at_level(logging.INFO, logger="chatstream.tools"):
            api.run(api.send(user, "Weather?"))
    finally:
        tool_call_finished.disconnect(receiver)
    assert sorted(heard) == [("get_time", "succeeded", ToolCall),
                             ("get_weather", "succeeded", ToolCall)]
    lines = [r for r in caplog.records if r.name == "chatstream.tools"]
    weather = ToolCall.objects.get(name="get_weather")
    assert sorted(r.tool for r in lines) == ["get_time", "get_weather"]  # type: ignore[attr-defined]
    line = next(r for r in lines if r.tool == "get_weather")  # type: ignore[attr-defined]
    assert line.getMessage().startswith(
        f"tool call tool_call_id={weather.pk} generation_id={weather.generation_id} "
        f"user_id={user.pk} tool=get_weather status=succeeded decided_by=- duration_ms=")
    assert "Paris" not in line.getMessage()  # never its arguments or result


def test_stop_while_calls_run_lets_them_end_and_starts_no_next_step(user, settings, simulator):
    from . import tools_slow

    settings.CHATSTREAM_MODELS["agent"]["TOOLS"] = [TOOLS[0], "tests.tools_slow.get_time"]
    tools_slow.gate.clear()
    first = api.send(user, "Weather and time?")
    ended: list[Generation] = []
    running = threading.Thread(target=lambda: (ended.append(api.run(first)),
                                               connection.close()))
    running.start()
    deadline = time.monotonic() + 20
    while not ToolCall.objects.filter(name="get_time", status=Status.RUNNING).exists():
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.05)
    api.stop(first)  # the reply's Stop, while its step's calls run
    following = Generation.objects.get(follows=first)
    assert following.status == Generation.Status.CANCELLED
    tools_slow.gate.set()  # the call already running runs to its end
    running.join(30)
    assert ended and ended[0].pk == first.pk
    assert ToolCall.objects.get(name="get_time").status == Status.SUCCEEDED
    assert Generation.objects.get(pk=following.pk).status == Generation.Status.CANCELLED
    assert len(simulator.requests) == 1  # no upstream call for the stopped step


def test_a_reply_whose_calls_run_counts_toward_the_concurrent_limit(user, settings):
    from . import tools_slow

    settings.CHATSTREAM_DEFAULT_QUOTA = {"CONCURRENT_STREAMS": 1}
    settings.CHATSTREAM_MODELS["agent"]["TOOLS"] = [TOOLS[0], "tests.tools_slow.get_time"]
    tools_slow.gate.clear()
    first = api.send(user, "Weather and time?")
    running = threading.Thread(target=lambda: (api.run(first), connection.close()))
    running.start()
    try:
        deadline = time.monotonic() + 20
        while not ToolCall.objects.filter(name="get_time", status=Status.RUNNING).exists():
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.05)
        with pytest.raises(QuotaExceeded) as refused:
            api.send(user, "Something else?")
        assert refused.value.limit == "concurrent_streams"
    finally:
        tools_slow.gate.set()
        running.join(30)
    api.run(api.send(user, "Something else?"))  # once the reply has ended


def test_a_call_with_long_arguments_is_shown_folded_and_cut_on_the_page(user, settings,
                                                                        browser_for):
    city = "Llanfair" * 1000  # 8,000 characters: its card is escaped in a thread
    asked = json.dumps([["get_weather", json.dumps({"city": city, "unit": "celsius"})]])
    settings.CHATSTREAM_MODELS = {"agent": {"PROVIDER": "default", "TOOLS": TOOLS,
                                            "MODEL": "agent?tps=0&first_token_delay=0&"
                                                     f"tool_calls={quote(asked)}"}}
    browser = browser_for(user)
    events = events_of(browser, browser.send(browser.new_conversation(), "Weather?"))
    cards = [data for name, data in events if name == "tool"]
    # Its arguments, and its result (which quotes them), each cut at 4,000 characters.
    assert cards and all(len(card) < 9_000 for card in cards)
    final = events[-1][1]
    assert "<details>" in final and "Llanfair" in final and "…" in final
    assert ToolCall.objects.get().status == Status.SUCCEEDED
    assert json.loads(ToolCall.objects.get().result)["city"] == city  # the model gets it whole
