"""What a generation's start and end tell the host site: its signals, and one log line.

The line (logger ``chatstream.generations``, INFO) carries what the admin shows of the
generation, never its text, as ``key=value`` pairs in the message and as the record's own
attributes (``extra``), for a JSON formatter: ``generation_id``, ``user_id``, ``model``,
``status``, ``error_type``, ``finish_reason``, ``ttft_ms``, ``duration_ms``,
``prompt_tokens``, ``cached_tokens``, ``completion_tokens`` and ``usage_source``; then
``attempts``, the number of upstream calls made, when the engine left them on the generation
(``LOADED_ATTEMPTS``: never a query here, on the event loop), and
``answered_by`` when a fallback answered, not the model asked. A value other
than a plain word (ASCII letters, digits and ``_.:/@+-``) is written as a JSON string, escapes
and all: what a provider sent (its ``finish_reason``) can neither end the line nor add a pair.

A tool call that ran has its own line (logger ``chatstream.tools``, INFO), in the same form:
``tool_call_id``, ``generation_id``, ``user_id``, ``tool``, ``status``, ``decided_by`` and
``duration_ms``; never its arguments or result.

From the event loop, signals go out in a task of their own, on the shared executor, so a slow
receiver never holds a stream (its ``done`` is sent already, or is not waiting for it); with no
receiver, nothing is scheduled at all.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import logging
import re
from datetime import timedelta
from typing import Any

from django.dispatch import Signal

from .._failures import log_failure
from .._loops import in_executor
from ..models import LOADED_ATTEMPTS, Generation, ToolCall
from ..signals import generation_finished, generation_started, tool_call_finished

logger = logging.getLogger("chatstream.generations")
tools_logger = logging.getLogger("chatstream.tools")
signals_logger = logging.getLogger("chatstream.signals")

_sending: set[asyncio.Task[Any]] = set()

# A value the line shows as it is; anything else goes in quotes (see the module docstring).
_PLAIN = re.compile(r"[\w.:/@+-]+", re.ASCII)


def started(generation: Generation) -> None:
    """A stream claimed ``generation`` (from the event loop)."""
    if generation_started.has_listeners(Generation):
        # A copy: the stream goes on changing its own while the receivers run.
        _in_background(generation_started, generation=copy.copy(generation))


def finished(generation: Generation) -> None:
    """``generation``'s final status is committed (from the event loop)."""
    log_end(generation)
    if generation_finished.has_listeners(Generation):
        _in_background(generation_finished, generation=generation)


def finished_now(generation: Generation) -> None:
    """``generation``'s final status is committed (from sync code: the sweeper, a refusal)."""
    log_end(generation)
    send_robust(generation_finished, generation=generation)


async def sent() -> None:
    """Wait for the signals this event loop is still sending (before a loop of its own ends,
    as ``chatstream.api.run``'s does)."""
    loop = asyncio.get_running_loop()
    # Only those not done: a task that has just ended leaves the set in a done callback the
    # loop runs a moment later, and gathering only done tasks never yields to the loop.
    while pending := [t for t in _sending if t.get_loop() is loop and not t.done()]:
        await asyncio.gather(*pending, return_exceptions=True)


def call_finished(call: ToolCall, user_id: Any) -> None:
    """``call``, of ``user_id``'s reply, ran and its outcome is saved (from the event loop):
    its log line and ``tool_call_finished``."""
    _log_call(call, user_id)
    if tool_call_finished.has_listeners(ToolCall):
        _in_background(tool_call_finished, sender=ToolCall, tool_call=call)


def call_finished_now(call: ToolCall, user_id: Any) -> None:
    """:func:`call_finished`, from sync code (the sweeper)."""
    _log_call(call, user_id)
    send_robust(tool_call_finished, sender=ToolCall, tool_call=call)


def _log_call(call: ToolCall, user_id: Any) -> None:
    if not tools_logger.isEnabledFor(logging.INFO):
        return
    ran = (call.finished_at - call.started_at
           if call.finished_at is not None and call.started_at is not None else None)
    fields: dict[str, Any] = {
        "tool_call_id": str(call.pk), "generation_id": str(call.generation_id),
        "user_id": user_id, "tool": call.name, "status": call.status,
        "decided_by": call.decided_by_id, "duration_ms": _ms(ran),
    }
    tools_logger.info("tool call %s", " ".join(f"{k}={_text(v)}" for k, v in fields.items()),
                      extra=fields)


def send_robust(signal: Signal, sender: type = Generation, **arguments: Any) -> None:
    """Send ``signal`` to every receiver; one that raises is logged and the others still run."""
    for receiver, result in signal.send_robust(sender=sender, **arguments):
        if isinstance(result, Exception):  # its words may quote the generation's text
            log_failure(signals_logger, result, "A receiver of a chatstream signal failed: %r",
                        receiver)


def _in_background(signal: Signal, sender: type = Generation, **arguments: Any) -> None:
    # A fresh context: the task outlives the request that started it, and must not run its
    # sync receivers on that request's thread.
    task = asyncio.get_running_loop().create_task(
        in_executor(send_robust)(signal, sender, **arguments), context=contextvars.Context())
    _sending.add(task)
    task.add_done_callback(_sending.discard)


def log_end(generation: Generation) -> None:
    if not logger.isEnabledFor(logging.INFO):
        return
    fields: dict[str, Any] = {
        "generation_id": str(generation.pk),
        "user_id": generation.user_id,
        "model": generation.model,
        "status": generation.status,
        "error_type": generation.error_type,
        "finish_reason": generation.finish_reason,
        "ttft_ms": _ms(generation.time_to_first_token),
        "duration_ms": _ms(generation.duration),
        "prompt_tokens": generation.prompt_tokens,
        "cached_tokens": generation.cached_tokens,
        "completion_tokens": generation.completion_tokens,
        "usage_source": generation.usage_source,
    }
    # Left by the engine on the object it reports, the calls it made: counting the rows would
    # cost a query on the event loop for every reply.
    attempts = getattr(generation, LOADED_ATTEMPTS, None)
    if isinstance(attempts, list):
        fields["attempts"] = len(attempts)
    if generation.answered_by and generation.answered_by != generation.model:
        fields["answered_by"] = generation.answered_by
    logger.info("generation %s", " ".join(f"{k}={_text(v)}" for k, v in fields.items()),
                extra=fields)


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else round(value.total_seconds() * 1000)


def _text(value: object) -> str:
    if value is None or value == "":
        return "-"
    text = str(value)
    return text if _PLAIN.fullmatch(text) else json.dumps(text)
