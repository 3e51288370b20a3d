"""A round of tool calls: what happens between a step whose reply asked for calls and the next.

In order, each part stored before the next begins:

1. the calls recorded and checked (``tools.arecord``): each ``approved``, ``pending_approval``
   or ``failed``;
2. the next step created and admitted by the quota (``steps.open_next``); refused, none of the
   calls runs (they end ``cancelled``) and the reply ends here, with the quota's notice;
3. the approved calls run, all at once, each at most once (``tools.arun``);
4. the next step's messages written, and the step let go (``steps.make_ready``).

The round runs in a task of its own: a page that leaves while tools run stops none of it. The
stream that ran the step reads the round's news (:meth:`Round.events`): a ``tool`` event each
time a call changes, pings in between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from opentelemetry.context import Context

from .. import tools
from .._failures import log_failure
from .._loops import in_executor
from ..conf import ModelChoice, conf
from ..domain import reporting, steps
from ..exceptions import QuotaExceeded, RequestRefused
from ..models import Conversation, Generation, ToolCall
from ..signals import quota_refused
from ..web import rendered
from ._wire import Wire

T = TypeVar("T", bytes, str)

logger = logging.getLogger("chatstream.tools")

# Rounds under way, kept referenced until they end.
_running: set[asyncio.Task[None]] = set()

Status = ToolCall.Status


class Round:
    """The round of calls that follows ``step`` (see the module docstring)."""

    def __init__(self, step: Generation, model: ModelChoice, parent: Context | None = None
                 ) -> None:
        self.step = step
        self.model = model
        self.parent = parent  # the context the calls' spans are children of (see telemetry)
        self.calls: list[ToolCall] = []
        self.following: Generation | None = None  # the next step, once admitted
        self.ready = False  # the next step may start
        self.asking = False  # the next step waits for the user's decisions on calls
        self.notice = ""  # why the reply ends here, for its page
        self.over = False
        self._changed: list[ToolCall] = []
        self._wake = asyncio.Event()
        self._for: tuple[Any, Conversation] | None = None

    @classmethod
    def after(cls, step: Generation, model: ModelChoice, parent: Context | None = None
              ) -> Round | None:
        """The round that follows ``step``, just saved, started in a task of its own; None
        when its reply asked for no call it was offered. Its calls' spans are children of
        ``parent`` (the step's ``telemetry.Reply.context``), else of the current context."""
        if not steps.leads_on(step):
            return None
        round_ = cls(step, model, parent)
        running = asyncio.get_running_loop().create_task(round_.run())
        _running.add(running)
        running.add_done_callback(_running.discard)
        return round_

    async def run(self) -> None:
        """The round after its step's save: the calls recorded, the next step admitted, then
        the calls run, unless one waits for the user's approval (see :meth:`resume`)."""
        try:
            await self._record()
            self.asking = self.following is not None and any(
                call.status == Status.PENDING_APPROVAL for call in self.calls)
            if self.following is not None and not self.asking:
                await self._finish()
        except Exception as error:  # what was stored stays; chatstream_sweep goes on from it
            log_failure(logger, error, "Generation %s: its round of tool calls failed",
                        self.step.pk)
        finally:
            self.over = True
            self._wake.set()

    @classmethod
    async def resume(cls, step: Generation, following: Generation, model: ModelChoice
                     ) -> Round:
        """The round of ``step``, whose last call waiting for approval was just decided: its
        approved calls run, then ``following`` (its next step) may start."""
        round_ = cls(step, model)
        round_.following = following
        round_.calls = [call async for call in ToolCall.objects.filter(generation_id=step.pk)]
        try:
            await round_._finish()
        finally:
            round_.over = True
        return round_

    async def _record(self) -> None:
        step = self.step
        user, conversation = await self._who()
        self.calls = await tools.arecord(step, tools.tools_of(self.model), user=user,
                                         conversation=conversation)
        self._news(*self.calls)
        try:
            self.following = await in_executor(steps.open_next)(step, self.calls)
        except QuotaExceeded as exceeded:
            await self._cancel_waiting()
            self.notice = exceeded.message
            reporting.send_robust(quota_refused, user=user, refusal=exceeded, request=None)

    async def _finish(self) -> None:
        assert self.following is not None
        user, conversation = await self._who()
        offered = tools.tools_of(self.model)
        context = tools.ToolContext(user, conversation, self.step, None)
        await asyncio.gather(*(self._call(call, offered[call.name], context)
                               for call in self.calls
                               if call.status == Status.APPROVED and call.name in offered))
        # An approved call of a tool the model no longer has never runs.
        await tools.acancel_waiting(self.step.pk)
        ready: bool | RequestRefused = await in_executor(steps.make_ready)(self.following)
        if isinstance(ready, RequestRefused):
            self.notice = ready.message
        self.ready = ready is True

    async def _who(self) -> tuple[Any, Conversation]:
        """The step's user and conversation (read once), whom its calls serve."""
        if self._for is None:  # one query: a conversation's user is its steps' user
            conversation = await Conversation.objects.select_related("user").aget(
                pk=self.step.conversation_id)
            self._for = (conversation.user, conversation)
        return self._for

    async def _call(self, call: ToolCall, tool: tools.Tool, context: tools.ToolContext
                    ) -> None:
        if await tools.arun(call, tool, context, started=lambda: self._news(call),
                            parent=self.parent):
            reporting.call_finished(call, self.step.user_id)
        self._news(call)

    async def _cancel_waiting(self) -> None:
        await tools.acancel_waiting(self.step.pk)
        waiting = [call for call in self.calls
                   if call.status in (Status.APPROVED, Status.PENDING_APPROVAL)]
        for call in waiting:
            call.status = Status.CANCELLED
        self._news(*waiting)

    def _news(self, *calls: ToolCall) -> None:
        self._changed.extend(calls)
        self._wake.set()

    async def events(self, wire: Wire[T]) -> AsyncGenerator[T, None]:
        """A ``tool`` event each time a call changes (its card in the state it is in now), a
        ping in each silence, until the round is over; then the next step's (see
        ``Wire.step``), if the reply goes on now or once the user has decided."""
        async for chunk in self._news_of_calls(wire):
            yield chunk
        if self.following is not None and (self.ready or self.asking):
            yield await wire.step(self.following, ready=self.ready)

    async def final_form(self, wire: Wire[T]) -> str:
        """The step's final form, with its calls as they ended."""
        self.step.shown_calls = self.calls  # type: ignore[attr-defined]
        return await rendered.off_loop(rendered.cost(self.step), wire.render, self.step)

    async def _news_of_calls(self, wire: Wire[T]) -> AsyncGenerator[T, None]:
        while True:
            if self._changed:
                changed, self._changed = self._changed, []
                for call in dict.fromkeys(changed):  # each once, in the order of its first news
                    yield await wire.tool(call)
                continue
            if self.over:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), conf.PING_INTERVAL)
            except TimeoutError:
                yield wire.ping
