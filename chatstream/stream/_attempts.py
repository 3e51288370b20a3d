"""A reply's upstream calls: the first, its retries and its fallbacks, up to the commit point.

- **The order**: the model asked, called again up to ``CHATSTREAM_RETRIES`` times, then each of
  its fallbacks likewise. The fallbacks were chosen when the message was sent (those the user
  may use, with the same tools: ``Generation.fallbacks``); one whose context is too small for
  the request is skipped here. A model cooling down (_breaker.py) is skipped while a model
  after it may be called; the last one is waited for, if that fits the wait left.
- **What moves on**: only a failure before the reply's first content (text, reasoning or a
  tool call) was accepted: the provider could not be reached, answered HTTP 408, 409, 429 or
  5xx, went silent before its first byte, or broke its stream (an error event, a dropped
  connection) before any content. Once content is accepted the reply is this call's, however
  it ends: never continued on another model.
- **Waits**: before calling a model again, its ``Retry-After`` (if it sent one) or a backoff
  with jitter (0.5 s, doubled each time, its second half random); the waits of one reply come
  to at most ``CHATSTREAM_MAX_RETRY_WAIT`` seconds: a wait that would pass it is not made.

Each call is an :class:`~chatstream.models.Attempt`, kept in memory and saved with the reply's
outcome (see _ending.py), and a ``chat`` span under the reply's span (chatstream/telemetry).
The calls that failed before the reply's commit point are final from then on: the first
checkpoint after it writes them (see _checkpoints.py), so a worker that dies mid-reply leaves
them behind, and the final save writes only the rest.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
from django.utils import timezone

from .. import telemetry
from ..completions import ChatCompletionAccumulator
from ..conf import ModelChoice, conf
from ..exceptions import (
    IncompleteStreamError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamStreamError,
)
from ..models import Attempt, Generation
from ._breaker import breaker

RETRY_STATUSES = frozenset({408, 409, 429})
BACKOFF = 0.5  # seconds before the first call again; doubled each time after


def may_move_on(error: BaseException) -> bool:
    """Whether a call that failed with ``error``, before any content, may be made again or
    given to a fallback."""
    if isinstance(error, UpstreamHTTPError):
        return error.status is not None and (error.status in RETRY_STATUSES
                                             or error.status >= 500)
    if isinstance(error, UpstreamConnectError | httpx.TransportError):
        return True  # refused, reset, a timeout before the first byte, a dropped stream
    # An error event, or the stream's end, before any content.
    return isinstance(error, UpstreamStreamError | IncompleteStreamError)


def retry_after(error: BaseException) -> float | None:
    """The seconds ``error``'s ``Retry-After`` asks for (seconds or an HTTP date), if any."""
    value = getattr(error, "retry_after", "") or ""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = (when - timezone.now()).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


class Attempts:
    """The calls of one reply: which model comes next, how long to wait for it, and the
    records of the calls made."""

    def __init__(self, generation: Generation, chain: list[ModelChoice],
                 prompt_estimate: int) -> None:
        first, *fallbacks = chain
        self.generation_id = generation.pk
        self.telemetry = telemetry.reply(generation)
        self.span: telemetry.Attempt | None = None  # the call under way's
        # A fallback that cannot hold the request is never tried (the first was fitted to it).
        self.chain = [first, *(m for m in fallbacks if m.context_tokens >= prompt_estimate)]
        self.records: list[Attempt] = []
        self.wait_left = conf.MAX_RETRY_WAIT
        self.stored = 0  # how many of the records a checkpoint has written
        self._storing: asyncio.Future[None] | None = None  # a checkpoint writing some
        self._upto = 0  # the records before this one

    def plan(self) -> Iterator[tuple[ModelChoice, float]]:
        """Each model to call in turn, with the seconds to wait before calling it. The caller
        says how each call failed (:meth:`failed`) before asking for the next."""
        for position, model in enumerate(self.chain):
            later = self.chain[position + 1:]
            for number in range(conf.RETRIES + 1):
                wait = breaker.cooling(model.key)
                if wait and any(not breaker.cooling(m.key) for m in later):
                    break  # another model may be called now
                if number:
                    wait = max(wait, self._pause(number))
                if wait > self.wait_left:
                    break
                self.wait_left -= wait
                yield model, wait

    def _pause(self, number: int) -> float:
        """Seconds before calling a model the ``number``-th time again."""
        asked = self.records[-1].retry_after
        if asked is not None:
            return asked
        step = BACKOFF * 2 ** (number - 1)
        return step / 2 + random.uniform(0, step / 2)

    def started(self, model: ModelChoice, request: dict[str, Any]) -> Attempt:
        """A call of ``model`` with ``request`` (its body, as far as it is kept) starts."""
        record = Attempt(generation_id=self.generation_id, number=len(self.records) + 1,
                         model=model.key, started_at=timezone.now())
        self.records.append(record)
        self.span = self.telemetry.attempt(model, record.number, request=request)
        return record

    def first_chunk(self, response_model: str) -> None:
        if self.span is not None:
            self.span.first_chunk(response_model)

    async def failed(self, record: Attempt, error: BaseException, *,
                     http_status: int | None, request_id: str) -> bool:
        """``record``'s call failed with ``error`` before any content: note it (and tell the
        breaker); whether another call may be made."""
        record.status = Attempt.Status.FAILED
        record.http_status = http_status
        record.request_id = request_id[:200]
        record.error_type = _error_type(error)
        record.retry_after = retry_after(error)
        record.finished_at = timezone.now()
        if self.span is not None:
            self.span.end(error_type=record.error_type)
        if not may_move_on(error):
            return False
        await breaker.failed(record.model, retry_after=record.retry_after,
                             error_type=record.error_type)
        return True

    def ended(self, *, status: str, error_type: str, first_token_at: datetime | None,
              http_status: int | None, request_id: str, acc: ChatCompletionAccumulator) -> None:
        """The last call ended with the reply (``status``, the generation's, what ``acc``
        read of it); the reply's span ends."""
        self.telemetry.end(error_type or None)
        if not self.records or self.records[-1].finished_at is not None:
            return
        if self.span is not None:
            self.span.end(**_told(acc), error_type=error_type or None)
        record = self.records[-1]
        record.status = (Attempt.Status.SUCCEEDED if status == Generation.Status.COMPLETED
                         else Attempt.Status.FAILED)
        record.error_type = error_type[:50]
        record.first_token_at = first_token_at
        record.http_status = http_status
        record.request_id = request_id[:200]
        record.finished_at = timezone.now()
        if record.status == Attempt.Status.SUCCEEDED or first_token_at is not None:
            breaker.succeeded(record.model)

    @property
    def answered_by(self) -> str:
        return self.records[-1].model if self.records else ""

    # -- written with a checkpoint ---------------------------------------------------------------

    def to_store(self) -> list[Attempt]:
        """The records the next checkpoint writes, once the last call has committed (its caller
        knows): those of the calls that failed before it, not written yet and not being
        written. The caller then says whether they were (:meth:`stored_if`)."""
        if self._storing is not None or self.stored >= len(self.records) - 1:
            return []
        self._storing = asyncio.get_running_loop().create_future()
        self._upto = len(self.records) - 1
        return self.records[self.stored:self._upto]

    def stored_if(self, written: bool) -> None:
        """The checkpoint that was given :meth:`to_store`'s records has ended; it wrote them if
        ``written``."""
        if self._storing is None:
            return
        if written:
            self.stored = self._upto
        self._storing.set_result(None)
        self._storing = None

    async def unwritten(self) -> list[Attempt]:
        """The records no checkpoint has written, once one writing some has ended."""
        if self._storing is not None:
            await asyncio.shield(self._storing)
        return self.records[self.stored:]


def _told(acc: ChatCompletionAccumulator) -> dict[str, Any]:
    """What a call's span is told of its reply: its ids, finish reasons, usage and (read only
    for a site that opted in to content) choice 0's text."""
    usage = acc.usage or {}
    choice = acc.choices.get(0)

    def count(name: str) -> int | None:
        value = usage.get(name)
        return value if type(value) is int and value >= 0 else None

    return {"response_model": acc.model, "response_id": acc.id,
            "finish_reasons": [c.finish_reason for c in acc.choices.values() if c.finish_reason],
            "input_tokens": count("prompt_tokens"), "output_tokens": count("completion_tokens"),
            **({"text": choice.content, "reasoning": choice.reasoning,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                               for c in choice.tool_calls]}
               if choice is not None and conf.TELEMETRY_CONTENT else {})}


def _error_type(error: BaseException) -> str:
    if isinstance(error, UpstreamError):
        return str(error.error_type)[:50]
    if isinstance(error, httpx.TimeoutException):
        return "timeout"
    if isinstance(error, httpx.HTTPError):
        return "connection_lost"
    return type(error).__name__[:50]
