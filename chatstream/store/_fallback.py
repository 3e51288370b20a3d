"""The final save's fallback: what a generation keeps when its final transaction failed.

The store's final save can fail however well its fields fit (the database refused a statement,
its connection dropped). Its generation must not stay ``streaming`` with its last text lost, to
be swept later as ``interrupted`` and charged nothing. :func:`finish_anyway` saves what it can,
through the ORM on the shared executor (on PostgreSQL, a connection other than the stream pool's
that failed), one step after the other, each tried even when the one before failed: the outcome,
text and usage (:data:`KEPT`) in one statement; the reply message; the records of its upstream
calls; the quota settlement. Each
failure is logged (its type and traceback; its message, which may quote the values, at DEBUG).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from django.db import router, transaction
from django.utils import timezone

from .._failures import log_failure
from .._loops import in_executor
from ..models import Attempt, Conversation, Generation
from ._base import Settlement
from ._orm import save_reply, settle

logger = logging.getLogger("chatstream.lifecycle")

# The fields saved by the fallback: how the reply ended, its text, and what it is charged.
KEPT = ("status", "reason", "error_type", "content", "reasoning", "first_token_at",
        "completed_at", "heartbeat_at", "prompt_tokens", "cached_tokens", "completion_tokens",
        "reasoning_tokens", "usage_source", "answered_by", "cost", "currency")


async def finish_anyway(generation: Generation, fields: dict[str, Any],
                        settlement: Settlement | None = None,
                        attempts: Sequence[Attempt] = ()) -> None:
    """Save what can be saved of ``fields`` (see the module docstring) and ``attempts``, the
    hold settled by ``settlement``, then reload the generation as stored."""
    await in_executor(_finish_anyway)(generation, fields, settlement, attempts)


def _finish_anyway(generation: Generation, fields: dict[str, Any],
                   settlement: Settlement | None, attempts: Sequence[Attempt]) -> None:
    db = generation._state.db or router.db_for_write(Generation)
    kept = {name: fields[name] for name in KEPT if name in fields}

    def outcome() -> None:
        Generation.objects.using(db).filter(pk=generation.pk).update(**kept)

    def reply() -> None:
        with transaction.atomic(using=db):
            if kept.get("content"):
                save_reply(generation, kept["content"])
            Conversation.objects.using(db).filter(pk=generation.conversation_id).update(
                updated_at=timezone.now())

    def settled() -> None:
        if settlement is not None:
            with transaction.atomic(using=db):
                settle(db, generation.pk, settlement)

    def calls() -> None:
        for attempt in attempts:  # the final transaction may have numbered them, then failed
            attempt.pk = None
        Attempt.objects.using(db).bulk_create(attempts)

    for step, what in ((outcome, "its outcome and text"), (reply, "its reply message"),
                       (calls, "its upstream calls"), (settled, "its quota settlement"),
                       (generation.refresh_from_db, "reloading it")):
        _try(step, generation, what)


def _try(step: Callable[[], Any], generation: Generation, what: str) -> Any:
    try:
        return step()
    except Exception as error:
        log_failure(logger, error, "Generation %s: the fallback save failed at %s",
                    generation.pk, what)
        return None
