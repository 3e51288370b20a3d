"""Running one call of a tool: its timeout, its failures, and the text the model gets back.

Sync tools run in an executor of their own (``CHATSTREAM_TOOL_THREADS`` threads per process),
never the one the streams and the store use: a slow tool can hold up other tools, never a
stream. Async tools run on the event loop, as tasks. Either way the call's result is waited
for ``timeout`` seconds at most: an async tool is then cancelled; a sync one cannot be, and
runs on in its thread to its end, its result dropped (a tool that waits on the network should
give its own calls a timeout). A sync call still queued for a thread when its time is up never
starts.

What a tool returns becomes text: a ``str`` as it is, anything else as JSON (msgspec: dicts,
lists, dataclasses, Structs, dates, UUIDs, Decimals...), encoded off the event loop, and cut at
``CHATSTREAM_MAX_TOOL_RESULT`` characters with a sentence saying so.

Each run has its span, ``execute_tool {name}`` (see chatstream/telemetry), current where the
tool runs (its own spans are its children), and ended when the call really ends: a sync call
that outlives its timeout ends its span in its thread, when it returns (``error.type``
``timeout``), and one that never started ends it on the loop. Its ``error.type`` is the
outcome's: ``timeout``, ``tool_error`` (the tool raised ``ToolError``),
``unserialisable_result``, ``cancelled``, or the qualified name of the exception it raised.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgspec
from django.db import close_old_connections
from opentelemetry.context import Context

from .. import telemetry
from .._failures import log_failure
from ..conf import conf
from ..models import ToolCall
from ._declaring import Tool, ToolContext, ToolError

logger = logging.getLogger("chatstream.tools")
Status = ToolCall.Status

# What the model is told when a call gives it nothing better (in English: the model's words,
# not the page's).
FAILED = "The tool failed; its error was logged on the server."
TIMED_OUT = "The tool did not answer within {timeout:g} seconds."
CUT = "\n[The result was cut here: it had {length} characters, {limit} are shown.]"


@dataclass(frozen=True)
class Outcome:
    """How a call ended: ``result`` is what the model gets; ``error`` what staff may read;
    ``error_type`` a short label of the failure, for the call's span."""

    status: str
    result: str
    error: str = ""
    error_type: str = ""


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """The tools' own threads (made on first use, ``CHATSTREAM_TOOL_THREADS`` of them)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(conf.TOOL_THREADS, thread_name_prefix="chatstream-tool")
        return _executor


async def execute(tool: Tool, arguments: dict[str, Any], context: ToolContext, *,
                  parent: Context | None = None) -> Outcome:
    """Run ``tool`` with ``arguments`` (as :meth:`Tool.parse` gave them) and ``context``, in
    the span ``execute_tool {name}``, a child of ``parent`` (None: of the current context)."""
    call = context.call
    span = telemetry.tool_call(
        tool.name, call_id=getattr(call, "call_id", ""), description=tool.description,
        conversation_id=getattr(context.conversation, "pk", None),
        arguments=getattr(call, "arguments", ""), parent=parent)
    if tool.context_parameter is not None:
        arguments = {**arguments, tool.context_parameter: context}
    loop = asyncio.get_running_loop()
    work: asyncio.Future[Outcome]
    in_thread: _InThread | None = None
    if tool.is_async:
        with span.current():  # the task runs in a copy of this context
            work = loop.create_task(_result_of_async(tool, arguments))
    else:
        in_thread = _InThread(tool, arguments, span)
        work = loop.run_in_executor(executor(), in_thread)
    outcome: Outcome | None = None
    try:
        outcome = await asyncio.wait_for(work, tool.timeout)
    except TimeoutError:
        logger.warning("Tool %s timed out after %g s (call %s).", tool.name, tool.timeout,
                       getattr(call, "pk", None))
        outcome = Outcome(Status.TIMED_OUT, TIMED_OUT.format(timeout=tool.timeout),
                          f"no result within {tool.timeout:g} s", "timeout")
    finally:
        if in_thread is None:
            _end(span, outcome)
        else:
            in_thread.waited(outcome)
    return outcome


def _end(span: telemetry.ToolCallSpan, outcome: Outcome | None) -> None:
    """End ``span`` as ``outcome`` ended the call (None: the wait for it was cancelled)."""
    if outcome is None:
        span.end("cancelled")
    else:
        span.end(outcome.error_type or None, outcome.result)


class _InThread:
    """A sync call in the tools' threads, with its span, which ends when the call really ends:
    in the thread once the tool returns (after its timeout, if it ran that long), or on the
    loop when the call never started (its time was up while it waited for a thread)."""

    __slots__ = ("_lock", "_state", "_timed_out", "arguments", "span", "tool")

    def __init__(self, tool: Tool, arguments: dict[str, Any],
                 span: telemetry.ToolCallSpan) -> None:
        self.tool, self.arguments, self.span = tool, arguments, span
        self._lock = threading.Lock()
        self._state = "queued"  # then "running" and "done", or "given up"
        self._timed_out = False

    def __call__(self) -> Outcome:
        with self._lock:
            if self._state == "given up":  # its time was up before a thread took it
                return Outcome(Status.TIMED_OUT, "", "never started", "timeout")
            self._state = "running"
        outcome: Outcome | None = None
        try:
            with self.span.current():
                outcome = _result_of_sync(self.tool, self.arguments)
            return outcome
        finally:
            with self._lock:
                self._state = "done"
                late = self._timed_out
            if late:  # the model was told it timed out, whatever it returned since
                self.span.end("timeout")
            else:
                _end(self.span, outcome)

    def waited(self, outcome: Outcome | None) -> None:
        """The loop's wait for the call ended with ``outcome`` (None: cancelled)."""
        with self._lock:
            never_started = self._state == "queued"
            if never_started:
                self._state = "given up"
            elif self._state == "running" and outcome is not None:  # it timed out
                self._timed_out = True
        if never_started:
            _end(self.span, outcome)


async def _result_of_async(tool: Tool, arguments: dict[str, Any]) -> Outcome:
    try:
        value = await tool.func(**arguments)
    except Exception as error:
        return _failure(tool, error)
    if isinstance(value, str):  # no encoding to move off the loop
        return Outcome(Status.SUCCEEDED, _bounded(value))
    return await asyncio.get_running_loop().run_in_executor(
        executor(), functools.partial(_text_of, tool, value))


def _result_of_sync(tool: Tool, arguments: dict[str, Any]) -> Outcome:
    close_old_connections()  # as a request's thread would: the tool may use the ORM
    try:
        value = tool.func(**arguments)
    except Exception as error:
        return _failure(tool, error)
    finally:
        close_old_connections()
    return _text_of(tool, value)


def _text_of(tool: Tool, value: Any) -> Outcome:
    if isinstance(value, str):
        return Outcome(Status.SUCCEEDED, _bounded(value))
    try:
        text = msgspec.json.encode(value).decode()
    except (TypeError, ValueError, OverflowError) as error:
        logger.error("Tool %s returned a %s, which cannot be sent to the model as JSON.",
                     tool.name, type(value).__name__)
        return Outcome(Status.FAILED, FAILED, f"unserialisable result: {error}",
                       "unserialisable_result")
    return Outcome(Status.SUCCEEDED, _bounded(text))


def _failure(tool: Tool, error: Exception) -> Outcome:
    if isinstance(error, ToolError):
        return Outcome(Status.FAILED, _bounded(error.message), f"ToolError: {error.message}",
                       "tool_error")
    log_failure(logger, error, "Tool %s raised; the model is told it failed", tool.name)
    return Outcome(Status.FAILED, FAILED, f"{type(error).__name__}: {error}"[:2000],
                   _qualified_name(type(error)))


def _qualified_name(kind: type) -> str:
    """An exception's type as ``error.type`` names it: ``ValueError``, ``httpx.ConnectError``."""
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _bounded(text: str) -> str:
    limit = conf.MAX_TOOL_RESULT
    if len(text) <= limit:
        return text
    return text[:limit] + CUT.format(length=len(text), limit=limit)
