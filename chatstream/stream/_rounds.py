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
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from django.contrib.auth import get_user_model

from .. import tools
from .._loops import in_executor
from ..conf import ModelChoice, conf
from ..domain import reporting, steps
from ..exceptions import QuotaExceeded, RequestRefused
from ..models import Conversation, Generation, ToolCall
from ..signals import quota_refused
from ._wire import Wire

T = TypeVar("T", bytes, str)

Status = ToolCall.Status


class Round:
    """The round of calls that follows ``step`` (see the module docstring)."""

    def __init__(self, step: Generation, model: ModelChoice) -> None:
        self.step = step
        self.model = model
        self.calls: list[ToolCall] = []
        self.following: Generation | None = None  # the next step, once admitted
        self.ready = False  # the next step may start
        self.notice = ""  # why the reply ends here, for its page
        self.over = False
        self._changed: list[ToolCall] = []
        self._wake = asyncio.Event()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.over = True
            self._wake.set()

    async def _run(self) -> None:
        step = self.step
        user = await get_user_model()._default_manager.aget(pk=step.user_id)
        conversation = await Conversation.objects.aget(pk=step.conversation_id)
        offered = tools.tools_of(self.model)
        self.calls = await tools.arecord(step, offered, user=user, conversation=conversation)
        self._news(*self.calls)
        try:
            self.following = await in_executor(steps.open_next)(step, self.calls)
        except QuotaExceeded as exceeded:
            await self._cancel_waiting()
            self.notice = exceeded.message
            reporting.send_robust(quota_refused, user=user, refusal=exceeded, request=None)
            return
        context = tools.ToolContext(user, conversation, step, None)
        await asyncio.gather(*(self._call(call, offered[call.name], context)
                               for call in self.calls if call.status == Status.APPROVED))
        if any(call.status == Status.PENDING_APPROVAL for call in self.calls):
            return  # the user's decisions let the reply go on
        refusal: RequestRefused | None = await in_executor(steps.make_ready)(
            self.following, self.calls)
        if refusal is not None:
            self.notice = refusal.message
        else:
            self.ready = True

    async def _call(self, call: ToolCall, tool: tools.Tool, context: tools.ToolContext
                    ) -> None:
        await tools.arun(call, tool, context, started=lambda: self._news(call))
        self._news(call)

    async def _cancel_waiting(self) -> None:
        waiting = [call for call in self.calls
                   if call.status in (Status.APPROVED, Status.PENDING_APPROVAL)]
        await ToolCall.objects.filter(pk__in=[call.pk for call in waiting],
                                      status__in=(Status.APPROVED, Status.PENDING_APPROVAL)
                                      ).aupdate(status=Status.CANCELLED)
        for call in waiting:
            call.status = Status.CANCELLED
        self._news(*waiting)

    def _news(self, *calls: ToolCall) -> None:
        self._changed.extend(calls)
        self._wake.set()

    async def events(self, wire: Wire[T]) -> AsyncGenerator[T, None]:
        """A ``tool`` event each time a call changes (its card in the state it is in now), a
        ping in each silence, until the round is over."""
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

    def shown(self) -> Any:
        """The step as its final form shows it: with its calls as they ended."""
        self.step.shown_calls = self.calls  # type: ignore[attr-defined]
        return self.step
