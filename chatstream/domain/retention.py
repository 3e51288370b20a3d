"""Deleting users' history: conversations nobody has touched for long (retention, see
``CHATSTREAM_RETENTION_DAYS``), and everything of one user (erasure).

The unit of deletion is the conversation: its messages, generations, tool calls, attempts and
feedback go with it (``CASCADE``). Deleting old generations out of a conversation still in use
would change what its next reply is sent (:mod:`chatstream.domain.history` reads them).
Deletion runs in batches, each in its own transaction, so memory and lock time stay bounded.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from ..models import Attempt, Conversation, Feedback, Generation, Message, ToolCall

BATCH_SIZE = 500  # conversations per transaction

# Tool calls that are part of a live round: waiting for the user, about to run, running.
WAITING_CALLS = (ToolCall.Status.PENDING_APPROVAL, ToolCall.Status.APPROVED,
                 ToolCall.Status.RUNNING)

LABELS = {Conversation: "conversations", Message: "messages", Generation: "generations",
          ToolCall: "tool_calls", Attempt: "attempts", Feedback: "feedback"}


def cutoff(days: int, now: datetime) -> datetime:
    """``days`` before ``now``: the last activity a kept conversation has had since. For more
    days than there are dates (a site's "for ever" written as a large number), the first."""
    try:
        return now - timedelta(days=days)
    except OverflowError:
        return datetime.min.replace(tzinfo=UTC)


def stale_conversations(cutoff: datetime, using: str = "default") -> QuerySet[Conversation]:
    """Conversations with no activity since ``cutoff`` (``updated_at``, a message, a
    generation, a tool call, a rating) and nothing live: no generation pending or streaming,
    no tool call waiting for approval, approved or running, however old."""
    in_conversation = {"conversation": OuterRef("pk")}
    recent_generation = Generation.objects.filter(**in_conversation).filter(
        Q(created_at__gte=cutoff) | Q(status__in=Generation.LIVE))
    recent_message = Message.objects.filter(**in_conversation, created_at__gte=cutoff)
    live_call = ToolCall.objects.filter(generation__conversation=OuterRef("pk")).filter(
        Q(status__in=WAITING_CALLS) | Q(finished_at__gte=cutoff) | Q(decided_at__gte=cutoff))
    recent_rating = Feedback.objects.filter(generation__conversation=OuterRef("pk"),
                                            updated_at__gte=cutoff)
    return (
        Conversation.objects.using(using).filter(updated_at__lt=cutoff)
        .exclude(Exists(recent_generation)).exclude(Exists(recent_message))
        .exclude(Exists(live_call)).exclude(Exists(recent_rating))
    )


def counts(conversations: QuerySet[Conversation]) -> dict[str, int]:
    """How many rows of each kind deleting ``conversations`` deletes."""
    ids = conversations.values("pk")
    db = conversations.db
    return {
        "conversations": conversations.count(),
        "messages": Message.objects.using(db).filter(conversation__in=ids).count(),
        "generations": Generation.objects.using(db).filter(conversation__in=ids).count(),
        "tool_calls": ToolCall.objects.using(db).filter(
            generation__conversation__in=ids).count(),
        "attempts": Attempt.objects.using(db).filter(generation__conversation__in=ids).count(),
        "feedback": Feedback.objects.using(db).filter(generation__conversation__in=ids).count(),
    }


def _tally(total: dict[str, int], per_model: dict[str, int]) -> None:
    for model, label in LABELS.items():
        total[label] = total.get(label, 0) + per_model.get(model._meta.label, 0)


def delete_conversations(conversations: QuerySet[Conversation], *,
                         batch_size: int = BATCH_SIZE) -> dict[str, int]:
    """Delete ``conversations`` (a query, run again for each batch) with everything in them,
    ``batch_size`` per transaction; how many rows of each kind went."""
    deleted = dict.fromkeys(LABELS.values(), 0)
    db = conversations.db
    while ids := list(conversations.values_list("pk", flat=True)[:batch_size]):
        with transaction.atomic(using=db):
            # Again under the transaction: a conversation may have come back to life since.
            _total, per_model = conversations.filter(pk__in=ids).delete()
        _tally(deleted, per_model)
        if not per_model.get(Conversation._meta.label):
            break  # none of the batch was still to go: do not read the same ids for ever
    return deleted


def erase_user(user: Any, *, using: str = "default",
               batch_size: int = BATCH_SIZE) -> dict[str, int]:
    """Delete every row of chatstream that holds ``user``'s words: their conversations with
    everything in them, and any generation or rating of theirs elsewhere. What is left
    (quota charges and limits, which hold no text) goes with the user row itself."""
    deleted = delete_conversations(
        Conversation.objects.using(using).filter(user_id=user.pk), batch_size=batch_size)
    for model in (Generation, Feedback):
        rows: QuerySet[Any] = model.objects.using(using).filter(user_id=user.pk)
        while ids := list(rows.values_list("pk", flat=True)[:batch_size]):
            with transaction.atomic(using=using):
                if model is Generation:  # their replies' text, which SET_NULL would keep
                    _tally(deleted, Message.objects.using(using).filter(
                        generation_id__in=ids).delete()[1])
                _total, per_model = rows.filter(pk__in=ids).delete()
            _tally(deleted, per_model)
    return deleted


def described(counted: dict[str, int]) -> str:
    """``counted`` in words, for a command's output: "1 conversation, 5 messages, ..."."""
    return ", ".join(f"{count} {_label(label, count)}" for label, count in counted.items())


def _label(label: str, count: int) -> str:
    words = label.replace("_", " ")
    return words.removesuffix("s") if count == 1 else words
