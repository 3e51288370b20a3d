"""Per-user quotas: admission before every upstream call, settlement after it.

**Guarantee.** For one user, admissions are serialised across threads, worker processes and
hosts that share the database: each :func:`admit` checks the limits against the ledger *and*
writes its reservation before any other admission of that user can read the ledger. So the sum
of what is admitted never exceeds a limit, however many requests race (no check-then-record gap,
no per-process counter); the only overshoot possible is a provider counting more prompt tokens
than estimated, which is charged as reported (never hidden) and blocks further admissions.

**How.** :func:`admit` runs inside the transaction that creates the pending ``Generation``.
It locks the user's :class:`~chatstream.models.QuotaAccount` row (created race-free with
``INSERT ... ON CONFLICT DO NOTHING``, then ``SELECT ... FOR UPDATE``), then reads the ledger
in one statement, decides, inserts the :class:`~chatstream.models.QuotaCharge` (the hold:
prompt estimate + ``max_tokens``) and updates the account row; the caller's commit releases
the lock. On PostgreSQL (READ COMMITTED, Django's default) the row lock makes the next admission
wait, and its statements then see the committed reservation; under REPEATABLE READ or
SERIALIZABLE the account-row update turns a race into a serialization error, never an
over-admission. On SQLite, ``select_for_update`` is a no-op, but every write transaction
already holds the database's single write lock (``"transaction_mode": "IMMEDIATE"``, checked by
``chatstream.W020``; the view's inserts take it before admission reads, even without it).

:func:`settle` turns the hold into the charge with one conditional ``UPDATE ... WHERE
settled_at IS NULL``: idempotent, never negative, and needs no account lock (so it cannot
deadlock with an admission). Every exit path of a generation calls it (finish, Stop of a
pending one, the sweeper for dead workers and abandoned ones); an admission also settles any
hold whose generation has ended or vanished without it, so no slot is held forever.

Periods: a charge is dated at admission. "Tokens per day" is any rolling 24 hours (a charge
counts from its instant for exactly 24 h); "tokens per month" is the calendar month in the
site's ``TIME_ZONE`` (``[first day 00:00, next first day 00:00)``); "requests per minute" is
any rolling 60 s. docs/quotas.md is the reference.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import connections, router
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.db.transaction import TransactionManagementError
from django.utils import timezone
from django.utils.formats import date_format, number_format
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from .conf import conf
from .exceptions import QuotaExceeded
from .models import (
    QUOTA_MAXIMUMS,
    Generation,
    GroupQuota,
    QuotaAccount,
    QuotaCharge,
    UserQuota,
)
from .usage import estimate_tokens

logger = logging.getLogger("chatstream.quota")

DAY = timedelta(hours=24)
MINUTE = timedelta(seconds=60)

# CHATSTREAM_DEFAULT_QUOTA key -> Limits attribute.
SETTING_KEYS: dict[str, str] = {name.upper(): name for name in QUOTA_MAXIMUMS} | {
    "MODELS": "models"
}

# Tokens a provider adds per message (role, separators) and to prime the reply: the estimate
# errs high so that a reservation usually covers the provider's count.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3

# A reply in flight will end and give back its unused hold, but nobody knows when: the hint
# sent as Retry-After while only in-flight replies stand in the way.
IN_FLIGHT_RETRY_AFTER = 5

# A provider's usage above this many times the reservation is impossible (byte-level tokenizers
# give at most one token per byte, about 4 per estimated token; the reply is capped by
# max_tokens): it is charged at our estimate instead, and logged.
PLAUSIBLE_FACTOR = 4


# ---------------------------------------------------------------------------------------------
# Limits


@dataclass(frozen=True)
class Limits:
    """One user's effective limits; None means unlimited (or, for ``models``, every model)."""

    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    requests_per_minute: int | None = None
    concurrent_streams: int | None = None
    max_prompt_tokens: int | None = None
    models: frozenset[str] | None = None

    @property
    def unlimited(self) -> bool:
        return all(getattr(self, name) is None for name in SETTING_KEYS.values())


def default_limits() -> Limits:
    """The site-wide default from ``CHATSTREAM_DEFAULT_QUOTA`` (unset keys: unlimited)."""
    from .checks import quota_setting_errors

    errors = quota_setting_errors()
    if errors:  # fail closed: a typo must never become "unlimited"
        raise ImproperlyConfigured(f"{errors[0].msg} {errors[0].hint}")
    raw: Mapping[str, Any] = conf.DEFAULT_QUOTA or {}
    values = {SETTING_KEYS[key]: value for key, value in raw.items()}
    if values.get("models") is not None:
        values["models"] = frozenset(values["models"])
    return Limits(**values)


_INHERIT = object()


def _explicit(override: UserQuota | GroupQuota, name: str) -> Any:
    """The override's own value for ``name``: a number, None (explicitly unlimited), or inherit."""
    if name == "models":
        if override.all_models:
            return None
        keys = override.model_keys()
        return _INHERIT if keys is None else frozenset(keys)
    if getattr(override, f"unlimited_{name}"):
        return None
    value = getattr(override, name)
    return _INHERIT if value is None else value


def resolve(default: Limits, user_quota: UserQuota | None,
            group_quotas: Iterable[GroupQuota]) -> Limits:
    """Each limit from the user's override, else their groups' most generous, else the default."""
    groups = list(group_quotas)
    values: dict[str, Any] = {}
    for name in SETTING_KEYS.values():
        own = _explicit(user_quota, name) if user_quota is not None else _INHERIT
        if own is not _INHERIT:
            values[name] = own
            continue
        given = [v for v in (_explicit(g, name) for g in groups) if v is not _INHERIT]
        if not given:
            values[name] = getattr(default, name)
        elif any(v is None for v in given):
            values[name] = None  # one group without a limit: the most generous
        elif name == "models":
            values[name] = frozenset().union(*given)
        else:
            values[name] = max(given)
    return Limits(**values)


def _load_limits(user_ids: list[Any], db: str) -> dict[Any, Limits]:
    default = default_limits()
    own = {q.user_id: q for q in UserQuota.objects.using(db).filter(user_id__in=user_ids)}
    groups: dict[Any, list[GroupQuota]] = {pk: [] for pk in user_ids}
    members: dict[Any, list[Any]] = {}
    for user_id, group_id in _memberships(user_ids, db):
        members.setdefault(group_id, []).append(user_id)
    if members:
        for quota in GroupQuota.objects.using(db).filter(group_id__in=members):
            for user_id in members[quota.group_id]:
                groups[user_id].append(quota)
    return {pk: resolve(default, own.get(pk), groups[pk]) for pk in user_ids}


def _memberships(user_ids: list[Any], db: str) -> list[tuple[Any, Any]]:
    """(user id, group id) pairs, read from the user model's ``groups`` table if it has one."""
    try:
        groups = get_user_model()._meta.get_field("groups")
    except FieldDoesNotExist:  # a custom user model without PermissionsMixin
        return []
    through = groups.remote_field.through  # type: ignore[union-attr]
    user_field = groups.m2m_field_name()  # type: ignore[union-attr]
    group_field = groups.m2m_reverse_field_name()  # type: ignore[union-attr]
    user_column = through._meta.get_field(user_field).attname
    group_column = through._meta.get_field(group_field).attname
    return list(through.objects.using(db).filter(**{f"{user_column}__in": user_ids})
                .values_list(user_column, group_column))


def limits_for(user: Any, *, using: str | None = None) -> Limits:
    """``user``'s effective limits (override > most generous group > site default)."""
    return _load_limits([user.pk], using or _db_for(user))[user.pk]


def limits_for_many(users: Iterable[Any], *, using: str | None = None) -> dict[Any, Limits]:
    """Limits of several users, keyed by primary key, in three queries (for the admin)."""
    users = list(users)
    if not users:
        return {}
    return _load_limits([u.pk for u in users], using or _db_for(users[0]))


def _db_for(instance: Any) -> str:
    return instance._state.db or router.db_for_write(QuotaCharge)


# ---------------------------------------------------------------------------------------------
# The ledger


@dataclass(frozen=True)
class Usage:
    """What counts against a user's limits at one instant."""

    tokens_day: int = 0
    tokens_month: int = 0
    requests_minute: int = 0
    live: int = 0
    held_day: int = 0  # the part of tokens_day still held by replies in flight
    held_month: int = 0


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


def _usage_aggregates(now: datetime) -> dict[str, Any]:
    month_start, month_end = month_bounds(now)
    tokens = Coalesce("charged", "reserved")
    in_day = Q(at__gt=now - DAY)
    in_month = Q(at__gte=month_start, at__lt=month_end)
    is_open = Q(settled_at__isnull=True)
    # A stream slot is an open hold whose generation is still live; a hold whose generation
    # ended without settling (see settle_orphans) must not lock the user out.
    in_flight = is_open & Exists(Generation.objects.filter(
        pk=OuterRef("generation_id"), status__in=Generation.LIVE
    ))
    return {
        "tokens_day": Coalesce(Sum(tokens, filter=in_day), 0),
        "tokens_month": Coalesce(Sum(tokens, filter=in_month), 0),
        "requests_minute": Count("pk", filter=Q(at__gt=now - MINUTE)),
        "live": Count("pk", filter=in_flight),
        "held_day": Coalesce(Sum("reserved", filter=in_day & is_open), 0),
        "held_month": Coalesce(Sum("reserved", filter=in_month & is_open), 0),
    }


def _usage(charges: QuerySet[QuotaCharge], now: datetime) -> Usage:
    # One statement, so one consistent snapshot of the ledger.
    return Usage(**charges.aggregate(**_usage_aggregates(now)))


def usage(user: Any, *, now: datetime | None = None) -> Usage:
    """``user``'s usage at ``now`` (default: now), reservations in flight included."""
    db = _db_for(user)
    return _usage(QuotaCharge.objects.using(db).filter(user_id=user.pk), now or timezone.now())


def usage_for_many(user_ids: list[Any], *, now: datetime | None = None,
                   using: str | None = None) -> dict[Any, Usage]:
    """Usage of several users in one grouped query (for the admin)."""
    db = using or router.db_for_read(QuotaCharge)
    rows = (QuotaCharge.objects.using(db).filter(user_id__in=user_ids).order_by()
            .values("user_id").annotate(**_usage_aggregates(now or timezone.now())))
    found = {row.pop("user_id"): Usage(**row) for row in rows}
    return {pk: found.get(pk, Usage()) for pk in user_ids}


def estimate_prompt(messages: Iterable[Mapping[str, str]]) -> int:
    """Estimated prompt tokens of ``messages`` as sent upstream (text plus per-message overhead)."""
    messages = list(messages)
    text = sum(estimate_tokens(m.get("content") or "") for m in messages)
    return text + MESSAGE_OVERHEAD * len(messages) + REPLY_PRIMING


# ---------------------------------------------------------------------------------------------
# Admission


@dataclass
class _Refusal:
    limit: str
    message: str
    retry_after: int | None  # None: waiting will not help

    @property
    def rank(self) -> float:
        return math.inf if self.retry_after is None else self.retry_after


def admit(generation: Generation, *, now: datetime | None = None) -> QuotaCharge:
    """Reserve ``generation``'s estimated cost, or raise QuotaExceeded (inside a transaction).

    Must run in the transaction that created the pending generation: the reservation commits
    with it, and a refusal rolls both back.
    """
    now = now or timezone.now()
    db = _db_for(generation)
    if not connections[db].in_atomic_block:
        raise TransactionManagementError(
            "quota.admit() must run inside the transaction that creates the generation "
            "(transaction.atomic()), or concurrent requests could all be admitted."
        )
    user_id = generation.user_id
    limits = _load_limits([user_id], db)[user_id]

    from . import lifecycle  # imports the streaming machinery: not needed at import time

    model = conf.get_model(generation.model)
    # Never below zero: a bad per-model MAX_TOKENS must not shrink the hold under the prompt.
    max_tokens = max(0, model.max_tokens if model is not None else conf.MAX_TOKENS)
    prompt = estimate_prompt(lifecycle.history(generation))
    cost = prompt + max_tokens
    refusal = _immediate_refusal(limits, generation.model, prompt)

    # The critical section: from the lock to the caller's commit, only ledger work. (A `now`
    # read before waiting for the lock is fine: the windows have no upper bound, so the
    # last admission in any window has counted every earlier one.)
    if refusal is None:
        _lock_account(user_id, db)
        if not limits.unlimited:
            charges = QuotaCharge.objects.using(db).filter(user_id=user_id)
            refusal = _period_refusal(limits, _usage(charges, now), charges, cost, max_tokens,
                                      now)
    if refusal is not None:
        logger.info("Quota refused a reply for user %s: %s (retry after %s s)",
                    user_id, refusal.limit, refusal.retry_after)
        raise QuotaExceeded(refusal.message, limit=refusal.limit,
                            retry_after=refusal.retry_after)

    # Only now: a refusal rolls back everything this transaction wrote.
    _settle_orphans(user_id, db, now)
    charge = QuotaCharge.objects.using(db).create(
        user_id=user_id, generation_id=generation.pk, model=generation.model, at=now,
        prompt_estimate=prompt, max_tokens=max_tokens, reserved=cost,
    )
    # Writing the locked row (not only reading it) makes a concurrent admission under
    # REPEATABLE READ fail with a serialization error rather than read a stale ledger.
    QuotaAccount.objects.using(db).filter(pk=user_id).update(
        admissions=F("admissions") + 1, last_admitted_at=now
    )
    return charge


def _lock_account(user_id: Any, db: str) -> None:
    accounts = QuotaAccount.objects.using(db)
    if accounts.select_for_update().filter(pk=user_id).exists():
        return
    # Two first admissions may race to create the row: one inserts, the other waits for it.
    accounts.bulk_create([QuotaAccount(user_id=user_id)], ignore_conflicts=True)
    accounts.select_for_update().filter(pk=user_id).exists()


def _immediate_refusal(limits: Limits, model: str, prompt: int) -> _Refusal | None:
    if limits.models is not None and model not in limits.models:
        return _Refusal("models", _(
            "The model “%(model)s” is not included in your plan. Please pick another one."
        ) % {"model": model}, None)
    if limits.max_prompt_tokens is not None and prompt > limits.max_prompt_tokens:
        return _Refusal("max_prompt_tokens", _(
            "This conversation is too long to send: about %(size)s tokens, over your limit "
            "of %(limit)s. Please start a new conversation."
        ) % {"size": _n(prompt), "limit": _n(limits.max_prompt_tokens)}, None)
    return None


def _period_refusal(limits: Limits, use: Usage, charges: QuerySet[QuotaCharge], cost: int,
                    max_tokens: int, now: datetime) -> _Refusal | None:
    """The binding refusal among the time-based limits: the one that lasts longest."""
    refusals: list[_Refusal] = []
    if limits.concurrent_streams is not None and use.live >= limits.concurrent_streams:
        refusals.append(_Refusal("concurrent_streams", ngettext(
            "You already have %(count)s reply being written, the most you may have at once. "
            "Wait for it to finish (or stop it), then try again.",
            "You already have %(count)s replies being written, the most you may have at "
            "once. Wait for one to finish (or stop it), then try again.",
            use.live,
        ) % {"count": use.live}, IN_FLIGHT_RETRY_AFTER))
    rpm = limits.requests_per_minute
    if rpm is not None and use.requests_minute >= rpm:
        times = list(charges.filter(at__gt=now - MINUTE).order_by("at")
                     .values_list("at", flat=True))
        wait = _seconds(times[len(times) - rpm] + MINUTE - now)
        refusals.append(_Refusal("requests_per_minute", ngettext(
            "You have sent %(limit)s message in the last minute, the most allowed. "
            "Try again in %(wait)s.",
            "You have sent %(limit)s messages in the last minute, the most allowed. "
            "Try again in %(wait)s.",
            rpm,
        ) % {"limit": _n(rpm), "wait": _duration(wait)}, wait))
    day = limits.tokens_per_day
    if day is not None and use.tokens_day + cost > day:
        refusals.append(_token_refusal(
            "tokens_per_day", day, use.tokens_day, use.held_day, cost, max_tokens,
            lambda: _day_wait(charges, use.tokens_day + cost - day, now), now,
        ))
    month = limits.tokens_per_month
    if month is not None and use.tokens_month + cost > month:
        refusals.append(_token_refusal(
            "tokens_per_month", month, use.tokens_month, use.held_month, cost, max_tokens,
            lambda: _seconds(month_bounds(now)[1] - now), now,
        ))
    return max(refusals, key=lambda r: r.rank) if refusals else None


def _token_refusal(limit: str, allowance: int, used: int, held: int, cost: int,
                   max_tokens: int, wait_for: Callable[[], int], now: datetime) -> _Refusal:
    per = _("per 24 hours") if limit == "tokens_per_day" else _("per month")
    if cost > allowance:
        return _Refusal(limit, _(
            "This message needs about %(cost)s tokens (the conversation plus a reply of up to "
            "%(reply)s), more than your limit of %(limit)s tokens %(per)s."
        ) % {"cost": _n(cost), "reply": _n(max_tokens), "limit": _n(allowance), "per": per},
            None)
    if used - held + cost <= allowance:
        return _Refusal(limit, _(
            "Your replies still being written hold the rest of your %(limit)s tokens %(per)s. "
            "Try again when they finish."
        ) % {"limit": _n(allowance), "per": per}, IN_FLIGHT_RETRY_AFTER)
    wait = wait_for()
    if limit == "tokens_per_day":
        return _Refusal(limit, _(
            "You have used your %(limit)s tokens for the last 24 hours. Enough frees up for "
            "this message in %(wait)s."
        ) % {"limit": _n(allowance), "wait": _duration(wait)}, wait)
    start, end = month_bounds(now)
    return _Refusal(limit, _(
        "You have used your %(limit)s tokens for %(month)s. The limit resets on %(reset)s "
        "(%(zone)s), in %(wait)s."
    ) % {"limit": _n(allowance), "month": date_format(_local(start), "F Y"),
         "reset": date_format(_local(end), "j F Y, H:i"), "zone": _zone_name(),
         "wait": _duration(wait)}, wait)


def _day_wait(charges: QuerySet[QuotaCharge], excess: int, now: datetime) -> int:
    """Seconds until charges totalling at least ``excess`` tokens leave the 24-hour window."""
    freed = 0
    rows = (charges.filter(at__gt=now - DAY).order_by("at")
            .values_list("at", "charged", "reserved"))
    for at, charged, reserved in rows:
        freed += reserved if charged is None else charged
        if freed >= excess:
            return _seconds(at + DAY - now)
    return _seconds(DAY)  # unreachable while excess <= the window's total


def _seconds(delta: timedelta) -> int:
    return max(1, math.ceil(delta.total_seconds()))


def _n(value: int) -> str:
    return number_format(value, force_grouping=True)


def _duration(seconds: int) -> str:
    if seconds < 60:
        return ngettext("%(n)d second", "%(n)d seconds", seconds) % {"n": seconds}
    minutes = math.ceil(seconds / 60)
    if minutes < 60:
        return ngettext("%(n)d minute", "%(n)d minutes", minutes) % {"n": minutes}
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        text = ngettext("%(n)d hour", "%(n)d hours", hours) % {"n": hours}
        if minutes:
            text += " " + ngettext("%(n)d minute", "%(n)d minutes", minutes) % {"n": minutes}
        return text
    days, hours = divmod(hours, 24)
    text = ngettext("%(n)d day", "%(n)d days", days) % {"n": days}
    if hours:
        text += " " + ngettext("%(n)d hour", "%(n)d hours", hours) % {"n": hours}
    return text


def _local(value: datetime) -> datetime:
    return value if timezone.is_naive(value) else timezone.localtime(
        value, timezone.get_default_timezone()
    )


def _zone_name() -> str:
    return str(timezone.get_default_timezone_name())


# ---------------------------------------------------------------------------------------------
# Settlement


def settle(generation: Generation, *, now: datetime | None = None) -> QuotaCharge | None:
    """Settle ``generation``'s reservation to its final usage (inside the caller's transaction).

    Provider usage when it arrived (and is plausible), the estimate when the stream ended
    without it, nothing when nothing was generated. Idempotent: the second call changes nothing
    and returns None, as does a call for a live generation or one that was never admitted.
    """
    if generation.status in Generation.LIVE:
        return None
    db = _db_for(generation)
    charge = QuotaCharge.objects.using(db).filter(
        generation_id=generation.pk, settled_at__isnull=True
    ).first()
    if charge is None:
        return None
    charged, source = _charge_for(generation, charge)
    return _close(charge, charged, source, db, now)


def settle_deleted(generation: Generation, *, now: datetime | None = None) -> None:
    """A generation is being deleted (its conversation was): close its hold fairly now."""
    if generation.status == Generation.Status.PENDING:
        generation.usage_source = Generation.UsageSource.NONE
    elif generation.status == Generation.Status.STREAMING:
        # Its stream stops at the next checkpoint; charge what it wrote so far.
        generation.usage_source = Generation.UsageSource.ESTIMATED
        generation.prompt_tokens = generation.completion_tokens = None
    db = _db_for(generation)
    charge = QuotaCharge.objects.using(db).filter(
        generation_id=generation.pk, settled_at__isnull=True
    ).first()
    if charge is not None:
        charged, source = _charge_for(generation, charge)
        _close(charge, charged, source, db, now)


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


def _charge_for(generation: Generation, charge: QuotaCharge) -> tuple[int, str]:
    Source = QuotaCharge.Source
    usage_source = generation.usage_source
    if usage_source == Generation.UsageSource.NONE:
        return 0, Source.RELEASED
    reported = _tokens(generation.prompt_tokens, generation.completion_tokens)
    if usage_source == Generation.UsageSource.PROVIDER:
        if reported is not None and reported <= PLAUSIBLE_FACTOR * charge.reserved:
            return reported, Source.PROVIDER
        logger.warning("Generation %s: implausible provider usage (%r prompt, %r completion) "
                       "charged at the estimate", generation.pk, generation.prompt_tokens,
                       generation.completion_tokens)
        return _estimate(generation, charge), Source.ESTIMATED
    if usage_source == Generation.UsageSource.ESTIMATED:
        if reported is not None:
            return reported, Source.ESTIMATED
        return _estimate(generation, charge), Source.ESTIMATED
    return charge.reserved, Source.RESERVATION  # unknown outcome: keep the whole hold


def _tokens(*values: Any) -> int | None:
    """The sum of non-negative integer counts, or None if any is missing or not one."""
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        return None
    return sum(values)


def _estimate(generation: Generation, charge: QuotaCharge) -> int:
    tools = sum(estimate_tokens(str(call.get("arguments", "")))
                for call in (generation.tool_calls or []) if isinstance(call, dict))
    return charge.prompt_estimate + estimate_tokens(generation.content or "") + tools


def settle_orphans(user: Any, *, now: datetime | None = None) -> None:
    """Settle ``user``'s holds whose generation ended, or vanished, without being settled."""
    _settle_orphans(user.pk, _db_for(user), now or timezone.now())


def _settle_orphans(user_id: Any, db: str, now: datetime) -> None:
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


# ---------------------------------------------------------------------------------------------
# What the user sees


@dataclass(frozen=True)
class Remaining:
    """A user's token allowance left, printable as one sentence for the chat page."""

    limits: Limits
    usage: Usage

    @property
    def tokens_day(self) -> int | None:
        day = self.limits.tokens_per_day
        return None if day is None else max(0, day - self.usage.tokens_day)

    @property
    def tokens_month(self) -> int | None:
        month = self.limits.tokens_per_month
        return None if month is None else max(0, month - self.usage.tokens_month)

    def __str__(self) -> str:
        parts = []
        if self.tokens_day is not None:
            parts.append(_("%(left)s of %(limit)s tokens left (rolling 24 hours)") % {
                "left": _n(self.tokens_day), "limit": _n(self.limits.tokens_per_day or 0)})
        if self.tokens_month is not None:
            parts.append(_("%(left)s of %(limit)s tokens left this month") % {
                "left": _n(self.tokens_month), "limit": _n(self.limits.tokens_per_month or 0)})
        return " · ".join(parts)


def remaining(user: Any, *, now: datetime | None = None) -> Remaining | None:
    """What ``user`` has left, for the chat page (None: no token limit applies to them)."""
    if not getattr(user, "is_authenticated", False):
        return None
    limits = limits_for(user)
    if limits.tokens_per_day is None and limits.tokens_per_month is None:
        return None
    return Remaining(limits, usage(user, now=now))


__all__ = [
    "Limits", "Remaining", "Usage", "admit", "default_limits", "estimate_prompt", "limits_for",
    "limits_for_many", "month_bounds", "remaining", "resolve", "settle", "usage",
    "usage_for_many",
]
