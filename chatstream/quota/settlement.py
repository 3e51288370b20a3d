"""Settlement: turn a reply's hold into its charge once the reply has ended, exactly once."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models.signals import pre_delete
from django.utils import timezone

from ..domain.usage import estimate_tokens
from ..models import Generation, QuotaCharge
from .ledger import db_for

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

logger = logging.getLogger("chatstream.quota")

# A provider's usage above this many times the reservation is impossible (byte-level tokenizers
# give at most one token per byte, about 4 per estimated token; the reply is capped by
# max_tokens): it is charged at our estimate instead, and logged.
PLAUSIBLE_FACTOR = 4


def settle(generation: Generation, *, now: datetime | None = None) -> QuotaCharge | None:
    """Settle ``generation``'s reservation to its final usage (inside the caller's transaction).

    Provider usage when it arrived (and is plausible), the estimate when the stream ended
    without it, nothing when nothing was generated. Idempotent: the second call changes nothing
    and returns None, as does a call for a live generation or one that was never admitted.
    """
    if generation.status in Generation.LIVE:
        return None
    db = db_for(generation)
    charge = QuotaCharge.objects.using(db).filter(
        generation_id=generation.pk, settled_at__isnull=True
    ).first()
    if charge is None:
        return None
    charged, source = charge_for(generation, charge)
    return _close(charge, charged, source, db, now)


def settle_deleted(generation: Generation, *, now: datetime | None = None) -> None:
    """A generation is being deleted (its conversation was): close its hold fairly now."""
    if generation.status == Generation.Status.PENDING:
        generation.usage_source = Generation.UsageSource.NONE
    elif generation.status == Generation.Status.STREAMING:
        # Its stream stops at the next checkpoint; charge what it wrote so far, as of the last
        # checkpoint: its text and its reasoning, both sent to the page as they came.
        generation.usage_source = Generation.UsageSource.ESTIMATED
        generation.prompt_tokens = generation.completion_tokens = None
    db = db_for(generation)
    charge = QuotaCharge.objects.using(db).filter(
        generation_id=generation.pk, settled_at__isnull=True
    ).first()
    if charge is not None:
        charged, source = charge_for(generation, charge)
        _close(charge, charged, source, db, now)


def settle_orphans(user: AbstractBaseUser, *, now: datetime | None = None) -> None:
    """Settle ``user``'s holds whose generation ended, or vanished, without being settled."""
    settle_orphans_of(user.pk, db_for(user), now or timezone.now())


def settle_orphans_of(user_id: Any, db: str, now: datetime) -> None:
    """:func:`settle_orphans` for the user ``user_id`` in database ``db`` (for admission)."""
    # Belt and braces: every exit path settles; this repairs a path that did not.
    open_ids = set(QuotaCharge.objects.using(db).filter(
        user_id=user_id, settled_at__isnull=True
    ).values_list("generation_id", flat=True))
    if not open_ids:
        return
    rows = {g.pk: g for g in Generation.objects.using(db).filter(pk__in=open_ids)
            .exclude(status__in=Generation.LIVE)}
    live = set(Generation.objects.using(db).filter(pk__in=open_ids, status__in=Generation.LIVE)
               .values_list("pk", flat=True))
    for generation_id in open_ids - live:
        generation = rows.get(generation_id)
        if generation is not None:
            settle(generation, now=now)
            continue
        charge = QuotaCharge.objects.using(db).get(generation_id=generation_id)
        logger.warning("Quota hold %s outlived its generation; charged in full", generation_id)
        _close(charge, charge.reserved, QuotaCharge.Source.RESERVATION, db, now)


def _close(charge: QuotaCharge, charged: int, source: str, db: str,
           now: datetime | None) -> QuotaCharge | None:
    now = now or timezone.now()
    # The condition makes a racing second settlement (sweeper vs. finish) a no-op.
    changed = QuotaCharge.objects.using(db).filter(pk=charge.pk, settled_at__isnull=True).update(
        charged=charged, source=source, settled_at=now
    )
    if not changed:
        return None
    charge.charged, charge.source, charge.settled_at = charged, source, now
    return charge


def charge_for(generation: Generation, charge: QuotaCharge) -> tuple[int, str]:
    """What ``charge`` settles to for ``generation``'s outcome: (tokens, source)."""
    return settlement_for(generation).against(charge)


@dataclass(frozen=True)
class Settlement:
    """What a reply's hold settles to, as data: computed from its outcome here, applied to the
    hold by the store in the transaction that saves the outcome (:meth:`against`)."""

    generation_id: Any
    usage_source: str
    reported: int | None  # the tokens the usage counts (prompt and completion), if whole
    generated: int  # the estimated tokens of what was generated (text, reasoning, tool calls)
    prompt_tokens: Any = None
    completion_tokens: Any = None

    def against(self, charge: QuotaCharge) -> tuple[int, str]:
        """What ``charge`` (the hold) settles to: (tokens, source)."""
        Source = QuotaCharge.Source
        if self.usage_source == Generation.UsageSource.NONE:
            return 0, Source.RELEASED
        estimate = charge.prompt_estimate + self.generated
        if self.usage_source == Generation.UsageSource.PROVIDER:
            if self.reported is not None and self.reported <= PLAUSIBLE_FACTOR * charge.reserved:
                return self.reported, Source.PROVIDER
            logger.warning("Generation %s: implausible provider usage (%r prompt, %r completion) "
                           "charged at the estimate", self.generation_id, self.prompt_tokens,
                           self.completion_tokens)
            return estimate, Source.ESTIMATED
        if self.usage_source == Generation.UsageSource.ESTIMATED:
            return (self.reported if self.reported is not None else estimate), Source.ESTIMATED
        return charge.reserved, Source.RESERVATION  # unknown outcome: keep the whole hold


def settlement_for(generation: Generation) -> Settlement:
    """How ``generation``'s hold settles, from its outcome's fields (set, saved or not)."""
    return Settlement(
        generation.pk, generation.usage_source,
        _tokens(generation.prompt_tokens, generation.completion_tokens), _generated(generation),
        generation.prompt_tokens, generation.completion_tokens)


RELEASED = Settlement(None, Generation.UsageSource.NONE, None, 0)
"""The settlement of a reply that generated nothing (a pending one cancelled): no charge."""


def _tokens(*values: object) -> int | None:
    """The sum of non-negative integer counts, or None if any is missing or not one."""
    counts = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    return sum(counts) if len(counts) == len(values) else None


def _generated(generation: Generation) -> int:
    # What was generated, as a finished stream counts it (usage.usage_fields): the text, the
    # reasoning (a reasoning model's thinking is billed as completion tokens) and tool calls.
    tools = sum(estimate_tokens(str(call.get("arguments", "")))
                for call in (generation.tool_calls or []) if isinstance(call, dict))
    return estimate_tokens((generation.content or "") + (generation.reasoning or "")) + tools


def _settle_deleted_generation(sender: type[Generation], instance: Generation, **kwargs: object
                               ) -> None:
    # Deleting a conversation deletes its generations: their holds are closed, never refunded.
    settle_deleted(instance)


pre_delete.connect(_settle_deleted_generation, sender=Generation,
                   dispatch_uid="chatstream_quota_deleted")
