"""Settlement: turn a reply's hold into its charge once the reply has ended, exactly once."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db.models.signals import pre_delete
from django.utils import timezone

from ..domain.usage import estimate_tokens
from ..models import Generation, QuotaCharge
from .ledger import db_for
from .pricing import Price, answered_by, cost_fields, price_of, rounded

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
    return _close(charge, charge_for(generation, charge), db, now)


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
        _close(charge, charge_for(generation, charge), db, now)


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
    rows = {g.pk: g for g in Generation.objects.using(db).filter(pk__in=open_ids)}
    for generation_id in open_ids:
        generation = rows.get(generation_id)
        if generation is not None:  # settled once ended; a live reply's is its own
            settle(generation, now=now)
            continue
        charge = QuotaCharge.objects.using(db).get(generation_id=generation_id)
        logger.warning("Quota hold %s outlived its generation; charged in full", generation_id)
        _close(charge, {"charged": charge.reserved, "charged_cost": charge.reserved_cost,
                        "source": QuotaCharge.Source.RESERVATION}, db, now)


def _close(charge: QuotaCharge, settled: dict[str, Any], db: str,
           now: datetime | None) -> QuotaCharge | None:
    settled = {**settled, "settled_at": now or timezone.now()}
    # The condition makes a racing second settlement (sweeper vs. finish) a no-op.
    changed = QuotaCharge.objects.using(db).filter(pk=charge.pk, settled_at__isnull=True).update(
        **settled
    )
    if not changed:
        return None
    for name, value in settled.items():
        setattr(charge, name, value)
    return charge


def charge_for(generation: Generation, charge: QuotaCharge) -> dict[str, Any]:
    """What ``charge`` settles to for ``generation``'s outcome (see Settlement.against)."""
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
    cost: Decimal | None = None  # the reply's cost (Generation.cost): its usage priced
    price: Price | None = None  # the answering model's, for a charge at the estimate

    def against(self, charge: QuotaCharge) -> dict[str, Any]:
        """What ``charge`` (the hold) settles to: its ``charged`` tokens, ``charged_cost``
        (the same tokens priced; None without a price) and ``source``."""
        Source = QuotaCharge.Source
        if self.usage_source == Generation.UsageSource.NONE:
            free = None if self.price is None and charge.reserved_cost is None else Decimal(0)
            return self._charge(0, free, Source.RELEASED)
        if self.usage_source == Generation.UsageSource.PROVIDER:
            if self.reported is not None and self.reported <= PLAUSIBLE_FACTOR * charge.reserved:
                return self._charge(self.reported, self.cost, Source.PROVIDER)
            logger.warning("Generation %s: implausible provider usage (%r prompt, %r completion) "
                           "charged at the estimate", self.generation_id, self.prompt_tokens,
                           self.completion_tokens)
            return self._estimate(charge)
        if self.usage_source == Generation.UsageSource.ESTIMATED:
            if self.reported is not None:
                return self._charge(self.reported, self.cost, Source.ESTIMATED)
            return self._estimate(charge)
        # Unknown outcome: keep the whole hold.
        return self._charge(charge.reserved, charge.reserved_cost, Source.RESERVATION)

    def _estimate(self, charge: QuotaCharge) -> dict[str, Any]:
        """The hold's prompt estimate and what was generated, priced at the answering model's
        price (the reply's usage being missing or implausible)."""
        cost = None if self.price is None else rounded(
            self.price.of(prompt=charge.prompt_estimate, completion=self.generated))
        return self._charge(charge.prompt_estimate + self.generated, cost,
                            QuotaCharge.Source.ESTIMATED)

    def cost_fields(self, generation: Generation) -> dict[str, Any]:
        """The ``cost`` and ``currency`` of ``generation`` as it ends, from its usage."""
        return cost_fields(generation)

    @staticmethod
    def _charge(tokens: int, cost: Decimal | None, source: str) -> dict[str, Any]:
        return {"charged": tokens, "charged_cost": cost, "source": source}


def settlement_for(generation: Generation) -> Settlement:
    """How ``generation``'s hold settles, from its outcome's fields (set, saved or not)."""
    cost = generation.cost if generation.cost is not None else cost_fields(generation)["cost"]
    return Settlement(
        generation.pk, generation.usage_source,
        _tokens(generation.prompt_tokens, generation.completion_tokens), _generated(generation),
        generation.prompt_tokens, generation.completion_tokens, cost,
        price_of(answered_by(generation)))


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
