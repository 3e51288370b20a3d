"""The upstream pump: one generation's call to the provider, read into its reply.

The provider's request lives in the pump's task: cancelling the task closes it at once. The
bytes go one way, within the bounds of _bounds.py: ``SSEDecoder`` -> the reply's
``ChatCompletionAccumulator`` -> the reply's text and reasoning (see _reply.py); after each
network read the pump tells the run there is news, and once before that for the first words
of a reply (a fast provider's first read can hold the whole reply). However the call ends,
:meth:`Pump.run` returns its :class:`~._outcomes.Outcome` (a cancellation aside, which is the
run's to name).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import httpx
import orjson
from django.utils import timezone

from .. import provider
from .._failures import log_failure
from ..completions import ChatCompletionAccumulator
from ..conf import ModelChoice, conf
from ..domain.usage import characters_within, estimate_tokens, message_text
from ..exceptions import (
    IncompleteStreamError,
    ModelCoolingDown,
    ReplyTooLongError,
    UpstreamError,
)
from ..models import Attempt, Generation
from ..sse import SSEDecoder
from . import _bounds, _storable
from . import _outcomes as outcomes
from ._attempts import Attempts
from ._breaker import breaker
from ._outcomes import Outcome
from ._reply import Reply

logger = logging.getLogger("chatstream.lifecycle")

# ``news(text)``: the reply grew (its text if ``text``, else only its reasoning).
News = Callable[[bool], None]


class Pump:
    """The call to the provider of one run, and what it learnt (its ids, its status)."""

    __slots__ = ("answered", "attempts", "committed_at", "http_status", "id", "model", "news",
                 "params", "prompt_estimate", "reply", "request", "request_id", "tools",
                 "written")

    def __init__(self, generation: Generation, model: ModelChoice,
                 messages: list[dict[str, str]], params: dict[str, Any], reply: Reply,
                 news: News, tools: list[dict[str, Any]] | None = None,
                 fallbacks: list[ModelChoice] | None = None) -> None:
        self.id = generation.pk
        self.model = model  # the model called now (a fallback's, once one stands in)
        self.params = params
        self.tools = tools
        self.request = provider.build_request(model, messages, params, tools)
        self.prompt_estimate = estimate_tokens("".join(map(message_text, messages)))
        self.attempts = Attempts(generation, [model, *(fallbacks or ())], self.prompt_estimate)
        self.reply = reply
        self.news = news
        self.request_id = ""
        self.http_status: int | None = None
        self.answered = False  # the provider answered 2xx and began its stream
        self.committed_at: datetime | None = None  # when its first content was accepted
        self.written: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self) -> Outcome:
        """Call the provider and read its reply to the end, within ``CHATSTREAM_MAX_DURATION``:
        the outcome. Every failure becomes a stored, labelled outcome; a cancellation is raised."""
        try:
            async with asyncio.timeout(conf.MAX_DURATION):
                await self._call()
            return self._natural_end()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            self._log(error)
            if isinstance(error, UpstreamError) and error.status is not None:
                self.http_status = error.status
                self.request_id = error.request_id or self.request_id
            return outcomes.for_error(error, started=self.answered)
        finally:
            self._request_went()

    def _log(self, error: Exception) -> None:
        # Above DEBUG, no line holds what the provider sent (it may quote the reply or the
        # prompt): our errors' messages are our own words, others' are left to DEBUG.
        if isinstance(error, UpstreamError):
            logger.info("Generation %s ended early: %s", self.id, provider.redact(repr(error)))
            if error.detail:
                logger.debug("Generation %s: the provider said %r", self.id,
                             provider.redact(error.detail))
        elif isinstance(error, httpx.HTTPError | TimeoutError):
            logger.info("Generation %s ended early: %s", self.id, type(error).__name__)
            logger.debug("Generation %s ended early: %r", self.id, error)
        else:  # where it failed, without the exception's own words
            log_failure(logger, error, "Generation %s failed unexpectedly", self.id)

    async def _trace(self, event: str, _info: dict[str, Any]) -> None:
        """httpcore's trace extension: says when the request has been written."""
        if event.endswith("send_request_body.complete"):
            self._request_went()

    def _request_went(self) -> None:
        if not self.written.done():
            self.written.set_result(None)

    async def request_written(self, within: float) -> None:
        """Wait until the provider's request has been written (or its call has ended), for at
        most ``within`` seconds."""
        if not self.written.done():
            await asyncio.wait((self.written,), timeout=within)

    async def _call(self) -> None:
        """The reply's calls (see _attempts.py), until one is the reply's: it delivered content,
        ended, or failed in a way no other call would mend."""
        body = provider.encode_body(self.request)
        _sent_as(self.request)
        failure: BaseException | None = None
        await breaker.ready()
        for model, wait in self.attempts.plan():
            if wait:
                await asyncio.sleep(wait)
            if model is not self.model:
                body = self._request_for(model, body)
            record = self.attempts.started(model, self.request.body)
            try:
                await self._call_once(body)
                return
            except Exception as error:
                if self.committed_at is not None or not await self.attempts.failed(
                        record, error, http_status=self.http_status, request_id=self.request_id):
                    raise
                self._log(error)
                failure = error
            self._start_over()
        if failure is None:
            raise ModelCoolingDown("Every model this reply may use is cooling down after failing.",
                              provider=self.model.provider)
        raise failure

    async def _call_once(self, body: bytes) -> None:
        try:
            response = await provider.send(self.request, body, self._trace)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise provider.connect_error(exc, self.request) from exc
        try:
            self.request_id = response.headers.get("x-request-id", "")
            self.http_status = response.status_code
            await provider.raise_for_status(response, self.request)
            self.answered = True
            await self._read(response)
            if self.committed_at is None and not self._complete():  # a drop before any content
                raise _incomplete()
        finally:
            await response.aclose()

    def _request_for(self, model: ModelChoice, body: bytes) -> bytes:
        """The body of the same request to ``model``, a fallback: its own parameters, and no
        more tokens than the model asked would have had (what the quota holds)."""
        sent = orjson.loads(body)
        params = {**self.params, "max_tokens": min(model.max_tokens, sent["max_tokens"])}
        self.request = provider.build_request(model, sent["messages"], params, self.tools)
        self.model = model
        body = provider.encode_body(self.request)
        _sent_as(self.request)
        return body

    def _start_over(self) -> None:
        """Forget what a call that failed before any content left (its ids, an empty start)."""
        self.reply.acc = ChatCompletionAccumulator()
        self.request_id = ""
        self.http_status = None
        self.answered = False

    async def _read(self, response: httpx.Response) -> None:
        """Read the reply within its bounds (see _bounds.py). Past one, ReplyTooLongError: the
        upstream is closed, the text so far kept."""
        reply = self.reply
        decoder = SSEDecoder(max_event_size=conf.MAX_EVENT_SIZE)
        acc, add, add_reasoning = reply.acc, reply.add, reply.add_reasoning
        cap = acc.limit = conf.MAX_REPLY_LENGTH  # one payload's entries are bounded too
        room = cap - len(reply.so_far())  # characters of content still allowed
        per_choice = characters_within(self.model.max_tokens)
        # The raw bytes, inflated here if need be: httpx would inflate a compressed reply (which
        # we asked not to get) a whole network read at a time, without bound.
        raw = response.aiter_raw()
        chunks = _bounds.provider_bytes(raw, response.headers.get("content-encoding", ""),
                                        limit=cap * _bounds.BYTES_PER_CHARACTER)
        cut: ReplyTooLongError | None = None
        first = True  # nothing read yet: the first words go out before the rest of their read
        async for chunk in chunks:
            if first:
                self.attempts.first_chunk(acc.model)
            grew = reasoned = False
            for event in decoder.feed(chunk):
                delta = acc.feed(event.data, event=event.event)
                if reasoning := acc.reasoning_added:  # bounded with the rest by past_bounds
                    if "\x00" in reasoning:  # which PostgreSQL cannot store (see _storable.py)
                        reasoning = _storable.text(reasoning)
                    add_reasoning(reasoning)
                    reasoned = True
                if delta:
                    if "\x00" in delta:  # the same length: the stream's ids hold
                        delta = _storable.text(delta)
                    room -= len(delta)
                    if room < 0:  # keep the part within the cap
                        delta = delta[:room]
                        cut = ReplyTooLongError(
                            f"The reply passed {cap} characters (CHATSTREAM_MAX_REPLY_LENGTH) "
                            "and was cut there.")
                    if delta:
                        add(delta)
                        grew = True
                    if cut is not None:
                        break
                if self.committed_at is None and (delta or reasoning or _tool_input(acc)):
                    self.committed_at = timezone.now()  # the reply is this call's from here
                if first and (grew or reasoned):
                    first = False
                    reply.read(grew=grew, reasoned=reasoned)
                    self.news(grew)
                    grew = reasoned = False
                    await asyncio.sleep(0)  # the relay's turn: it sends them now
            if grew or reasoned:
                reply.read(grew=grew, reasoned=reasoned)
                self.news(grew)
            if cut is None:
                cut = _bounds.past_bounds(acc, cap, per_choice, self.model.max_tokens)
            if cut is not None:
                raise cut
            if acc.done:
                await _drain(raw)
                return
        decoder.close()

    # -- what a checkpoint writes of its calls (see _checkpoints.py) ----------------------------

    def checkpoint_fields(self, fields: dict[str, Any] | None) -> dict[str, Any] | None:
        """A checkpoint's ``fields`` of the reply, with the model answering once its call has
        committed: a worker that dies from here leaves the sweeper the model to name, and to
        price the reply at."""
        if fields is not None and self.committed_at is not None:
            fields["answered_by"] = self.attempts.answered_by
        return fields

    def calls_to_store(self) -> list[Attempt]:
        """The records of the calls that failed before the reply's commit point, for the
        checkpoint that carries ``answered_by`` to write (once)."""
        return self.attempts.to_store() if self.committed_at is not None else []

    def ended(self, outcome: Outcome) -> dict[str, Any]:
        """The reply ended with ``outcome``: its last call's record closed with it; the field
        the final save adds (the model whose call gave the reply)."""
        attempts = self.attempts
        attempts.ended(status=outcome.status, error_type=outcome.error_type,
                       first_token_at=self.committed_at, http_status=self.http_status,
                       request_id=self.request_id, acc=self.reply.acc)
        return {"answered_by": attempts.answered_by}

    def _complete(self) -> bool:
        """Whether the stream ended as a reply does: ``[DONE]``, or a finish reason."""
        choice = self.reply.acc.choices.get(0)
        return self.reply.acc.done or (choice is not None and bool(choice.finish_reason))

    def _natural_end(self) -> Outcome:
        return outcomes.COMPLETED if self._complete() else outcomes.for_error(
            _incomplete(), started=True)


def _incomplete() -> IncompleteStreamError:
    return IncompleteStreamError("The stream ended before the reply was complete.")


def _sent_as(request: provider.UpstreamRequest) -> None:
    """``request`` is sent as bytes from here on: the prompt is held once, not twice. What the
    telemetry of its calls reads of it is kept: its parameters, and its messages only for a site
    that puts them in its spans."""
    if not conf.TELEMETRY_CONTENT:
        request.body = {k: v for k, v in request.body.items() if k not in ("messages", "tools")}


def _tool_input(acc: ChatCompletionAccumulator) -> bool:
    return any(choice.tool_calls for choice in acc.choices.values())


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (normally nothing) so the connection can be reused."""
    try:
        async with asyncio.timeout(0.25):
            async for _ in chunks:
                pass
    except (TimeoutError, httpx.HTTPError):
        pass
