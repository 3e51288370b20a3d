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
    """How a call ended: ``result`` is what the model gets; ``error`` what staff may read."""

    status: str
    result: str
    error: str = ""


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def executor() -> ThreadPoolExecutor:
    """The tools' own threads (made on first use, ``CHATSTREAM_TOOL_THREADS`` of them)."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(conf.TOOL_THREADS, thread_name_prefix="chatstream-tool")
        return _executor


async def execute(tool: Tool, arguments: dict[str, Any], context: ToolContext) -> Outcome:
    """Run ``tool`` with ``arguments`` (as :meth:`Tool.parse` gave them) and ``context``."""
    if tool.context_parameter is not None:
        arguments = {**arguments, tool.context_parameter: context}
    loop = asyncio.get_running_loop()
    work: asyncio.Future[Outcome]
    if tool.is_async:
        work = loop.create_task(_result_of_async(tool, arguments))
    else:
        work = loop.run_in_executor(executor(), functools.partial(_result_of_sync, tool, arguments))
    try:
        return await asyncio.wait_for(work, tool.timeout)
    except TimeoutError:
        logger.warning("Tool %s timed out after %g s (call %s).", tool.name, tool.timeout,
                       getattr(context.call, "pk", None))
        return Outcome(Status.TIMED_OUT, TIMED_OUT.format(timeout=tool.timeout),
                       f"no result within {tool.timeout:g} s")


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
        return Outcome(Status.FAILED, FAILED, f"unserialisable result: {error}")
    return Outcome(Status.SUCCEEDED, _bounded(text))


def _failure(tool: Tool, error: Exception) -> Outcome:
    if isinstance(error, ToolError):
        return Outcome(Status.FAILED, _bounded(error.message), f"ToolError: {error.message}")
    log_failure(logger, error, "Tool %s raised; the model is told it failed", tool.name)
    return Outcome(Status.FAILED, FAILED, f"{type(error).__name__}: {error}"[:2000])


def _bounded(text: str) -> str:
    limit = conf.MAX_TOOL_RESULT
    if len(text) <= limit:
        return text
    return text[:limit] + CUT.format(length=len(text), limit=limit)
