"""Closing what nobody will close: streams whose worker died, generations nobody streamed.

A live stream writes a heartbeat at least every ``CHATSTREAM_HEARTBEAT_INTERVAL`` seconds. A
``streaming`` row whose heartbeat is older than ``CHATSTREAM_STALE_AFTER`` belongs to a dead
worker: the sweeper marks it ``interrupted``, keeps its last checkpoint, charges the estimate
(at the price of the model that was answering, when a checkpoint named it) and frees its quota;
that model's call is recorded as a failed attempt, after those the checkpoint wrote. A
``pending`` row older than ``CHATSTREAM_PENDING_TIMEOUT`` was never streamed: it is
``cancelled`` and its reservation released. Each row is re-checked under its own lock, so
running the sweeper twice, or in two processes at once, changes nothing more. It runs from
``manage.py chatstream_sweep`` and, lazily, from the app itself.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from django.db import router, transaction
from django.db.models import Q
from django.utils import timezone

from .. import quota, store, tools
from .._loops import in_executor
from ..conf import conf
from ..domain import decisions, reporting, retention, steps
from ..domain.history import history
from ..domain.usage import estimate_tokens, message_text
from ..models import Attempt, Generation, ToolCall
from ..web import rendered
from ._entry import aresume

Status = Generation.Status


def sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Close stale and abandoned generations; return how many of each."""
    now = now or timezone.now()
    stale_before = now - timedelta(seconds=conf.STALE_AFTER)
    counts = {"interrupted": 0, "abandoned": 0}
    stale = Generation.objects.filter(status=Status.STREAMING, heartbeat_at__lt=stale_before)
    for pk in stale.values_list("pk", flat=True):
        if _interrupt(pk, stale_before, now):
            counts["interrupted"] += 1
    # A step that waited for its tool calls counts from when it could start (heartbeat_at).
    unstarted = now - timedelta(seconds=conf.PENDING_TIMEOUT)
    abandoned = Generation.objects.filter(
        Q(heartbeat_at__isnull=True) | Q(heartbeat_at__lt=unstarted), status=Status.PENDING,
        waits_for_tools=False, created_at__lt=unstarted)
    for pk in abandoned.values_list("pk", flat=True):
        if _abandon(pk, now):
            counts["abandoned"] += 1
    counts.update(_tool_calls(now))
    return counts


def sweep_retention(*, dry_run: bool = False, now: datetime | None = None
                    ) -> dict[str, int] | None:
    """Delete the conversations with no activity for ``CHATSTREAM_RETENTION_DAYS`` (never one
    with a live reply or a tool call waiting), in batches; with ``dry_run``, only count them.
    None when the setting is None (keep for ever). Run by ``chatstream_sweep`` only, never by
    the sweep the app runs by itself: deleting is heavy work, and a site should choose when
    (and see with ``--dry-run`` first) rather than have a web process do it."""
    days = conf.RETENTION_DAYS
    if days is None:
        return None
    stale = retention.stale_conversations(retention.cutoff(days, now or timezone.now()))
    return retention.counts(stale) if dry_run else retention.delete_conversations(stale)


def _tool_calls(now: datetime) -> dict[str, int]:
    """Calls nobody will end: undecided for ``CHATSTREAM_APPROVAL_TIMEOUT`` (``expired``: the
    reply goes on, its approved calls run here), or ``running`` past their tool's timeout and
    ``CHATSTREAM_STALE_AFTER`` (their worker died: ``lost``, outcome unknown); then the steps
    their round left waiting (see :func:`_stuck`)."""
    expired, resumed = decisions.expire_overdue(
        now - timedelta(seconds=conf.APPROVAL_TIMEOUT))
    for step, following in resumed:
        async_to_sync(aresume)(step, following)
    lost, ended = 0, set()
    running = ToolCall.objects.filter(status=ToolCall.Status.RUNNING, started_at__lt=now - (
        timedelta(seconds=conf.STALE_AFTER)))
    for call in running.select_related("generation"):
        allowed = now - timedelta(seconds=conf.STALE_AFTER + _timeout(call))
        if call.started_at is not None and call.started_at < allowed and ToolCall.objects.filter(
                pk=call.pk, status=ToolCall.Status.RUNNING).update(
                status=ToolCall.Status.LOST, finished_at=now):
            lost += 1
            call.status, call.finished_at = ToolCall.Status.LOST, now
            reporting.call_finished_now(call, call.generation.user_id)
            ended.add(call.generation_id)
    _stuck(now, ended)
    return {"expired": expired, "lost": lost}


def _stuck(now: datetime, lost_in: set[Any]) -> None:
    """Steps left waiting by a round whose worker died (``lost_in``: steps whose calls were
    just found lost), or with nothing of their previous step's calls happening for
    ``CHATSTREAM_STALE_AFTER``: when none waits for a decision and none runs, the approved
    calls that never started run here, and the step may start."""
    quiet = now - timedelta(seconds=conf.STALE_AFTER)
    waiting = Generation.objects.filter(
        Q(created_at__lt=quiet) | Q(follows_id__in=lost_in), status=Status.PENDING,
        waits_for_tools=True).select_related("follows")
    for following in waiting:
        step = following.follows
        assert step is not None
        calls = list(step.calls.all())
        moments = [at for call in calls for at in (call.created_at, call.decided_at,
                                                   call.started_at, call.finished_at) if at]
        if any(call.status in (ToolCall.Status.PENDING_APPROVAL, ToolCall.Status.RUNNING)
               for call in calls) or (step.pk not in lost_in
                                      and max(moments, default=now) >= quiet):
            continue
        if any(call.status == ToolCall.Status.APPROVED for call in calls):
            async_to_sync(aresume)(step, following)
        else:
            steps.make_ready(following)


def _timeout(call: ToolCall) -> float:
    """How long ``call``'s tool may run (its ``timeout``; the default for a tool gone)."""
    model = conf.get_model(call.generation.model)
    found = tools.tools_of(model).get(call.name) if model is not None else None
    return found.timeout if found is not None else tools.DEFAULT_TIMEOUT


def _interrupt(pk: Any, stale_before: datetime, now: datetime) -> bool:
    with transaction.atomic(using=router.db_for_write(Generation)):
        row = (Generation.objects.select_for_update()
               .select_related("conversation", "prompt_message")
               .filter(pk=pk, status=Status.STREAMING, heartbeat_at__lt=stale_before).first())
        if row is None:
            return False
        row.status = Status.INTERRUPTED
        row.reason = "worker stopped responding"
        row.error_type = "worker_lost"
        row.completed_at = now
        row.heartbeat_at = None
        if row.content or row.reasoning:  # a reasoning model's thinking is billed too
            row.usage_source = Generation.UsageSource.ESTIMATED
            row.completion_tokens = estimate_tokens(row.content + row.reasoning)
            row.prompt_tokens = estimate_tokens("".join(map(message_text, history(row))))
        _price(row)  # at the price of answered_by, when a checkpoint wrote it
        if row.answered_by:
            _lost_call(row, now)
        if row.content:
            store.save_reply(row, row.content)
            for name, value in rendered.fields(row.content).items():
                setattr(row, name, value)
        row.save()
        quota.settle(row)
        transaction.on_commit(partial(reporting.finished_now, row))
    return True


def _lost_call(row: Generation, now: datetime) -> None:
    """Record the call that was answering ``row`` when its worker died, as failed: numbered
    after the calls its checkpoint wrote (those that failed before it). When it started is not
    stored: no earlier than the call before it ended (or the stream started)."""
    before = row.attempts.order_by("-number").first()
    Attempt.objects.create(
        generation=row, number=before.number + 1 if before is not None else 1,
        model=row.answered_by, status=Attempt.Status.FAILED, error_type=row.error_type,
        started_at=(before.finished_at if before is not None else None) or row.started_at or now,
        first_token_at=row.first_token_at, finished_at=now)


def _abandon(pk: Any, now: datetime) -> bool:
    with transaction.atomic(using=router.db_for_write(Generation)):
        changed = Generation.objects.filter(pk=pk, status=Status.PENDING).update(
            status=Status.CANCELLED, reason="never streamed", error_type="abandoned",
            completed_at=now)
        if changed:
            row = Generation.objects.get(pk=pk)
            _price(row)  # nothing generated: costs nothing, if it has a price
            row.save(update_fields=["cost", "currency"])  # in the transaction of the outcome
            quota.settle(row)
            transaction.on_commit(partial(reporting.finished_now, row))
    return bool(changed)


def _price(row: Generation) -> None:
    """Set ``row``'s cost and currency from its final usage."""
    for name, value in quota.cost_fields(row).items():
        setattr(row, name, value)


asweep = in_executor(sweep)

_last_lazy_sweep = 0.0
_running: set[asyncio.Task[Any]] = set()


def maybe_sweep_soon() -> None:
    """Start a sweep in the background, at most every ``CHATSTREAM_SWEEP_INTERVAL`` seconds."""
    global _last_lazy_sweep
    interval, now = conf.SWEEP_INTERVAL, time.monotonic()
    if not interval or now - _last_lazy_sweep < interval or _running:
        return
    _last_lazy_sweep = now
    task = asyncio.get_running_loop().create_task(asweep())
    _running.add(task)
    task.add_done_callback(_running.discard)
