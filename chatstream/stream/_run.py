"""One generation's life: claim, stream, checkpoint, finish, stop.

The data path runs one way: upstream bytes -> ``SSEDecoder`` -> ``ChatCompletionAccumulator``
-> :class:`Run` (the text so far) -> browser events, and periodic checkpoints to the database.
A reasoning model's thinking (choice 0's reasoning) takes the same path beside the reply's text:
``thinking`` events, sent before the reply's deltas and never counted in their ids, and the
``reasoning`` field of each checkpoint and of the final save.

Guarantees:

- **Claim once.** Only the request whose ``UPDATE ... WHERE status='pending'`` changes the row
  calls the provider; every other request for the generation follows the stored text.
- **The provider's request lives in one task** (the pump), cancelled the moment the browser
  goes away (the request task's cancellation, or its done-callback when Django is blocked in a
  ``send``), when a Stop arrives from any process, or when a deadline passes.
- **The outcome is saved before the terminal ``done`` event**, and again, shielded, if the
  browser left first; the partial text is kept on every outcome.
- **The final save cannot fail on provider data**: every field is fitted to its column
  (_storable.py), and the text shown is the text stored. Should it fail all the same (the
  database refused it, its connection dropped), the outcome, text and usage are saved on their
  own and the quota hold settled (``store.finish_anyway``).
- **Bounded database work**: the claim, at most one checkpoint per
  ``CHATSTREAM_CHECKPOINT_INTERVAL`` (batched across streams, see _checkpoints.py), and one
  final transaction. No database connection is held while streaming.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import httpx
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from .. import provider, reporting, store
from .._failures import log_failure
from ..completions import ChatCompletionAccumulator, compact
from ..conf import DETACH, ModelChoice, conf
from ..exceptions import (
    IncompleteStreamError,
    ReplyTooLongError,
    UpstreamError,
)
from ..models import Generation
from ..sse import SSEDecoder
from ..store import Render
from ..usage import characters_within, estimate_tokens, usage_fields
from . import _bounds, _following, _serving, _stopping, _storable, _wire
from . import _outcomes as outcomes
from ._checkpoints import checkpointer, interval
from ._following import Feed
from ._outcomes import Outcome
from ._wire import Wire

logger = logging.getLogger("chatstream.lifecycle")

T = TypeVar("T", bytes, str)


# How long a front that starts the run early lets the provider's request go out before its own
# response headers (both are writes on the same loop; the provider's is on the critical path).
_FIRST_WRITE_WAIT = 0.1

# Final saves that outlive their request (after a send that never returned); kept referenced.
_background: set[asyncio.Task[Any]] = set()


class _Nowhere(list[str]):
    """The outbox of a run whose browser has left: what is put in it is dropped."""

    def append(self, item: str) -> None:
        pass


_NOWHERE = _Nowhere()


class Run:
    """The live half of one claimed generation: its pump, its relay, its final save."""

    # One per open stream: slots keep each a few hundred bytes instead of a dict.
    __slots__ = (
        "_listen", "_ping_timer", "_pump", "_sent_at", "_waiter", "_winding", "_written", "acc",
        "decoder", "feed", "finished", "first_token_at", "generation", "http_status",
        "id", "model", "outbox", "outcome", "parts", "polls_for_stop", "prompt_estimate",
        "request", "request_id", "saved", "started", "stop_outcome", "text", "thinking",
        "thought", "verify_stop", "watched_until",
    )

    def __init__(self, claim: store.Claim, model: ModelChoice) -> None:
        self.generation = claim.generation
        self.id: UUID = claim.generation.pk
        self.model = model
        self.request = provider.build_request(model, claim.messages,
                                              claim.generation.upstream_params)
        self.prompt_estimate = estimate_tokens("".join(m["content"] for m in claim.messages))
        # The conversation is in the request now; an open stream need not hold it twice (it
        # can be long). Deleted, the field is deferred: a save() would leave it alone.
        del self.generation.upstream_messages
        self.decoder = SSEDecoder(max_event_size=conf.MAX_EVENT_SIZE)
        self.acc = ChatCompletionAccumulator()
        # The reply so far (choice 0): ``text`` as of the last checkpoint, then the deltas since.
        # Joined at each checkpoint, so an open stream holds its text as one string, not as
        # a list of small ones (which cost ~60 bytes per delta).
        self.text = ""
        self.parts: list[str] = []
        self.outbox: list[str] = []  # deltas not yet sent to the browser
        # Reasoning not yet sent to the browser; the reasoning itself is held once, by the
        # accumulator (choice 0's), and read from there at checkpoints.
        self.thinking: list[str] = []
        self.thought = False  # reasoning arrived since the last checkpoint
        self.first_token_at: datetime | None = None
        self.request_id = ""
        self.http_status: int | None = None
        self.started = False  # the provider answered 2xx and began its stream
        self.polls_for_stop = True  # until a channel layer subscription says otherwise
        self.verify_stop = False  # subscribed: the next checkpoint pass reads the flag once
        self.watched_until = 0.0  # monotonic time until which a page is known to show it
        self.outcome: Outcome | None = None  # set once the pump has ended
        self.stop_outcome: Outcome | None = None
        self.saved = False
        self.finished = False  # the outcome is saved
        self.feed: Feed | None = None  # pages of this process following the reply
        self._waiter: asyncio.Future[bool] | None = None
        self._sent_at = 0.0  # loop time of the last event sent to the browser
        self._ping_timer: asyncio.TimerHandle | None = None
        self._pump: asyncio.Task[None] | None = None
        self._listen: asyncio.Task[None] | None = None
        self._winding: asyncio.Task[None] | None = None
        self._written: asyncio.Future[None] | None = None  # the provider's request went out

    # -- towards the browser ---------------------------------------------------------------------

    def start(self) -> None:
        """Call the provider (once): the pump, the Stop subscription, the checkpoints.

        The run is tied to the calling task, which must be the one that sends the response:
        when it ends, however it ends (the client left while Django was blocked in
        ``send()``, or the body was never iterated), the run winds down and saves.
        """
        if self._pump is not None:
            return
        loop = asyncio.get_running_loop()
        self._sent_at = loop.time()
        self._written = loop.create_future()
        self._pump = loop.create_task(self._run_pump())
        self._listen = loop.create_task(self._listen_for_stop())
        checkpointer().add(self)
        request_task = asyncio.current_task()
        if request_task is not None:
            request_task.add_done_callback(self._on_request_done)

    async def request_written(self, within: float) -> None:
        """Wait until the provider's request has been written (or its call has ended), for at
        most ``within`` seconds."""
        if self._written is not None and not self._written.done():
            await asyncio.wait((self._written,), timeout=within)

    async def events(self, wire: Wire[T]) -> AsyncGenerator[T, None]:
        """The stream of a started run, written by ``wire``: batched reasoning and deltas as
        they arrive (reasoning first: it comes before the text it leads to), pings in silence,
        then the outcome."""
        loop = asyncio.get_running_loop()
        self.start()
        try:
            sent = _wire.Sent()
            thought = _wire.Sent()  # the reasoning's line ends, as the text's (no ids)
            while True:
                if self.thinking:
                    text = thought.piece("".join(self.thinking))
                    self.thinking.clear()
                    if text:
                        self._sent_at = loop.time()
                        yield wire.thinking(text)
                    continue  # more may have come meanwhile: reasoning still goes first
                if self.outbox:
                    text = sent.piece("".join(self.outbox))
                    self.outbox.clear()
                    if text:
                        self._sent_at = loop.time()
                        chunk = wire.delta(text, sent)
                        yield chunk + await wire.blocks() if wire.pending else chunk
                elif self.outcome is not None:
                    break
                elif not await self._wait():
                    self._sent_at = loop.time()
                    yield wire.ping
            outcome = self.outcome
            final = await self._save(outcome, wire.render)
            if outcome.notice:
                yield await wire.error(outcome.notice)
            yield await wire.done(final)
        finally:
            if self._ping_timer is not None:
                self._ping_timer.cancel()
            await asyncio.shield(self._wind_down_once())

    def _wind_down_once(self) -> asyncio.Task[None]:
        if self._winding is None:
            self._winding = asyncio.get_running_loop().create_task(self._wind_down())
            _background.add(self._winding)
            self._winding.add_done_callback(_background.discard)
        return self._winding

    async def _wind_down(self) -> None:
        """End the run: the browser left (or the reply ended); save if not saved yet.

        What a browser leaving mid-reply does is the site's choice (``CHATSTREAM_ON_DISCONNECT``).
        ``"detach"``: the reply goes on to its end. ``"abort"``: it is cancelled at once, unless
        a page has just shown it (a reload, another tab, this page reconnecting) or
        ``CHATSTREAM_RECONNECT_GRACE`` leaves the page time to come back for it: then it goes on
        while a page watches it (see :meth:`_while_watched`).
        """
        if self._pump is not None and not self._pump.done() and self.stop_outcome is None:
            self.outbox = self.thinking = _NOWHERE  # no browser reads them any more
            if conf.ON_DISCONNECT == DETACH:
                await asyncio.gather(self._pump, return_exceptions=True)
            elif await self._kept_for_a_page():
                await self._while_watched(self._pump)
            else:
                self.stop_outcome = outcomes.disconnected()
        tasks = [t for t in (self._pump, self._listen) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        checkpointer().discard(self)
        if self.polls_for_stop is False:
            await _stopping.unsubscribe(self.id)
        if not self.saved:
            await self._save(self.outcome or self.stop_outcome or outcomes.disconnected())

    async def _kept_for_a_page(self) -> bool:
        """Whether the reply goes on for a page now that its browser has left (abort mode).

        A page of this process, or one elsewhere through the channel layer, already told us:
        no query stands between a closed tab and the upstream's close. Without a channel
        layer, pages elsewhere can only tell the database.
        """
        if conf.RECONNECT_GRACE > 0:
            self.watched_until = max(self.watched_until,
                                     time.monotonic() + conf.RECONNECT_GRACE)
        if time.monotonic() < self.watched_until:
            return True
        if not self.polls_for_stop:
            return False
        return await store.for_alias().watched_since(self.id, conf.HANDOVER_GRACE)

    async def _while_watched(self, pump: asyncio.Task[None]) -> None:
        """Until the reply ends, or no page has watched it for the grace (see :meth:`watched`):
        then close the upstream at once. Pages of this process, and pages elsewhere over the
        channel layer, move ``watched_until`` on; without a channel layer, pages elsewhere
        write it in the database, read once the time is up."""
        while not pump.done():
            wait = self.watched_until - time.monotonic()
            if wait <= 0:
                if not (self.polls_for_stop and await store.for_alias().watched_since(
                        self.id, _watch_grace())):
                    self._end(outcomes.disconnected())
                    break
                wait = interval()
            await asyncio.wait((pump,), timeout=wait)
        await asyncio.gather(pump, return_exceptions=True)

    def watched(self) -> None:
        """A page now shows this reply (a follower here, or a "watched" message): it goes on for
        the grace after the last such news, whatever happens to the page that started it."""
        self.watched_until = max(self.watched_until, time.monotonic() + _watch_grace())

    def text_so_far(self) -> str:
        """The reply's text as this process has it, for its followers."""
        return self.text + "".join(self.parts) if self.parts else self.text

    def _on_request_done(self, _task: asyncio.Task[Any]) -> None:
        if not self.saved and self._pump is not None:
            self._wind_down_once()

    async def _wait(self) -> bool:
        """Sleep until the pump has news (True) or a ping is due (False).

        One timer per run, re-armed only when it fires, rather than one per wait: a timer
        made and cancelled for every delta is measurable work at thousands of deltas/s.
        """
        loop = asyncio.get_running_loop()
        if self._ping_timer is None:
            self._ping_timer = loop.call_at(self._sent_at + conf.PING_INTERVAL, self._ping_due)
        waiter = self._waiter = loop.create_future()
        try:
            return await waiter
        finally:
            self._waiter = None

    def _ping_due(self) -> None:
        self._ping_timer = None
        due = self._sent_at + conf.PING_INTERVAL
        loop = asyncio.get_running_loop()
        if loop.time() < due:  # something was sent since the timer was armed
            self._ping_timer = loop.call_at(due, self._ping_due)
        elif self._waiter is not None:
            _resolve(self._waiter, False)

    def _wake(self) -> None:
        if self._waiter is not None:
            _resolve(self._waiter, True)
        if self.feed is not None:
            self.feed.changed()

    # -- towards the provider --------------------------------------------------------------------

    async def _run_pump(self) -> None:
        try:
            async with asyncio.timeout(conf.MAX_DURATION):
                await self._call_upstream()
            self.outcome = self._natural_end()
        except asyncio.CancelledError:
            self.outcome = self.stop_outcome or outcomes.disconnected()
            raise
        except Exception as error:  # every failure becomes a stored, labelled outcome
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
            if isinstance(error, UpstreamError) and error.status is not None:
                self.http_status = error.status
                self.request_id = error.request_id or self.request_id
            self.outcome = outcomes.for_error(error, started=self.started)
        finally:
            self._request_went()
            self._wake()

    async def _trace(self, event: str, _info: dict[str, Any]) -> None:
        """httpcore's trace extension: says when the request has been written."""
        if event.endswith("send_request_body.complete"):
            self._request_went()

    def _request_went(self) -> None:
        if self._written is not None and not self._written.done():
            self._written.set_result(None)

    async def _call_upstream(self) -> None:
        body = provider.encode_body(self.request)
        self.request.body = {}  # sent as bytes from here on: hold the prompt once, not twice
        for attempt in (1, 2):
            try:
                response = await provider.send(self.request, body, self._trace)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Nothing reached the provider: the one automatic retry is safe.
                if attempt == 2:
                    raise provider.connect_error(exc, self.request) from exc
                await asyncio.sleep(0.25)
                continue
            try:
                self.request_id = response.headers.get("x-request-id", "")
                self.http_status = response.status_code
                await provider.raise_for_status(response, self.request)
                self.started = True
                await self._relay(response)
                return
            finally:
                await response.aclose()

    async def _relay(self, response: httpx.Response) -> None:
        """Read the reply within its bounds (see _bounds.py). Past one, ReplyTooLongError: the
        upstream is closed, the text so far kept."""
        decoder, acc, parts = self.decoder, self.acc, self.parts
        cap = acc.limit = conf.MAX_REPLY_LENGTH  # one payload's entries are bounded too
        room = cap - len(self.text) - sum(map(len, parts))  # characters of content still allowed
        per_choice = characters_within(self.model.max_tokens)
        # The raw bytes, inflated here if need be: httpx would inflate a compressed reply (which
        # we asked not to get) a whole network read at a time, without bound.
        raw = response.aiter_raw()
        chunks = _bounds.provider_bytes(raw, response.headers.get("content-encoding", ""),
                                 limit=cap * _bounds.BYTES_PER_CHARACTER)
        cut: ReplyTooLongError | None = None
        async for chunk in chunks:
            grew = thought = False
            for event in decoder.feed(chunk):
                delta = acc.feed(event.data, event=event.event)
                if thinking := acc.reasoning_added:  # bounded with the rest by past_bounds
                    if "\x00" in thinking:  # which PostgreSQL cannot store (see _storable.py)
                        thinking = _storable.text(thinking)
                    self.thinking.append(thinking)
                    thought = True
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
                        parts.append(delta)
                        self.outbox.append(delta)
                        grew = True
                    if cut is not None:
                        break
            if grew:
                if self.first_token_at is None:  # the reply's text, not its reasoning
                    self.first_token_at = timezone.now()
                compact(parts)  # tiny deltas are held as a few long strings
                compact(self.outbox)
                self._wake()
            if thought:
                compact(self.thinking)
                self.thought = True
                if not grew and self._waiter is not None:  # pages following it show no reasoning
                    _resolve(self._waiter, True)
            if cut is None:
                cut = _bounds.past_bounds(acc, cap, per_choice, self.model.max_tokens)
            if cut is not None:
                raise cut
            if acc.done:
                await _drain(raw)
                return
        decoder.close()

    def _natural_end(self) -> Outcome:
        choice = self.acc.choices.get(0)
        if self.acc.done or (choice is not None and choice.finish_reason):
            return outcomes.COMPLETED
        return outcomes.for_error(
            IncompleteStreamError("The stream ended before the reply was complete."),
            started=True)

    # -- Stop and checkpoints ---------------------------------------------------------------------

    def stop(self, cause: str = "") -> None:
        """A Stop arrived (from any process): close the upstream now, keep the text; ``cause``
        (a ``StopCause``) is stored as why."""
        self._end(outcomes.stopped(cause))

    def _end(self, outcome: Outcome) -> None:
        if self._pump is not None and not self._pump.done():
            if self.stop_outcome is None:
                self.stop_outcome = outcome
            self._pump.cancel()

    async def _listen_for_stop(self) -> None:
        # Subscribe first, then read the durable flag: a Stop sent in between is not lost.
        # The read is left to the checkpointer's next pass, which reads every new stream's
        # flag in one query (a Stop racing the subscription waits at most one interval).
        if await _stopping.subscribe(self.id, self.stop, self.watched):
            self.polls_for_stop = False
            self.verify_stop = True

    def checkpoint_fields(self, *, heartbeat: bool) -> dict[str, Any] | None:
        """What the next checkpoint writes for this stream, or None when nothing is due."""
        if not self.parts and not self.thought and not heartbeat:
            return None
        fields: dict[str, Any] = {"heartbeat_at": timezone.now()}
        if self.parts:
            self.text += "".join(self.parts)
            self.parts.clear()
            fields["content"] = self.text
            fields["first_token_at"] = self.first_token_at
        if self.thought:
            self.thought = False
            fields["reasoning"] = self._reasoning()
        return fields

    def _reasoning(self) -> str:
        choice = self.acc.choices.get(0)
        return _storable.text(choice.reasoning) if choice is not None else ""

    # -- the final save ---------------------------------------------------------------------------

    async def _save(self, outcome: Outcome, render: Render | None = None) -> str:
        """Store the outcome; the generation's final form when ``render`` is given (see
        ``_wire.Wire``); then tell the site (see chatstream/reporting.py).

        Both in one call to the store (on PostgreSQL on the event loop, elsewhere in one
        thread hop), in a task of their own: a browser leaving while the save is under way
        cancels the response, never the save or its report (the wind-down will not save again).
        """
        self.saved = True  # whatever happens next, never save twice
        saving = asyncio.get_running_loop().create_task(self._finish(outcome, render))
        _background.add(saving)
        saving.add_done_callback(_background.discard)
        return await asyncio.shield(saving)

    async def _finish(self, outcome: Outcome, render: Render | None) -> str:
        fields: dict[str, Any] | None = None
        try:
            fields = self._final_fields(outcome)
            final = await store.for_alias().finish(self.generation, fields, render)
        except Exception as error:  # the text is kept all the same; the row does not stay live
            log_failure(logger, error, "Generation %s: the final save failed; saving its "
                        "outcome and text alone", self.id)
            final = await store.finish_anyway(self.generation,
                                              fields or self._kept_fields(outcome), render)
        reporting.finished(self.generation)
        self.finished = True
        if self.feed is not None:
            self.feed.final = self.generation
            self.feed.changed()
        if self.watched_until and not self.polls_for_stop:  # followers elsewhere: it ended
            await _stopping.publish_ended(self.id)
        return final

    def _kept_fields(self, outcome: Outcome) -> dict[str, Any]:
        """How the reply ended and its text, fitted to their columns: what even a fallback save
        keeps (see store.finish_anyway)."""
        return _storable.fit(Generation, {
            "status": outcome.status,
            "reason": outcome.reason,
            "error_type": outcome.error_type,
            "content": self.text + "".join(self.parts),
            "reasoning": self._reasoning(),
            "first_token_at": self.first_token_at,
            "completed_at": timezone.now(),
            "heartbeat_at": None,
        })

    def _final_fields(self, outcome: Outcome) -> dict[str, Any]:
        """Every field of the final save, each fitted to its column whatever the provider sent
        (see _storable.py)."""
        fields = self._kept_fields(outcome)
        choice = self.acc.choices.get(0)
        calls = choice.tool_calls if choice else []
        provided: dict[str, Any] = {
            "finish_reason": (choice.finish_reason or "") if choice else "",
            "tool_calls": [{"id": c.id, "type": c.type, "name": c.name,
                            "arguments": c.arguments} for c in calls],
            "request_id": self.request_id,
            "http_status": self.http_status,
            "provider_model": self.acc.model or self.model.model,
        }
        generated = (fields["content"] + fields["reasoning"]
                     + "".join(c.name + c.arguments for c in calls))
        provided.update(usage_fields(self.acc.usage, prompt_estimate=self.prompt_estimate,
                                     generated=generated))
        fields.update(_storable.fit(Generation, provided))
        return fields


def _watch_grace() -> float:
    """How long a reply goes on after the last news that a page watches it (abort mode)."""
    return max(conf.HANDOVER_GRACE, conf.RECONNECT_GRACE)


async def release_request_connections() -> None:
    """Give back the database connections of the calling request's thread.

    Under Django's request cycle, a view's sync work (the session, the user) runs on a thread
    kept for the request, whose connections Django closes only when the response ends, which
    for a stream is minutes later. With a connection pool, open streams would hold every
    connection: a streaming view calls this before it streams.
    """
    await sync_to_async(_release_connections)()


def _release_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (normally nothing) so the connection can be reused."""
    try:
        async with asyncio.timeout(0.25):
            async for _ in chunks:
                pass
    except (TimeoutError, httpx.HTTPError):
        pass


# -- entry points for the views --------------------------------------------------------------------


async def aopen(generation_id: UUID, user_id: Any, wire: Wire[T], *, after: int = 0,
                start: bool = False, wsgi: bool = False) -> AsyncGenerator[T, None] | None:
    """The stream of the user's generation, written by ``wire``: its live run if this request
    claims it (see :func:`astart`), else its text after the first ``after`` characters (a
    client resuming: see ``_wire.Sent``) followed to the end (see _following.py); None if the
    generation is not the user's. Raises ``TooManyFollowers`` when this process already serves
    as many followers as the settings allow."""
    body = await astart(generation_id, user_id, wire, start=start, wsgi=wsgi)
    if body is None:
        if not await store.for_alias().owns(generation_id, user_id):
            return None
        return _following.admit(generation_id, user_id, wire, after=after)
    if after:  # a client that claims text of a reply not started: it starts from nothing
        return _from_nothing(body, wire)
    return body


async def _from_nothing(body: AsyncGenerator[T, None], wire: Wire[T]) -> AsyncGenerator[T, None]:
    async with aclosing(body):
        yield await wire.reset("", _wire.Sent())
        async for chunk in body:
            yield chunk


async def astart(generation_id: UUID, user_id: Any, wire: Wire[T], *,
                 start: bool = False, wsgi: bool = False) -> AsyncGenerator[T, None] | None:
    """Claim the user's pending generation and return its live stream; None if not ours to run.

    One database round trip (the store's claim; on PostgreSQL sent without a thread) stands
    between the request and the provider's. The provider is called when
    the stream is first iterated or, with ``start=True``, before this returns, which then waits
    (up to ``_FIRST_WRITE_WAIT``) until the provider's request is written: it goes out before
    the response's headers, not after. Only for a caller whose own task sends the response,
    as chatstream.asgi's does. (A Django view may run in a task of its own: a sync
    middleware puts the view behind ``async_to_sync``.)

    A server that cannot stream (``wsgi``, or an event loop found wanting: see _serving.py)
    gets the claimed generation back as failed, with its notice, and no provider call.
    """
    claim = await store.for_alias().claim(generation_id, user_id)
    if claim is None:
        return None
    model = conf.get_model(claim.generation.model)
    if model is None:  # the allow-list changed since the message was posted
        return _refuse(claim.generation, outcomes.model_not_allowed(), wire)
    if await _serving.problem(wsgi=wsgi) is not None:
        return _refuse(claim.generation, outcomes.unsupported_server(), wire)
    run = Run(claim, model)
    reporting.started(claim.generation)
    if start:
        run.start()
        await run.request_written(_FIRST_WRITE_WAIT)
    return run.events(wire)


async def _refuse(generation: Generation, outcome: Outcome, wire: Wire[T]
                  ) -> AsyncGenerator[T, None]:
    fields = {"status": outcome.status, "reason": outcome.reason,
              "error_type": outcome.error_type, "completed_at": timezone.now(),
              "heartbeat_at": None}
    final = await store.for_alias().finish(generation, fields, wire.render)
    reporting.finished(generation)
    yield await wire.error(outcome.notice)
    yield await wire.done(final)


async def arequest_stop(generation_id: UUID,
                        cause: outcomes.StopCause = outcomes.StopCause.BY_USER) -> None:
    """Stop a generation wherever it streams: signal, write the durable flag, signal again.

    The first signal reaches a subscribed stream without waiting for the database write; the
    second covers a stream that subscribed in between (it reads the flag after subscribing).
    ``cause`` travels with both, and is stored as the outcome's reason.
    """
    outcome = outcomes.stopped(cause)
    await _stopping.publish(generation_id, cause)
    await store.for_alias().request_stop(generation_id, reason=outcome.reason,
                                         error_type=outcome.error_type)
    await _stopping.publish(generation_id, cause)
