"""A step's tool calls: recorded and checked, each run at most once, and told to the model."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth import get_user_model

from chatstream.models import Conversation, Generation, Message, ToolCall
from chatstream.tools import (
    Asking,
    ToolContext,
    arecord,
    arun,
    result_for_model,
    step_messages,
    tool,
)

Status = ToolCall.Status
ran: list[tuple[str, Any]] = []


@tool
def order_status(order_id: int) -> dict[str, Any]:
    """Say where an order is."""
    ran.append(("order_status", order_id))
    return {"order": order_id, "status": "shipped"}


@tool(needs_approval=True)
def refund(order_id: int) -> str:
    """Refund an order."""
    ran.append(("refund", order_id))
    return "refunded"


def big_ones(asking: Asking) -> bool:
    return bool(asking.arguments["amount"] > 100)


async def abig_ones(asking: Asking) -> bool:
    return big_ones(asking)


def broken(asking: Asking) -> bool:
    raise RuntimeError("no")


@pytest.fixture(autouse=True)
def clear_ran() -> None:
    ran.clear()


def step_asking(*calls: dict[str, Any]) -> Generation:
    user = get_user_model().objects.create_user(f"u{Generation.objects.count()}")
    conversation = Conversation.objects.create(user=user)
    message = Message.objects.create(conversation=conversation, role="user", content="Hi")
    return Generation.objects.create(
        conversation=conversation, user=user, prompt_message=message, model="m",
        status="completed", finish_reason="tool_calls", tool_calls=list(calls))


def asked(name: str, arguments: str, call_id: str = "") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "name": name, "arguments": arguments}


async def record(generation: Generation, tools: dict[str, Any]) -> list[ToolCall]:
    user, conversation = await sync_to_async(lambda: (generation.user,
                                                      generation.conversation))()
    return await arecord(generation, tools, user=user, conversation=conversation)


TOOLS = {"order_status": order_status, "refund": refund}


# --- recorded and checked ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_each_call_is_a_row_checked_in_the_replys_order(settings):
    settings.CHATSTREAM_MAX_TOOL_CALLS = 4
    generation = await sync_to_async(step_asking)(
        asked("order_status", '{"order_id": 7}', "call_a"),
        asked("refund", '{"order_id": 7}', "call_b"),
        asked("delete_everything", "{}", "call_c"),
        asked("order_status", '{"order_id": "seven"}', "call_d"),
        asked("order_status", '{"order_id": 8}', "call_e"),
    )
    rows = await record(generation, TOOLS)
    stored = [row async for row in ToolCall.objects.filter(generation=generation)]
    assert [(r.position, r.call_id, r.name, r.status) for r in stored] == [
        (0, "call_a", "order_status", "approved"),
        (1, "call_b", "refund", "pending_approval"),
        (2, "call_c", "delete_everything", "failed"),
        (3, "call_d", "order_status", "failed"),
        (4, "call_e", "order_status", "failed"),
    ]
    assert [r.pk for r in rows] == [r.pk for r in stored]
    assert stored[2].result == ("Not run: there is no tool named 'delete_everything'. The tools "
                                "are: order_status, refund.")
    assert "Expected `int`, got `str` - at `$.order_id`" in stored[3].result
    assert stored[4].result == "Not run: a reply may ask for at most 4 tool calls at once."
    assert stored[0].arguments == '{"order_id": 7}' and not stored[0].result
    assert all(r.finished_at is not None for r in stored[2:]) and stored[0].finished_at is None
    assert ran == []  # recording runs nothing


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("policy", [big_ones, abig_ones], ids=["sync", "async"])
async def test_a_callable_decides_which_calls_need_approval_from_their_arguments(policy):
    def pay(amount: int) -> str:
        return "paid"

    pay_tool = tool(needs_approval=policy)(pay)
    generation = await sync_to_async(step_asking)( asked("pay", '{"amount": 20}'),
                                         asked("pay", '{"amount": 500}'))
    rows = await record(generation, {"pay": pay_tool})
    assert [row.status for row in rows] == ["approved", "pending_approval"]


def first_timers(asking: Asking) -> bool:
    """A sync policy that reads the database, as a site's would: a user's first call asks."""
    return not ToolCall.objects.filter(generation__user=asking.user,
                                       status="succeeded").exists()


@pytest.mark.django_db(transaction=True)
async def test_a_sync_approval_policy_may_read_the_database(caplog):
    def pay(amount: int) -> str:
        return "paid"

    generation = await sync_to_async(step_asking)(asked("pay", '{"amount": 20}'))
    with caplog.at_level(logging.ERROR, logger="chatstream.tools"):
        rows = await record(generation, {"pay": tool(needs_approval=first_timers)(pay)})
    assert rows[0].status == "pending_approval" and "failed" not in caplog.text
    await ToolCall.objects.filter(pk=rows[0].pk).aupdate(status="succeeded")
    later = await sync_to_async(step_asking)(asked("pay", '{"amount": 20}'))
    await Generation.objects.filter(pk=later.pk).aupdate(user=generation.user_id)
    later = await Generation.objects.aget(pk=later.pk)
    rows = await record(later, {"pay": tool(needs_approval=first_timers)(pay)})
    assert rows[0].status == "approved"


@pytest.mark.django_db(transaction=True)
async def test_a_failing_approval_policy_asks_the_user(caplog):
    def pay(amount: int) -> str:
        return "paid"

    generation = await sync_to_async(step_asking)( asked("pay", '{"amount": 20}'))
    with caplog.at_level(logging.ERROR, logger="chatstream.tools"):
        rows = await record(generation, {"pay": tool(needs_approval=broken)(pay)})
    assert rows[0].status == "pending_approval"
    assert "needs_approval of tool pay failed" in caplog.text


# --- run at most once -------------------------------------------------------------------------


def context_of(generation: Generation) -> ToolContext:
    return ToolContext(user=None, conversation=None, generation=generation, call=None)


@pytest.mark.django_db(transaction=True)
async def test_an_approved_call_runs_once_and_keeps_its_outcome():
    generation = await sync_to_async(step_asking)( asked("order_status", '{"order_id": 7}'))
    (call,) = await record(generation, TOOLS)
    assert await arun(call, order_status, context_of(generation)) is True
    assert await arun(call, order_status, context_of(generation)) is False
    stored = await ToolCall.objects.aget(pk=call.pk)
    assert (stored.status, stored.result) == ("succeeded", '{"order":7,"status":"shipped"}')
    assert stored.started_at is not None and stored.finished_at >= stored.started_at
    assert ran == [("order_status", 7)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", ["pending_approval", "denied", "expired", "cancelled",
                                    "failed", "lost", "timed_out", "succeeded"])
async def test_a_call_not_approved_or_already_started_never_runs(status):
    generation = await sync_to_async(step_asking)( asked("refund", '{"order_id": 7}'))
    (call,) = await record(generation, TOOLS)
    await ToolCall.objects.filter(pk=call.pk).aupdate(status=status)
    assert await arun(call, refund, context_of(generation)) is False
    assert ran == [] and (await ToolCall.objects.aget(pk=call.pk)).status == status


@pytest.mark.django_db(transaction=True)
def test_of_many_processes_asking_at_once_exactly_one_runs_the_call():
    generation = step_asking(asked("order_status", '{"order_id": 7}'))
    (call,) = async_to_sync(record)(generation, TOOLS)
    start = threading.Barrier(6)
    won: list[bool] = []

    def worker() -> None:
        from django.db import connection

        start.wait()
        # async_to_sync: the ORM's work runs on this thread, whose connection is closed below.
        won.append(async_to_sync(arun)(ToolCall.objects.get(pk=call.pk), order_status,
                                       context_of(generation)))
        connection.close()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(won) == [False] * 5 + [True]
    assert ran == [("order_status", 7)]


@pytest.mark.django_db(transaction=True)
async def test_a_call_whose_tool_changed_since_it_was_checked_fails_instead_of_running():
    generation = await sync_to_async(step_asking)( asked("order_status", '{"order_id": 7}'))
    (call,) = await record(generation, TOOLS)

    @tool
    def order_status(order_number: str) -> str:  # the site renamed the parameter since
        ran.append(("new", order_number))
        return ""

    assert await arun(call, order_status, context_of(generation)) is True
    stored = await ToolCall.objects.aget(pk=call.pk)
    assert stored.status == "failed" and "unknown field `order_id`" in stored.result
    assert ran == []


# --- told to the model -------------------------------------------------------------------------


def call(position: int, call_id: str, status: str, result: str = "") -> ToolCall:
    return ToolCall(position=position, call_id=call_id, name="order_status",
                    arguments=f'{{"order_id": {position}}}', status=status, result=result)


def test_the_next_request_carries_the_calls_and_one_result_for_each():
    calls = [call(1, "call_b", Status.FAILED, "No order 1."), call(0, "call_a",
                                                                    Status.SUCCEEDED, "shipped")]
    assert step_messages("Let me look.", calls) == [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_a", "type": "function",
             "function": {"name": "order_status", "arguments": '{"order_id": 0}'}},
            {"id": "call_b", "type": "function",
             "function": {"name": "order_status", "arguments": '{"order_id": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "shipped"},
        {"role": "tool", "tool_call_id": "call_b", "content": "No order 1."},
    ]


def test_empty_or_repeated_provider_ids_are_replaced_by_the_rows_own():
    calls = [call(0, "call_0", Status.SUCCEEDED, "a"), call(1, "call_0", Status.SUCCEEDED, "b"),
             call(2, "", Status.SUCCEEDED, "c"), call(3, "call_x", Status.SUCCEEDED, "d")]
    messages = step_messages("", calls)
    ids = [each["id"] for each in messages[0]["tool_calls"]]
    assert ids[3] == "call_x" and messages[0]["content"] is None
    assert ids[:3] == [c.pk.hex[:9] for c in calls[:3]] and len(set(ids)) == 4
    assert all(len(i) == 9 and i.isalnum() for i in ids[:3])
    assert [m["tool_call_id"] for m in messages[1:]] == ids  # each result paired with its call


@pytest.mark.parametrize(("status", "told"), [
    ("denied", "Not run: the user declined this call."),
    ("expired", "Not run: the user declined this call."),
    ("cancelled", "Not run: the reply was stopped before this call ran."),
    ("lost", "The outcome is unknown: the server stopped while the tool ran. It may or may not "
             "have taken effect."),
    ("timed_out", "its own words"),
    ("succeeded", "its own words"),
])
def test_what_the_model_is_told_of_each_ending(status, told):
    assert result_for_model(call(0, "c", status, "its own words")) == told
