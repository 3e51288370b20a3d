"""A reply's next step: the upstream call that carries the results of the previous step's tool
calls (see chatstream/tools/_rounds.py for the round of calls between two steps).

:func:`open_next` creates it, in one transaction with the quota's admission, before any call of
the previous step runs; it then waits (``waits_for_tools``: no stream may claim it). Once the
calls have ended, :func:`make_ready` writes what it sends (the previous step's messages, the
assistant message that asked for the calls and one ``tool`` message per call, then the request
hooks, then the context budget) and lets it start; a hook's refusal ends it ``failed``.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from .. import hooks, quota, tools
from ..conf import conf
from ..exceptions import RequestRefused
from ..models import Generation, ToolCall
from . import reporting
from .history import after_step, fit
from .usage import estimate_tokens

Status = Generation.Status


def leads_on(generation: Generation) -> bool:
    """Whether ``generation``'s reply asked for tool calls it was offered: it ended whole with
    calls, its model has tools, and it was not the last step."""
    model = conf.get_model(generation.model)
    return (generation.status == Status.COMPLETED and bool(generation.tool_calls)
            and model is not None and bool(model.tools)
            and generation.step < conf.MAX_TOOL_STEPS)


def open_next(previous: Generation, calls: Iterable[ToolCall]) -> Generation:
    """The next step after ``previous`` (whose reply asked for ``calls``), created waiting and
    admitted by the quota for its messages with each result not known yet at its longest;
    QuotaExceeded (nothing kept) when the quota refuses it."""
    calls = list(calls)
    unknown = sum(call.status != ToolCall.Status.FAILED for call in calls)
    following = Generation(
        conversation_id=previous.conversation_id, user_id=previous.user_id,
        prompt_message_id=previous.prompt_message_id, model=previous.model,
        step=previous.step + 1, follows=previous, waits_for_tools=True,
        fallbacks=list(previous.fallbacks),
        upstream_messages=after_step(previous, calls))
    with transaction.atomic(using=previous._state.db):
        following.save(force_insert=True)
        quota.admit(following, expected=unknown * estimate_tokens("x" * conf.MAX_TOOL_RESULT))
    return following


def make_ready(following: Generation) -> bool | RequestRefused:
    """Write what ``following`` (waiting) sends now that the previous step's calls have ended,
    and let it start (True); or, refused by a request hook, end it ``failed`` and return why.
    False if it no longer waits (stopped meanwhile), or if a call of the step has not ended:
    whoever ends the last one makes it ready (the calls are read here, after the caller's
    own have been saved, so of two processes ending calls at once the later one does)."""
    previous = following.follows
    assert previous is not None
    calls = list(ToolCall.objects.filter(generation_id=previous.pk))
    if any(call.status not in tools.FINAL for call in calls):
        return False
    messages = after_step(previous, calls)
    if conf.REQUEST_HOOKS:
        call = hooks.RequestCall(following, following.user, None, messages)
        if (refused := hooks.refusal(call)) is not None:
            return _refuse(following, *refused)
        messages = call.messages
        following.upstream_params = call.params
    messages = fit(messages, following.model)
    following.upstream_messages = messages
    following.waits_for_tools = False
    return bool(Generation.objects.filter(
        pk=following.pk, status=Status.PENDING, waits_for_tools=True).update(
        upstream_messages=messages, upstream_params=following.upstream_params,
        waits_for_tools=False, heartbeat_at=timezone.now()))  # when it could start


def _refuse(following: Generation, refusal: RequestRefused, reason: str, error_type: str
            ) -> RequestRefused:
    priced = quota.cost_fields(following)  # of nothing: zero, if it has a price
    with transaction.atomic(using=following._state.db):
        if Generation.objects.filter(pk=following.pk, status=Status.PENDING,
                                     waits_for_tools=True).update(
                status=Status.FAILED, reason=reason, error_type=error_type,
                completed_at=timezone.now(), waits_for_tools=False, **priced):
            following.status = Status.FAILED
            following.cost, following.currency = priced["cost"], priced["currency"]
            following.reason, following.error_type = reason, error_type
            quota.settle(following)
            transaction.on_commit(lambda: reporting.finished_now(following))
    refusal.generation = following
    return refusal

