"""A step's calls: recorded from its reply and checked, each run at most once, and what the next
upstream call is told of them.

**Recorded and checked** (:func:`arecord`): one :class:`~chatstream.models.ToolCall` row per
call the reply asked for, in its order. The first ``CHATSTREAM_MAX_TOOL_CALLS`` are checked (a
tool the model may use, arguments that fit its parameters) and wait for approval or may run;
a call that fails a check, or comes after them, is ``failed`` at once, with a sentence for the
model, and never runs.

**At most once** (:func:`arun`): a call runs only from ``approved``, claimed by one conditional
UPDATE to ``running``: of any number of processes asking at once, exactly one runs it, and a
call that has started (``running`` or any later status) never runs again, whatever happens
after.

**Told to the model** (:func:`step_messages`): the assistant message that carried the calls and
one ``tool`` message per call, paired by an id: the provider's own when it gave one, unique in
its step; else one made from the call's row (some servers send none, or ``call_0`` for each).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.utils import timezone
from opentelemetry.context import Context

from .._failures import log_failure
from .._loops import in_executor
from ..conf import conf
from ..models import Generation, ToolCall
from ._declaring import ArgumentsInvalid, Tool, ToolContext
from ._running import Outcome, execute

logger = logging.getLogger("chatstream.tools")

Status = ToolCall.Status

# What the model is told of a call that did not run (in English: the model's words).
TOO_MANY = "Not run: a reply may ask for at most {limit} tool calls at once."
UNKNOWN = "Not run: there is no tool named {name!r}. The tools are: {names}."
DECLINED = "Not run: the user declined this call."
CANCELLED = "Not run: the reply was stopped before this call ran."
LOST = ("The outcome is unknown: the server stopped while the tool ran. It may or may not "
        "have taken effect.")
ERROR_LENGTH = 2000  # characters of an error kept for staff
# Statuses a call ends in: its result is what the model is told.
ENDED = frozenset({Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT})
# Statuses a call never leaves: it ran and ended, or it never will run.
FINAL = ENDED | {Status.LOST, Status.DENIED, Status.EXPIRED, Status.CANCELLED}


@dataclass(frozen=True)
class Asking:
    """What a ``needs_approval`` callable is given: the call's ``arguments`` (as the function
    would get them), its ``tool``, and who and where it is for."""

    tool: Tool
    arguments: dict[str, Any]
    user: Any
    conversation: Any
    generation: Generation


async def arecord(generation: Generation, tools: dict[str, Tool], *, user: Any,
                  conversation: Any) -> list[ToolCall]:
    """Rows for the calls ``generation``'s reply asked for (its ``tool_calls``), checked against
    ``tools`` (the model's, by name), saved in one statement; ``user`` and ``conversation`` are
    the generation's."""
    asking = Asking(None, {}, user, conversation, generation)  # type: ignore[arg-type]
    rows = []
    for position, asked in enumerate(generation.tool_calls):
        row = ToolCall(generation=generation, position=position,
                       call_id=str(asked.get("id") or "")[:200],
                       name=str(asked.get("name") or "")[:200],
                       arguments=str(asked.get("arguments") or ""))
        row.status = await _checked(row, position, asking, tools)
        rows.append(row)
    await ToolCall.objects.abulk_create(rows)
    return rows


async def _checked(row: ToolCall, position: int, asking: Asking, tools: dict[str, Tool]
                   ) -> str:
    """The status ``row`` starts in (its result set when it is ``failed``)."""
    if position >= conf.MAX_TOOL_CALLS:
        return _failed(row, TOO_MANY.format(limit=conf.MAX_TOOL_CALLS))
    tool = tools.get(row.name)
    if tool is None:
        return _failed(row, UNKNOWN.format(name=row.name[:64], names=", ".join(sorted(tools))))
    try:
        arguments = tool.parse(row.arguments)
    except ArgumentsInvalid as invalid:
        return _failed(row, str(invalid))
    asking = dataclasses.replace(asking, tool=tool, arguments=arguments)
    return Status.PENDING_APPROVAL if await _needs_approval(tool, asking) else Status.APPROVED


def _failed(row: ToolCall, result: str) -> str:
    row.result = result
    row.finished_at = timezone.now()
    return Status.FAILED


async def _needs_approval(tool: Tool, asking: Asking) -> bool:
    """The tool's ``needs_approval`` for this call; a callable that fails asks the user. A sync
    one runs in a thread, so it may use the ORM as a view does (it would fail on the loop)."""
    policy = tool.needs_approval
    if not callable(policy):
        return bool(policy)
    try:
        if iscoroutinefunction(policy) or iscoroutinefunction(
                getattr(policy, "__call__", None)):  # noqa: B004 - an async callable object
            answer = policy(asking)
        else:
            answer = await in_executor(policy)(asking)
        if inspect.isawaitable(answer):
            answer = await answer
    except Exception as error:
        log_failure(logger, error, "needs_approval of tool %s failed; the call waits for the "
                    "user's approval", tool.name)
        return True
    return bool(answer)


async def arun(call: ToolCall, tool: Tool, context: ToolContext,
               started: Callable[[], None] | None = None, *,
               parent: Context | None = None) -> bool:
    """Run ``call`` (approved, its tool ``tool``; ``context`` its user, conversation and
    generation) if nobody has started it, and save its outcome on it; False when it was not
    this caller's to run (run or stopped elsewhere). ``started()`` is called once it is this
    caller's, before the tool runs. Its span (see :func:`execute`) is a child of ``parent``:
    the step's reply span, when the engine hands it over."""
    now = timezone.now()
    if not await ToolCall.objects.filter(pk=call.pk, status=Status.APPROVED).aupdate(
            status=Status.RUNNING, started_at=now):
        return False
    call.status, call.started_at = Status.RUNNING, now
    if started is not None:
        started()
    context = dataclasses.replace(context, call=call)
    try:
        arguments = tool.parse(call.arguments)
    except ArgumentsInvalid as invalid:  # the tool changed since the call was checked
        outcome = Outcome(Status.FAILED, str(invalid), "arguments no longer fit the tool")
    else:
        outcome = await execute(tool, arguments, context, parent=parent)
    call.status, call.result, call.error = outcome.status, outcome.result, outcome.error[
        :ERROR_LENGTH]
    call.finished_at = timezone.now()
    await ToolCall.objects.filter(pk=call.pk, status=Status.RUNNING).aupdate(
        status=call.status, result=call.result, error=call.error, finished_at=call.finished_at)
    return True


def result_for_model(call: ToolCall) -> str:
    """What the model is told of ``call`` once it has ended (or will never run)."""
    if call.status in (Status.DENIED, Status.EXPIRED):
        return DECLINED
    if call.status == Status.CANCELLED:
        return CANCELLED
    if call.status == Status.LOST:
        return LOST
    return call.result


def step_messages(content: str, calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    """The assistant message that asked for ``calls`` (with its ``content``, if any) and a
    ``tool`` message for each, in the shapes the next upstream call sends."""
    calls = sorted(calls, key=lambda call: call.position)
    ids = _upstream_ids(calls)
    asked = {"role": "assistant", "content": content or None, "tool_calls": [
        {"id": ids[call.pk], "type": "function",
         "function": {"name": call.name, "arguments": call.arguments}} for call in calls]}
    return [asked, *({"role": "tool", "tool_call_id": ids[call.pk],
                      "content": result_for_model(call)} for call in calls)]


def _upstream_ids(calls: list[ToolCall]) -> dict[Any, str]:
    """Each call's id in the next request: the provider's, when it gave one no other call of
    the step has; else 9 letters and digits of the row's id (the shortest any provider asks)."""
    given = [call.call_id for call in calls]
    return {call.pk: call.call_id if call.call_id and given.count(call.call_id) == 1
            else call.pk.hex[:9] for call in calls}


def as_dict(call: ToolCall) -> dict[str, Any]:
    """``call`` as the JSON API and its stream give it."""
    return {"id": str(call.pk), "position": call.position, "name": call.name,
            "arguments": call.arguments, "status": call.status,
            "result": call.result if call.status in ENDED else None,
            "decided_at": _when(call.decided_at), "started_at": _when(call.started_at),
            "finished_at": _when(call.finished_at)}


def _when(at: Any) -> str | None:
    return at.isoformat() if at is not None else None


async def acancel_waiting(generation_id: Any) -> int:
    """End ``generation_id``'s calls that have not started (waiting for approval, or approved
    and not run): ``cancelled``, never to run. How many there were."""
    cancelled: int = await ToolCall.objects.filter(
        generation_id=generation_id, status__in=(Status.PENDING_APPROVAL, Status.APPROVED)
    ).aupdate(status=Status.CANCELLED, finished_at=timezone.now())
    return cancelled
