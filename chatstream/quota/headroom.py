"""What a user has left under the limits counted by period (requests per minute, tokens per
day and per month): the JSON API's rate-limit headers.

Two statements at most, each built by the ORM once (``store.compiled``), not on every request:
the user's overrides (their own and their groups', one union), then, when one of those limits
applies, the ledger's periods (the ``user, at`` index). Read through Django's connection
(:func:`headroom`), or on the event loop through a PostgreSQL store's pool
(:func:`aheadroom`), the ledger's read then going alongside the overrides' when the site's
default already limits.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.utils import timezone

from .. import store
from ..models import GroupQuota, QuotaCharge, UserQuota
from .display import Remaining
from .ledger import Periods, Usage, by_period, db_for
from .limits import Limits, default_limits, overrides_of, resolve


def headroom(user: Any, *, now: datetime | None = None) -> Remaining:
    """What ``user`` has left under their requests per minute and their tokens per day and
    month at ``now`` (default: now)."""
    db = db_for(user)
    limits = _limits(db, store.fetch(db, _overrides_statement, user=user.pk))
    if not _counted_by_period(limits):
        return Remaining(limits, Usage())
    return Remaining(limits, _usage(store.fetch(db, _ledger_statement, **_slots(user.pk, now))))


async def aheadroom(user_id: Any, reader: store.PostgresStore) -> Remaining:
    """:func:`headroom` of the user ``user_id``, now, read on the event loop through ``reader``
    (the store of the ledger's database, on PostgreSQL)."""
    ledger = None
    if _counted_by_period(default_limits()):
        ledger = asyncio.ensure_future(reader.rows(_ledger_statement, **_slots(user_id)))
    try:
        limits = _limits(reader.db, await reader.rows(_overrides_statement, user=user_id))
        if not _counted_by_period(limits):
            return Remaining(limits, Usage())
        if ledger is None:
            ledger = asyncio.ensure_future(reader.rows(_ledger_statement, **_slots(user_id)))
        return Remaining(limits, _usage(await ledger))
    finally:
        if ledger is not None and not ledger.done():
            ledger.cancel()
        elif ledger is not None and not ledger.cancelled():
            ledger.exception()  # a read not needed after all: its failure is not one


def _counted_by_period(limits: Limits) -> bool:
    return (limits.requests_per_minute is not None or limits.tokens_per_day is not None
            or limits.tokens_per_month is not None)


def _overrides_statement() -> QuerySet[Any]:
    return overrides_of(store.Slot("user", _user_key()))


def _limits(db: str, rows: list[tuple[Any, ...]]) -> Limits:
    """The limits of a user whose overrides are ``rows`` (of :func:`overrides_of`)."""
    own, groups = None, []
    for *columns, of_group in rows:
        if of_group:
            groups.append(store.from_row(GroupQuota, db, columns))
        else:
            own = store.from_row(UserQuota, db, columns)
    return resolve(default_limits(), own, groups)


_PERIODS = ("day", "month_start", "month_end", "minute", "since")


def _ledger_statement() -> QuerySet[Any]:
    at = QuotaCharge._meta.get_field("at")
    return by_period(store.Slot("user", _user_key()),
                     Periods(**{name: store.Slot(name, at) for name in _PERIODS}))


def _slots(user_id: Any, now: datetime | None = None) -> dict[str, Any]:
    periods = Periods.at(now or timezone.now())
    return {"user": user_id, **{name: getattr(periods, name) for name in _PERIODS}}


def _usage(rows: list[tuple[Any, ...]]) -> Usage:
    if not rows:
        return Usage()  # no charges in any period
    _user, day, month, minute = rows[0]  # as by_period() selects them
    return Usage(tokens_day=int(day), tokens_month=int(month), requests_minute=int(minute))


def _user_key() -> Any:
    """The field a user's id is prepared as (their model's primary key)."""
    return get_user_model()._meta.pk
