"""The relay: a run's reply sent to its page as it grows, and its news to the pages following it.

The page that started the run reads it through :meth:`Relay.events`: reasoning and text as they
arrive, batched (what came while a write was under way goes in the next), reasoning first (it
comes before the text it leads to), a ping in each silence of ``CHATSTREAM_PING_INTERVAL``, then
the outcome. Pages following the reply in this process listen (:meth:`Relay.listen`): each hears
of every change of the text and of the end (see _following.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Protocol, TypeVar

from ..conf import conf
from . import _wire
from ._reply import Reply
from ._wire import Wire

T = TypeVar("T", bytes, str)


class Relayed(Protocol):
    """What the relay asks of its run."""

    def start(self) -> None: ...

    def ended(self) -> bool:
        """Whether the pump has ended (the outcome is known)."""
        ...

    def conclude(self, wire: Wire[T]) -> AsyncGenerator[T, None]:
        """The outcome saved, and the events that tell it."""
        ...

    async def left(self) -> None:
        """The page has gone, or has read to the end."""
        ...


class Relay:
    """The relay of one run (see the module docstring)."""

    __slots__ = ("_listeners", "_ping_timer", "_sent_at", "_waiter", "reading", "reply")

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.reading = True  # the page that started the run reads it
        self._listeners: list[Callable[[], None]] = []
        self._waiter: asyncio.Future[bool] | None = None
        self._sent_at = 0.0  # loop time of the last event sent to the page
        self._ping_timer: asyncio.TimerHandle | None = None

    async def events(self, run: Relayed, wire: Wire[T]) -> AsyncGenerator[T, None]:
        """The stream of ``run``, written by ``wire`` (see the module docstring)."""
        loop = asyncio.get_running_loop()
        self._sent_at = loop.time()
        run.start()
        reply = self.reply
        try:
            sent = _wire.Sent()
            reasoning_sent = _wire.Sent()  # its line ends, as the text's (no ids)
            while True:
                if reply.unsent_reasoning:
                    text = reasoning_sent.piece(reply.take_unsent_reasoning())
                    if text:
                        self._sent_at = loop.time()
                        yield wire.thinking(text)
                    continue  # more may have come meanwhile: reasoning still goes first
                if reply.unsent:
                    text = sent.piece(reply.take_unsent())
                    if text:
                        self._sent_at = loop.time()
                        chunk = wire.delta(text, sent)
                        yield chunk + await wire.blocks() if wire.pending else chunk
                elif run.ended():
                    break
                elif not await self._wait():
                    self._sent_at = loop.time()
                    yield wire.ping
            async with aclosing(run.conclude(wire)) as told:
                async for chunk in told:
                    yield chunk
        finally:
            if self._ping_timer is not None:
                self._ping_timer.cancel()
            await run.left()

    def news(self, text: bool) -> None:
        """The reply grew: its text if ``text`` (which the followers show too), else only its
        reasoning; or the pump ended (``text``: the followers hear of it)."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(True)
        if not self.reading:
            self.reply.drop_unsent()
        if text:
            for listener in self._listeners:
                listener()

    def page_left(self) -> None:
        """The page that started the run has gone: what it was not sent is dropped from now on."""
        self.reading = False

    def listen(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` at each change of the text and at the end; returns what stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

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
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(False)
