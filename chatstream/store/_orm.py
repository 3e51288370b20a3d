"""A stream's database work through Django's ORM, on the shared executor: :class:`OrmStore`.

The sync functions here are the work itself (the sweeper and the views call some of them
directly); :class:`OrmStore` runs each on the shared executor (``thread_sensitive=False``), so
streams never queue behind one another on a single thread, and an open stream pins no thread
and no connection between writes. Connections there follow ``CONN_MAX_AGE`` as a request's
would: closed after each call when it is 0, kept (and health-checked) when persistent or
pooled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.db import connections, router, transaction
from django.utils import timezone

from .._loops import in_executor
from ..models import Attempt, Conversation, Generation, Message, QuotaCharge
from ._base import Settlement, Store
from ._sql import (
    active_user_lookup,
    checkpoint_condition,
    checkpoint_update_sql,
    claim_changes,
    claim_statement,
    field,
    generation_from_row,
    updates_return_rows,
)

Status = Generation.Status
logger = logging.getLogger("chatstream.lifecycle")


def claim(generation_id: UUID, user_id: Any, using: str | None = None) -> Generation | None:
    """Atomically move the user's pending generation to streaming; None if it wasn't ours to take.

    One conditional UPDATE decides: of any number of concurrent callers, exactly one wins. On
    PostgreSQL and SQLite it also returns the row (``UPDATE ... RETURNING``), so a stream's
    start costs one database round trip; elsewhere the row is read after the update.
    """
    db = using or router.db_for_write(Generation)
    if updates_return_rows(connections[db]):
        sql, params = claim_statement(db, generation_id, user_id)
        with connections[db].cursor() as cursor:
            cursor.execute(sql, params)
            # Read to the end: SQLite commits an UPDATE ... RETURNING once it is stepped out.
            found = cursor.fetchall()
        if not found:
            return None
        generation = generation_from_row(db, found[0])
    else:
        changes, where = claim_changes(generation_id, user_id)
        if not Generation.objects.using(db).filter(**where, **active_user_lookup()).update(
                **changes):
            return None
        generation = Generation.objects.using(db).get(pk=generation_id)
    return generation


def owns(generation_id: UUID, user_id: Any) -> bool:
    return Generation.objects.filter(pk=generation_id, user_id=user_id).exists()


def load(generation_id: UUID) -> Generation:
    return Generation.objects.select_related("conversation", "prompt_message").get(
        pk=generation_id
    )


def watched_since(generation_id: UUID, seconds: float) -> bool:
    """Whether a page has shown this live generation within the last ``seconds``."""
    return Generation.objects.filter(
        pk=generation_id, watched_at__gte=timezone.now() - timedelta(seconds=seconds)
    ).exists()


def mark_watched(**lookup: Any) -> list[UUID]:
    """Note that a page now shows the streaming generations matching ``lookup``; their ids."""
    rows = Generation.objects.filter(status=Status.STREAMING, **lookup)
    ids = list(rows.values_list("pk", flat=True))
    if ids:
        Generation.objects.filter(pk__in=ids).update(watched_at=timezone.now())
    return ids


def follow(generation_id: UUID) -> Generation:
    """Load a generation for a page following it, noting that the page still watches."""
    mark_watched(pk=generation_id)
    return load(generation_id)


def stop_requested(generation_ids: Iterable[UUID], using: str | None = None
                   ) -> dict[UUID, str]:
    """Which of ``generation_ids`` carry the durable Stop flag, each with the ``error_type``
    written with it (why it was stopped)."""
    db = using or router.db_for_write(Generation)
    return dict(Generation.objects.using(db)
                .filter(pk__in=list(generation_ids), cancel_requested=True)
                .values_list("pk", "error_type"))


def checkpoint(rows: dict[UUID, dict[str, Any]], using: str | None = None, *,
               calls: Sequence[Attempt] = ()) -> set[UUID]:
    """Save partial text and heartbeats, and the call records ``calls`` of the rows still
    ours, in one transaction; return the rows no longer ours.

    A row stops being ours when a Stop was requested or the sweeper closed it: the conditional
    UPDATE then matches nothing, and the caller stops that stream. Rows that change the same
    columns go in one ``executemany`` (their statement built once), and one SELECT finds those
    that are no longer ours: a pass's work on the GIL no longer grows by an ORM query's
    compilation per live stream.
    """
    db = using or router.db_for_write(Generation)
    connection = connections[db]
    batches: dict[tuple[str, ...], list[list[Any]]] = {}
    for generation_id, fields in rows.items():
        params = [field(name).get_db_prep_save(value, connection)
                  for name, value in fields.items()]
        params += checkpoint_condition(connection, generation_id)
        batches.setdefault(tuple(fields), []).append(params)
    ids = list(rows)
    with transaction.atomic(using=db):
        with connection.cursor() as cursor:
            for changed, batch in batches.items():
                cursor.executemany(checkpoint_update_sql(db, changed), batch)
        ours: set[UUID] = set()
        for start in range(0, len(ids), 500):  # within every backend's parameter limit
            ours.update(Generation.objects.using(db).filter(
                pk__in=ids[start:start + 500], status=Status.STREAMING, cancel_requested=False,
            ).values_list("pk", flat=True))
        if kept := [call for call in calls if call.generation_id in ours]:
            Attempt.objects.using(db).bulk_create(kept)
    return set(ids) - ours


def finish(generation: Generation, fields: dict[str, Any],
           settlement: Settlement | None = None, attempts: Sequence[Attempt] = ()
           ) -> Generation:
    """Store a generation's outcome, its reply message, its upstream calls and, with
    ``settlement``, its quota hold settled, at once."""
    db = generation._state.db or router.db_for_write(Generation)
    with transaction.atomic(using=db):
        found = Generation.objects.using(db).filter(pk=generation.pk).update(**fields)
        for name, value in fields.items():
            setattr(generation, name, value)
        if not found:
            gone(generation)
            return generation
        if fields.get("content"):
            save_reply(generation, fields["content"])
        Conversation.objects.using(db).filter(pk=generation.conversation_id).update(
            updated_at=timezone.now())
        if attempts:
            Attempt.objects.using(db).bulk_create(attempts)
        if settlement is not None:
            settle(db, generation.pk, settlement)
    return generation


def settle(db: str, generation_id: UUID, settlement: Settlement) -> None:
    """Settle the generation's open hold, if any, as ``settlement`` says (inside the caller's
    transaction). The condition makes a racing second settlement a no-op."""
    holds = QuotaCharge.objects.using(db).filter(generation_id=generation_id,
                                                 settled_at__isnull=True)
    charge = holds.first()
    if charge is not None:
        holds.filter(pk=charge.pk).update(**settlement.against(charge),
                                          settled_at=timezone.now())


def gone(generation: Generation) -> None:
    """The generation was deleted as it streamed (its conversation, its user): nothing is left
    to save it in, and the deletion settled its quota hold (quota/settlement.py)."""
    logger.info("Generation %s was deleted while it streamed; its outcome is not stored",
                generation.pk)


def save_reply(generation: Generation, content: str) -> None:
    """Create or update the assistant message holding ``generation``'s text: one statement."""
    reply = Message(generation=generation, conversation_id=generation.conversation_id,
                    role=Message.Role.ASSISTANT, content=content)
    db = generation._state.db or router.db_for_write(Message)
    if connections[db].features.supports_update_conflicts_with_target:
        Message.objects.using(db).bulk_create(
            [reply], update_conflicts=True, unique_fields=["generation"],
            update_fields=["content"])
    else:
        Message.objects.using(db).update_or_create(generation=generation, defaults={
            "conversation_id": generation.conversation_id, "role": Message.Role.ASSISTANT,
            "content": content})


def request_stop(generation_id: UUID, *, reason: str, error_type: str, settlement: Settlement,
                 using: str | None = None) -> Generation | None:
    """Write the durable Stop flag, and why (``reason``, ``error_type``: the stream stores its
    outcome so); a generation nobody streams yet is cancelled on the spot, and returned. The
    first Stop's why is kept."""
    cancelled = cancel_pending(generation_id, reason=reason, error_type=error_type,
                               settlement=settlement, using=using)
    if cancelled is None:
        Generation.objects.using(using or router.db_for_write(Generation)).filter(
            pk=generation_id, status=Status.STREAMING, cancel_requested=False,
        ).update(cancel_requested=True, reason=reason, error_type=error_type)
    return cancelled


def cancel_pending(generation_id: UUID, *, reason: str, error_type: str, settlement: Settlement,
                   using: str | None = None) -> Generation | None:
    """Cancel the generation if nobody has started it, its quota hold settled by ``settlement``
    in the same transaction; the generation so cancelled, else None."""
    db = using or router.db_for_write(Generation)
    with transaction.atomic(using=db):
        cancelled = Generation.objects.using(db).filter(
            pk=generation_id, status=Status.PENDING,
        ).update(
            status=Status.CANCELLED, reason=reason, error_type=error_type,
            cancel_requested=True, completed_at=timezone.now(),
            usage_source=Generation.UsageSource.NONE,
        )
        if not cancelled:
            return None
        generation = Generation.objects.using(db).get(pk=generation_id)
        priced = settlement.cost_fields(generation)  # of nothing: zero, if it has a price
        Generation.objects.using(db).filter(pk=generation_id).update(**priced)
        for name, value in priced.items():
            setattr(generation, name, value)
        settle(db, generation_id, settlement)
        return generation


class OrmStore(Store):
    """The ORM, each call on the shared executor (any database Django supports)."""

    def __init__(self, db: str) -> None:
        self.db = db

    async def claim(self, generation_id: UUID, user_id: Any) -> Generation | None:
        claimed: Generation | None = await in_executor(claim)(generation_id, user_id, self.db)
        return claimed

    async def checkpoint(self, rows: dict[UUID, dict[str, Any]], *,
                         calls: Sequence[Attempt] = ()) -> set[UUID]:
        return set(await in_executor(checkpoint)(rows, self.db, calls=calls))

    async def finish(self, generation: Generation, fields: dict[str, Any],
                     settlement: Settlement | None = None,
                     attempts: Sequence[Attempt] = ()) -> None:
        await in_executor(finish)(generation, fields, settlement, attempts)

    async def stop_requested(self, generation_ids: Iterable[UUID]) -> dict[UUID, str]:
        return dict(await in_executor(stop_requested)(list(generation_ids), self.db))

    async def watched_since(self, generation_id: UUID, seconds: float) -> bool:
        return bool(await in_executor(watched_since)(generation_id, seconds))

    async def follow(self, generation_id: UUID) -> Generation:
        found: Generation = await in_executor(follow)(generation_id)
        return found

    async def owns(self, generation_id: UUID, user_id: Any) -> bool:
        return bool(await in_executor(owns)(generation_id, user_id))

    async def request_stop(self, generation_id: UUID, *, reason: str, error_type: str,
                           settlement: Settlement) -> Generation | None:
        cancelled: Generation | None = await in_executor(request_stop)(
            generation_id, reason=reason, error_type=error_type, settlement=settlement,
            using=self.db)
        return cancelled
