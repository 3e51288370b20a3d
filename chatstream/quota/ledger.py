"""The usage ledger read over its periods: what counts against a user's limits at one instant."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db import router
from django.db.models import (
    Case,
    Count,
    DecimalField,
    Exists,
    Model,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    When,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from ..models import Generation, QuotaCharge

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser

DAY = timedelta(hours=24)
MINUTE = timedelta(seconds=60)


@dataclass(frozen=True)
class Usage:
    """What counts against a user's limits at one instant."""

    tokens_day: int = 0
    tokens_month: int = 0
    requests_minute: int = 0
    live: int = 0
    held_day: int = 0  # the part of tokens_day still held by replies in flight
    held_month: int = 0
    cost_day: Decimal = Decimal(0)  # money, in CHATSTREAM_CURRENCY: charges without a price
    cost_month: Decimal = Decimal(0)  # count nothing
    held_cost_day: Decimal = Decimal(0)
    held_cost_month: Decimal = Decimal(0)


def db_for(instance: Model) -> str:
    """The database holding ``instance``'s ledger: its own, else where charges are written."""
    return instance._state.db or router.db_for_write(QuotaCharge)


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """``[start, end)`` of the calendar month containing ``now``, in the site's TIME_ZONE."""
    if timezone.is_naive(now):  # USE_TZ = False: naive local times throughout
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        year, month = divmod(start.month, 12)
        return start, start.replace(year=start.year + year, month=month + 1)
    tz = timezone.get_default_timezone()
    local = timezone.localtime(now, tz)
    start = datetime(local.year, local.month, 1, tzinfo=tz)
    year, month = divmod(local.month, 12)
    return start, datetime(local.year + year, month + 1, 1, tzinfo=tz)


@dataclass(frozen=True)
class Periods:
    """Where the periods a limit counts over begin (and the month ends), at one instant: each a
    datetime, or a slot of a statement built once (``store.Slot``)."""

    day: Any  # the rolling 24 hours: after it
    month_start: Any  # the calendar month: from it, before month_end
    month_end: Any
    minute: Any  # the rolling minute: after it
    since: Any  # every period's charges lie from here on

    @classmethod
    def at(cls, now: datetime) -> Periods:
        month_start, month_end = month_bounds(now)
        return cls(now - DAY, month_start, month_end, now - MINUTE, min(month_start, now - DAY))


def _usage_aggregates(periods: Periods) -> dict[str, Any]:
    tokens = Coalesce("charged", "reserved")
    # The hold while open, the charge once settled (empty for a reply without a price).
    money = Case(When(settled_at__isnull=True, then="reserved_cost"), default="charged_cost")
    zero = Decimal(0)
    decimal = DecimalField(max_digits=30, decimal_places=10)
    in_day = Q(at__gt=periods.day)
    in_month = Q(at__gte=periods.month_start, at__lt=periods.month_end)
    is_open = Q(settled_at__isnull=True)
    # A stream slot is an open hold whose generation is still live; a hold whose generation
    # ended without settling (see settle_orphans) must not lock the user out.
    in_flight = is_open & Q(Exists(Generation.objects.filter(
        pk=OuterRef("generation_id"), status__in=Generation.LIVE
    )))
    return {
        "tokens_day": Coalesce(Sum(tokens, filter=in_day), 0),
        "tokens_month": Coalesce(Sum(tokens, filter=in_month), 0),
        "requests_minute": Count("pk", filter=Q(at__gt=periods.minute)),
        "live": Count("pk", filter=in_flight),
        "held_day": Coalesce(Sum("reserved", filter=in_day & is_open), 0),
        "held_month": Coalesce(Sum("reserved", filter=in_month & is_open), 0),
        "cost_day": Sum(money, filter=in_day, default=zero, output_field=decimal),
        "cost_month": Sum(money, filter=in_month, default=zero, output_field=decimal),
        "held_cost_day": Sum("reserved_cost", filter=in_day & is_open, default=zero,
                             output_field=decimal),
        "held_cost_month": Sum("reserved_cost", filter=in_month & is_open, default=zero,
                               output_field=decimal),
    }


def usage_of(charges: QuerySet[QuotaCharge], now: datetime) -> Usage:
    """The usage that ``charges`` (one user's ledger) add up to at ``now``."""
    # One statement, so one consistent snapshot of the ledger.
    return Usage(**charges.aggregate(**_usage_aggregates(Periods.at(now))))


def by_period(user: Any, periods: Periods) -> QuerySet[QuotaCharge, Any]:
    """The figures a user's limits count by period (``tokens_day``, ``tokens_month``,
    ``requests_minute``) of the user ``user`` (an id, or a slot), read from the charges of
    their periods alone (the ``user, at`` index): one row, the user's id and then each figure
    in that order; none for a user without charges in any of them."""
    aggregates = _usage_aggregates(periods)
    return (QuotaCharge.objects.filter(user_id=user, at__gte=periods.since).order_by()
            .values("user_id").annotate(**{name: aggregates[name] for name in (
                "tokens_day", "tokens_month", "requests_minute")}))


def usage(user: AbstractBaseUser, *, now: datetime | None = None,
          only: Iterable[str] | None = None) -> Usage:
    """``user``'s usage at ``now`` (default: now), reservations in flight included; ``only``
    some of its figures (among ``tokens_day``, ``tokens_month`` and ``requests_minute``: the
    others are 0), read from the charges of their periods alone (:func:`by_period`)."""
    db = db_for(user)
    now = now or timezone.now()
    if only is None:
        return usage_of(QuotaCharge.objects.using(db).filter(user_id=user.pk), now)
    wanted = set(only)
    if not wanted <= {"tokens_day", "tokens_month", "requests_minute"}:
        raise ValueError(f"not a figure read by period: {sorted(wanted)!r}")
    rows = list(by_period(user.pk, Periods.at(now)).using(db))
    return Usage(**{name: rows[0][name] for name in wanted}) if rows else Usage()


def usage_for_many(user_ids: list[Any], *, now: datetime | None = None,
                   using: str | None = None) -> dict[Any, Usage]:
    """Usage of several users in one grouped query (for the admin)."""
    db = using or router.db_for_read(QuotaCharge)
    rows: Iterable[Mapping[str, Any]] = (
        QuotaCharge.objects.using(db).filter(user_id__in=user_ids).order_by()
        .values("user_id").annotate(**_usage_aggregates(Periods.at(now or timezone.now())))
    )
    found = {
        row["user_id"]: Usage(**{name: value for name, value in row.items() if name != "user_id"})
        for row in rows
    }
    return {pk: found.get(pk, Usage()) for pk in user_ids}
