"""The user's decision on a tool call waiting for approval.

One transaction: the reply's next step is locked (decisions on the calls of one step take
turns), the call moves from ``pending_approval`` to ``approved`` or ``denied`` by one
conditional UPDATE (of two decisions racing, through any processes, exactly one wins; the
other is ``AlreadyDecided``), and whether any call of the step still waits is read. The caller
that decided the last one runs the step's approved calls and lets the next step start
(``stream.aresume``): nothing of a step runs until each of its calls is decided.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import router, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from ..exceptions import AlreadyDecided
from ..models import Generation, ToolCall

Status = ToolCall.Status


def expire_overdue(before: datetime) -> tuple[int, list[tuple[Generation, Generation]]]:
    """End ``expired`` every call waiting for a decision since before ``before``, step by step
    as :func:`decide` decides one: how many, and each step whose last waiting call this was,
    with its next step (whose calls may now run)."""
    waiting = ToolCall.objects.filter(status=Status.PENDING_APPROVAL, created_at__lt=before)
    expired, resumed = 0, []
    for step_id in set(waiting.values_list("generation_id", flat=True)):
        with transaction.atomic(using=router.db_for_write(Generation)):
            following = Generation.objects.select_for_update().filter(
                follows_id=step_id, status=Generation.Status.PENDING,
                waits_for_tools=True).order_by("-created_at").first()
            expired += waiting.filter(generation_id=step_id).update(
                status=Status.EXPIRED, finished_at=timezone.now())
            if following is not None and not ToolCall.objects.filter(
                    generation_id=step_id, status=Status.PENDING_APPROVAL).exists():
                resumed.append((Generation.objects.get(pk=step_id), following))
    return expired, resumed


def decide(call_id: UUID, user: Any, *, approve: bool) -> tuple[ToolCall, Generation | None]:
    """Approve or deny the user's call ``call_id``; the call as decided and, when it was the
    last of its step to wait, the step's next step (still waiting: its calls may now run).
    ``ToolCall.DoesNotExist`` when the call is not the user's; ``AlreadyDecided`` when it no
    longer waits for a decision."""
    with transaction.atomic(using=router.db_for_write(Generation)):
        call = ToolCall.objects.select_related("generation").filter(
            pk=call_id, generation__user=user).first()
        if call is None:
            raise ToolCall.DoesNotExist(f"No tool call {call_id} of this user.")
        following = Generation.objects.select_for_update().filter(
            follows_id=call.generation_id, status=Generation.Status.PENDING,
            waits_for_tools=True).order_by("-created_at").first()
        status, now = (Status.APPROVED if approve else Status.DENIED), timezone.now()
        if following is None or not ToolCall.objects.filter(
                pk=call.pk, status=Status.PENDING_APPROVAL).update(
                status=status, decided_by=user, decided_at=now):
            raise AlreadyDecided(_("This tool call was already decided."))
        call.status, call.decided_by, call.decided_at = status, user, now
        waiting = ToolCall.objects.filter(generation_id=call.generation_id,
                                          status=Status.PENDING_APPROVAL).exists()
    return call, None if waiting else following
