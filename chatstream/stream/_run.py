"""One generation's run: claimed, streamed, ended, saved; and what a Stop or a closed page does.

A run is made of parts with one job each, which talk through the run:

- the reply as it grows (_reply.py): text, reasoning, tool calls, what each checkpoint writes;
- the pump (_pump.py): the provider's call, read into the reply;
- the relay (_relay.py): the reply sent to the page that started it, and its news to the pages
  following it;
- the ending (_ending.py): the final save, and what comes after it.

The run itself holds the :class:`Phase` and decides when the pump ends and the outcome is
saved. Guarantees:

- **The provider's request lives in one task** (the pump's), cancelled the moment the browser
  goes away (the request task's cancellation, or its done-callback when Django is blocked in a
  ``send``), when a Stop arrives from any process, or when a deadline passes.
- **The outcome is saved before the terminal ``done`` event**, and again, shielded, if the
  browser left first; the partial text is kept on every outcome; the run saves once.
- **Bounded database work**: the claim (before the run), at most one checkpoint per
  ``CHATSTREAM_CHECKPOINT_INTERVAL`` (batched across streams, see _checkpoints.py), and one
  final transaction. No database connection is held while streaming.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from enum import IntEnum
from typing import Any, TypeVar
from uuid import UUID

from .. import store, tools
from ..conf import DETACH, ModelChoice, conf
from ..models import Attempt, Generation
from . import _ending, _stopping
from . import _outcomes as outcomes
from ._checkpoints import checkpointer, interval
from ._outcomes import Outcome
from ._pump import Pump
from ._relay import Relay
from ._reply import Reply
from ._rounds import Round
from ._wire import Wire

T = TypeVar("T", bytes, str)

# Final saves that outlive their request (after a send that never returned); kept referenced.
_background: set[asyncio.Task[Any]] = set()


class Phase(IntEnum):
    """Where a run is; it only moves forward."""

    CLAIMED = 0  # the generation is this process's; the provider not called yet
    STREAMING = 1  # the pump runs
    ENDED = 2  # the pump has ended: the outcome is known
    SAVING = 3  # the final save is under way (a run saves once)
    SAVED = 4  # the outcome is saved


class Run:
    """The live half of one claimed generation (see the module docstring)."""

    __slots__ = ("_listen", "_pump", "_winding", "generation", "id", "outcome", "phase",
                 "polls_for_stop", "pump", "relay", "reply", "round", "stopped_with",
                 "watched_until")

    def __init__(self, generation: Generation, messages: list[dict[str, str]],
                 model: ModelChoice) -> None:
        self.generation = generation
        self.id: UUID = generation.pk
        self.reply = Reply()
        self.relay = Relay(self.reply)
        self.pump = Pump(generation, model, messages, generation.upstream_params, self.reply,
                         self.relay.news, tools.offered(model, generation.step),
                         _fallbacks(generation, model))
        # The conversation is in the request now; an open stream need not hold it twice (it
        # can be long). Deleted, the field is deferred: a save() would leave it alone.
        del self.generation.upstream_messages
        self.phase = Phase.CLAIMED
        self.outcome: Outcome | None = None  # the pump's, once it has ended
        self.stopped_with: Outcome | None = None  # a Stop's, or a closed page's
        self.round: Round | None = None  # the tool calls its reply asked for (see _rounds.py)
        self.polls_for_stop = True  # until a channel layer subscription says otherwise
        self.watched_until = 0.0  # monotonic time until which a page is known to show it
        self._pump: asyncio.Task[None] | None = None
        self._listen: asyncio.Task[None] | None = None
        self._winding: asyncio.Task[None] | None = None

    # -- its life --------------------------------------------------------------------------------

    def start(self) -> None:
        """Call the provider (once): the pump, the Stop subscription, the checkpoints.

        The run is tied to the calling task, which must be the one that sends the response:
        when it ends, however it ends (the client left while Django was blocked in
        ``send()``, or the body was never iterated), the run winds down and saves.
        """
        if self.phase is not Phase.CLAIMED:
            return
        self.phase = Phase.STREAMING
        loop = asyncio.get_running_loop()
        self._pump = loop.create_task(self._pumping())
        self._listen = loop.create_task(self._listen_for_stop())
        checkpointer().add(self)
        request_task = asyncio.current_task()
        if request_task is not None:
            request_task.add_done_callback(self._on_request_done)

    def events(self, wire: Wire[T]) -> AsyncGenerator[T, None]:
        """The stream of the run, written by ``wire`` (see _relay.py); it starts the run."""
        return self.relay.events(self, wire)

    async def _pumping(self) -> None:
        try:
            outcome = await self.pump.run()
        except asyncio.CancelledError:
            self._ended(self.stopped_with or outcomes.disconnected())
            raise
        self._ended(outcome)

    def _ended(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.phase = max(self.phase, Phase.ENDED)
        self.relay.news(True)

    def ended(self) -> bool:
        return self.phase >= Phase.ENDED

    async def conclude(self, wire: Wire[T]) -> AsyncGenerator[T, None]:
        """The pump has ended: the outcome saved, then the events that tell it; when the reply
        asked for tool calls, their round first (each call's news as it changes), and the
        next step's stream."""
        assert self.outcome is not None
        outcome = self.outcome
        final = await self._save(outcome, wire)
        notice = outcome.notice
        if (round_ := self.round) is not None:
            async for chunk in round_.events(wire):
                yield chunk
            final = await round_.final_form(wire)
            notice = notice or round_.notice
        if notice:
            yield await wire.error(notice)
        yield await wire.done(final)

    async def left(self) -> None:
        """The page has gone, or has read to the end: wind down (once, shielded)."""
        await asyncio.shield(self._wind_down_once())

    def _on_request_done(self, _task: asyncio.Task[Any]) -> None:
        if self.phase < Phase.SAVING:
            self._wind_down_once()

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
        pump = self._pump
        if pump is not None and not pump.done() and self.stopped_with is None:
            self.relay.page_left()
            if conf.ON_DISCONNECT == DETACH:
                await asyncio.gather(pump, return_exceptions=True)
            elif await self._kept_for_a_page():
                await self._while_watched(pump)
            else:
                self.stopped_with = outcomes.disconnected()
        tasks = [t for t in (pump, self._listen) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        checkpointer().discard(self)
        if self.polls_for_stop is False:
            await _stopping.unsubscribe(self.id)
        if self.phase < Phase.SAVING:
            await self._save(self.outcome or self.stopped_with or outcomes.disconnected())

    # -- pages that watch it, and Stop -----------------------------------------------------------

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

    def stop(self, cause: str = "") -> None:
        """A Stop arrived (from any process): close the upstream now, keep the text; ``cause``
        (a ``StopCause``) is stored as why."""
        self._end(outcomes.stopped(cause))

    def _end(self, outcome: Outcome) -> None:
        if self._pump is not None and not self._pump.done():
            if self.stopped_with is None:
                self.stopped_with = outcome
            self._pump.cancel()

    async def _listen_for_stop(self) -> None:
        # Subscribe first, then read the durable flag: a Stop sent in between is not lost.
        # The read is left to the checkpointer's next pass, which reads every new stream's
        # flag in one query (a Stop racing the subscription waits at most one interval).
        if await _stopping.subscribe(self.id, self.stop, self.watched):
            self.polls_for_stop = False
            checkpointer().read_flag_once(self.id)

    # -- what the checkpoints and the followers read -----------------------------------------

    def checkpoint_fields(self, *, heartbeat: bool) -> dict[str, Any] | None:
        return self.pump.checkpoint_fields(self.reply.checkpoint_fields(heartbeat=heartbeat))

    def calls_to_store(self) -> list[Attempt]:
        return self.pump.calls_to_store()

    def calls_stored(self, written: bool) -> None:
        self.pump.attempts.stored_if(written)

    @property
    def checkpointed(self) -> str:
        """The reply's text as of the last checkpoint."""
        return self.reply.text

    @property
    def saved(self) -> bool:
        return self.phase is Phase.SAVED

    def text_so_far(self) -> str:
        """The reply's text as this process has it, for its followers."""
        return self.reply.so_far()

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """See ``Relay.listen``: a follower of this process hears of each change."""
        return self.relay.listen(listener)

    # -- the final save --------------------------------------------------------------------------

    async def _save(self, outcome: Outcome, wire: Wire[Any] | None = None) -> str:
        """Store the outcome; the generation's final form when a ``wire`` renders it; then what
        comes after (see _ending.py).

        In a task of its own: a browser leaving while the save is under way cancels the
        response, never the save (the wind-down will not save again).
        """
        self.phase = Phase.SAVING  # whatever happens next, never save twice
        saving = asyncio.get_running_loop().create_task(self._saving(outcome, wire))
        _background.add(saving)
        saving.add_done_callback(_background.discard)
        return await asyncio.shield(saving)

    async def _saving(self, outcome: Outcome, wire: Wire[Any] | None) -> str:
        reply, pump = self.reply, self.pump
        # Its calls are recorded after the save, by its round (if it has one): none yet.
        self.generation.shown_calls = []  # type: ignore[attr-defined]
        answered = pump.ended(outcome)
        final = await _ending.save(
            self.generation,
            lambda: reply.final_fields(outcome, model=pump.model.model,
                                       prompt_estimate=pump.prompt_estimate,
                                       request_id=pump.request_id,
                                       http_status=pump.http_status) | answered,
            lambda: reply.kept_fields(outcome) | answered,
            wire.render if wire is not None else None, attempts=pump.attempts)
        _ending.after(self.generation, outcome)
        self.round = Round.after(self.generation, pump.model, pump.attempts.telemetry.context)
        self.phase = Phase.SAVED
        self.relay.news(True)  # followers here: it ended
        if self.watched_until and not self.polls_for_stop:  # followers elsewhere: it ended
            await _stopping.publish_ended(self.id)
        return final


def _fallbacks(generation: Generation, model: ModelChoice) -> list[ModelChoice]:
    """The models ``generation`` may fall back to: those chosen when it was sent, still in
    the allow-list and still with the tools of ``model``."""
    found = (conf.get_model(key) for key in generation.fallbacks or ())
    return [choice for choice in found
            if choice is not None and choice.key != model.key and choice.tools == model.tools]


def _watch_grace() -> float:
    """How long a reply goes on after the last news that a page watches it (abort mode)."""
    return max(conf.HANDOVER_GRACE, conf.RECONNECT_GRACE)
