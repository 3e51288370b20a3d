"""Tools: declaring one with @tool, the schema the model is told, its arguments checked, a call
run (sync in the tools' own threads, async on the loop) with its timeout and its result."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from typing import Annotated, Any, Literal

import msgspec
import pytest
from django.contrib.auth import get_user_model

from chatstream.conf import conf
from chatstream.tools import (
    ArgumentsInvalid,
    Tool,
    ToolContext,
    ToolError,
    execute,
    resolve,
    tool,
    tools_of,
)

# --- tools, as a site declares them -----------------------------------------------------------


class Address(msgspec.Struct):
    city: str
    postcode: str | None = None


@dataclasses.dataclass
class Window:
    start: int
    end: int


@tool
def order_status(order_id: Annotated[int, msgspec.Meta(ge=1, description="The order's number")],
                 verbose: bool = False) -> dict[str, Any]:
    """Say where an order is.

    Staff notes: this paragraph is not sent to the model.
    """
    return {"order": order_id, "status": "shipped", "verbose": verbose}


@tool(needs_approval=True, timeout=2)
async def refund(order_id: int, reason: Literal["damaged", "late"], context: ToolContext,
                 ship_to: Address | None = None, windows: list[Window] | None = None) -> str:
    """Refund an order."""
    return f"refunded {order_id} for {context.user}"


@tool
def no_arguments() -> str:
    return "nothing needed"


# --- declaring ----------------------------------------------------------------------------------


def refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [key for key in node if key in ("$ref", "$defs")] + [
            found for value in node.values() for found in refs(value)]
    if isinstance(node, list):
        return [found for value in node for found in refs(value)]
    return []


def test_the_model_is_told_the_name_the_first_paragraph_and_the_parameters():
    assert order_status.spec() == {"type": "function", "function": {
        "name": "order_status",
        "description": "Say where an order is.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "integer", "minimum": 1,
                             "description": "The order's number"},
                "verbose": {"type": "boolean", "default": False},
            },
            "required": ["order_id"],
            "additionalProperties": False,
        },
    }}


def test_nested_types_are_inlined_an_object_schema_at_the_root_and_the_context_left_out():
    parameters = refund.spec()["function"]["parameters"]
    assert refs(parameters) == []
    assert parameters["type"] == "object" and parameters["additionalProperties"] is False
    assert set(parameters["properties"]) == {"order_id", "reason", "ship_to", "windows"}
    assert parameters["required"] == ["order_id", "reason"]
    assert parameters["properties"]["reason"] == {"enum": ["damaged", "late"]}
    # msgspec's versions order a union's members differently: find the object among them.
    address = next(m for m in parameters["properties"]["ship_to"]["anyOf"] if "type" in m
                   and m["type"] == "object")
    assert address["type"] == "object" and address["required"] == ["city"]
    window = next(m for m in parameters["properties"]["windows"]["anyOf"]
                  if m.get("type") == "array")["items"]
    assert window["properties"] == {"start": {"type": "integer"}, "end": {"type": "integer"}}
    json.dumps(parameters)  # as sent


def test_a_tool_without_parameters_or_docstring_is_an_empty_object():
    assert no_arguments.spec() == {"type": "function", "function": {
        "name": "no_arguments",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}}


def test_the_declared_function_is_still_the_sites_to_call():
    assert isinstance(order_status, Tool) and order_status.__wrapped__.__name__ == "order_status"
    assert order_status(7) == {"order": 7, "status": "shipped", "verbose": False}
    assert (order_status.needs_approval, order_status.timeout, order_status.is_async) == (
        False, 30.0, False)
    assert (refund.needs_approval, refund.timeout, refund.is_async) == (True, 2.0, True)
    assert refund.context_parameter == "context" and order_status.context_parameter is None


class Node(msgspec.Struct):
    children: list[Node]


def unannotated(order_id) -> str:  # type: ignore[no-untyped-def]
    return ""


def star_args(*order_ids: int) -> str:
    return ""


def positional_only(order_id: int, /) -> str:
    return ""


def recursive(tree: Node) -> str:
    return ""


def unknown_type(when: threading.Lock) -> str:
    return ""


@pytest.mark.parametrize(("declare", "says"), [
    pytest.param(lambda: tool(unannotated), "'order_id' has no annotation", id="unannotated"),
    pytest.param(lambda: tool(star_args), "'order_ids' must be one that can be passed by name",
                 id="star-args"),
    pytest.param(lambda: tool(positional_only), "positional-only", id="positional-only"),
    pytest.param(lambda: tool(recursive), "refers to itself", id="recursive-type"),
    pytest.param(lambda: tool(unknown_type), "cannot be described", id="type-with-no-schema"),
    pytest.param(lambda: tool(lambda: ""), "name must be", id="lambda"),
    pytest.param(lambda: tool(timeout=0)(no_arguments.func), "timeout must be", id="timeout-0"),
    pytest.param(lambda: tool(timeout=True)(no_arguments.func), "timeout must be",
                 id="timeout-bool"),
    pytest.param(lambda: tool(needs_approval="yes")(no_arguments.func), "needs_approval",
                 id="needs-approval-text"),
])
def test_a_function_the_model_could_not_call_is_refused_when_declared(declare, says):
    with pytest.raises(TypeError, match=says):
        declare()


# --- the model's arguments ------------------------------------------------------------------------


def test_arguments_are_validated_into_the_declared_types():
    values = refund.parse('{"order_id": 3, "reason": "late", "ship_to": {"city": "Lyon"}, '
                          '"windows": [{"start": 1, "end": 2}]}')
    assert values == {"order_id": 3, "reason": "late", "ship_to": Address(city="Lyon"),
                      "windows": [Window(1, 2)]}
    assert order_status.parse('{"order_id": 9}') == {"order_id": 9, "verbose": False}
    assert no_arguments.parse("") == {} and no_arguments.parse(" {} ") == {}


@pytest.mark.parametrize(("arguments", "says"), [
    pytest.param('{"order_id": "3"}', "Expected `int`, got `str` - at `$.order_id`", id="type"),
    pytest.param('{"order_id": 0}', ">= 1", id="constraint"),
    pytest.param("{}", "missing required field `order_id`", id="missing"),
    pytest.param('{"order_id": 1, "admin": true}', "unknown field `admin`", id="unknown-field"),
    pytest.param('{"order_id": 1', "not a JSON object", id="not-json"),
    pytest.param("[1]", "Expected `object`, got `array`", id="array"),
    pytest.param("", "missing required field", id="empty"),
])
def test_arguments_that_do_not_fit_are_refused_with_a_sentence_for_the_model(arguments, says):
    with pytest.raises(ArgumentsInvalid) as refused:
        order_status.parse(arguments)
    assert says in str(refused.value)


# --- running a call -----------------------------------------------------------------------------


def context(user: Any = "alice") -> ToolContext:
    return ToolContext(user=user, conversation=None, generation=None, call=None)


async def test_a_sync_tools_value_comes_back_as_json_from_the_tools_own_threads():
    seen = []

    @tool
    def where() -> dict[str, Any]:
        seen.append(threading.current_thread().name)
        return {"thread": "x", "ok": True}

    outcome = await execute(where, {}, context())
    assert (outcome.status, json.loads(outcome.result)) == ("succeeded", {"thread": "x",
                                                                          "ok": True})
    assert seen[0].startswith("chatstream-tool")


async def test_an_async_tool_gets_its_context_and_runs_on_the_loop():
    outcome = await execute(refund, refund.parse('{"order_id": 5, "reason": "late"}'),
                            context("bob"))
    assert (outcome.status, outcome.result, outcome.error) == ("succeeded", "refunded 5 for bob",
                                                               "")


async def test_a_tool_error_is_the_sentence_the_model_gets():
    @tool
    def picky() -> str:
        raise ToolError("No order 12 here; ask the user for the number on their receipt.")

    outcome = await execute(picky, {}, context())
    assert outcome.status == "failed"
    assert outcome.result == "No order 12 here; ask the user for the number on their receipt."


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_any_other_exception_is_logged_and_the_model_told_only_that_it_failed(
        is_async, caplog):
    secret = "".join(["hun", "ter2"])  # not in the source lines a traceback quotes

    def fail() -> str:
        raise RuntimeError(f"password={secret}")

    async def afail() -> str:
        fail()
        return ""

    broken = tool(afail if is_async else fail)
    with caplog.at_level(logging.INFO, logger="chatstream.tools"):
        outcome = await execute(broken, {}, context())
    assert outcome.status == "failed" and "hunter2" not in outcome.result
    assert outcome.result == "The tool failed; its error was logged on the server."
    assert outcome.error == "RuntimeError: password=hunter2"  # for staff, in the admin
    logged = [r for r in caplog.records if r.name == "chatstream.tools"]
    assert logged and "RuntimeError" in logged[0].getMessage()
    assert "hunter2" not in logged[0].getMessage()


async def test_an_async_tool_past_its_timeout_is_cancelled():
    ended = []

    @tool(timeout=0.2)
    async def slow() -> str:
        try:
            await asyncio.sleep(30)
        finally:
            ended.append("cancelled")
        return "late"

    outcome = await execute(slow, {}, context())
    assert outcome.status == "timed_out"
    assert outcome.result == "The tool did not answer within 0.2 seconds."
    assert ended == ["cancelled"]


async def test_a_sync_tool_past_its_timeout_is_not_waited_for_and_runs_to_its_end():
    release, finished = threading.Event(), threading.Event()

    @tool(timeout=0.2)
    def stuck() -> str:
        release.wait(30)
        finished.set()
        return "late"

    outcome = await execute(stuck, {}, context())
    assert outcome.status == "timed_out" and not finished.is_set()
    release.set()
    assert await asyncio.to_thread(finished.wait, 10)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_a_long_result_is_cut_with_a_sentence_saying_so(is_async, settings):
    settings.CHATSTREAM_MAX_TOOL_RESULT = 100

    def long() -> list[str]:
        return ["é" * 50] * 10

    async def along() -> list[str]:
        return long()

    outcome = await execute(tool(along if is_async else long), {}, context())
    whole = json.dumps(long(), ensure_ascii=False, separators=(",", ":"))
    assert outcome.status == "succeeded"
    assert outcome.result == whole[:100] + (
        f"\n[The result was cut here: it had {len(whole)} characters, 100 are shown.]")


async def test_a_result_that_is_not_json_fails_the_call():
    @tool
    def opaque() -> object:
        return threading.Lock()

    outcome = await execute(opaque, {}, context())
    assert outcome.status == "failed" and outcome.error.startswith("unserialisable result")


@pytest.mark.django_db(transaction=True)
async def test_a_sync_tool_reads_the_database_in_its_thread():
    user = await get_user_model().objects.acreate(username="carol")

    @tool
    def who(context: ToolContext) -> str:
        return get_user_model().objects.get(pk=context.user.pk).username

    assert (await execute(who, {}, context(user))).result == "carol"


def test_the_tools_threads_are_their_own_and_bounded():
    from chatstream.tools import _running

    assert _running.executor()._max_workers == conf.TOOL_THREADS == 8


# --- a model's tools ---------------------------------------------------------------------------


def test_a_models_tools_are_found_by_their_paths_and_named_by_their_functions(settings):
    settings.CHATSTREAM_MODELS = {"m": {"PROVIDER": "default", "TOOLS": [
        "tests.test_tools.order_status", "tests.test_tools.refund"]}}
    assert tools_of(conf.get_model("m")) == {"order_status": order_status, "refund": refund}
    assert resolve("tests.test_tools.no_arguments") is no_arguments
    with pytest.raises(TypeError, match="not a function declared with @tool"):
        resolve("tests.test_tools.unannotated")
