"""Admission: reserve a reply's estimated cost (tokens, and money when its models have a price)
against the user's limits, or refuse it with a sentence and a Retry-After. The package
docstring holds the concurrency guarantee."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

from django.db import connections
from django.db.models import F, QuerySet
from django.db.transaction import TransactionManagementError
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.translation import gettext as _
from django.utils.translation import ngettext, pgettext

from ..conf import conf
from ..domain.history import history
from ..domain.usage import estimate_tokens, message_text
from ..exceptions import QuotaExceeded
from ..models import Generation, QuotaAccount, QuotaCharge
from .display import duration, grouped, local_time, money, zone_name
from .ledger import DAY, MINUTE, Usage, db_for, month_bounds, usage_of
from .limits import Limits, load_limits
from .pricing import hold_of, price_of
from .settlement import settle_orphans_of

logger = logging.getLogger("chatstream.quota")

# Tokens a provider adds per message (role, separators) and to prime the reply: the estimate
# errs high so that a reservation usually covers the provider's count.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3

# A reply in flight will end and give back its unused hold, but nobody knows when: the hint
# sent as Retry-After while only in-flight replies stand in the way.
IN_FLIGHT_RETRY_AFTER = 5


def estimate_prompt(messages: Iterable[Mapping[str, str]]) -> int:
    """Estimated prompt tokens of ``messages`` as sent upstream (text plus per-message overhead)."""
    messages = list(messages)
    text = sum(estimate_tokens(message_text(m)) for m in messages)
    return text + MESSAGE_OVERHEAD * len(messages) + REPLY_PRIMING


@dataclass
class _Refusal:
    limit: str
    message: str
    retry_after: int | None  # None: waiting will not help

    @property
    def rank(self) -> float:
        return math.inf if self.retry_after is None else self.retry_after


@dataclass(frozen=True)
class _Need:
    """What one reply holds until it ends: tokens, and money when its models have a price."""

    prompt: int
    max_tokens: int
    models: list[str]  # the model asked for, then its fallbacks

    @property
    def tokens(self) -> int:
        return self.prompt + self.max_tokens

    @cached_property
    def money(self) -> Decimal | None:
        return hold_of(self.models, prompt=self.prompt, max_tokens=self.max_tokens)


def admit(generation: Generation, *, now: datetime | None = None, expected: int = 0
          ) -> QuotaCharge:
    """Reserve ``generation``'s estimated cost, or raise QuotaExceeded (inside a transaction);
    ``expected``: tokens its prompt will hold beyond its messages now (results of tool calls
    not run yet).

    Must run in the transaction that created the pending generation: the reservation commits
    with it, and a refusal rolls both back.
    """
    now = now or timezone.now()
    db = db_for(generation)
    if not connections[db].in_atomic_block:
        raise TransactionManagementError(
            "quota.admit() must run inside the transaction that creates the generation "
            "(transaction.atomic()), or concurrent requests could all be admitted."
        )
    user_id = generation.user_id
    limits = load_limits([user_id], db)[user_id]
    _fallbacks_within(generation, limits, db)

    model = conf.get_model(generation.model)
    # Never below zero: a bad per-model MAX_TOKENS must not shrink the hold under the prompt.
    max_tokens = max(0, model.max_tokens if model is not None else conf.MAX_TOKENS)
    # A request hook may have asked for fewer (never more: hooks.py checks).
    asked = generation.upstream_params.get("max_tokens")
    if type(asked) is int and 0 < asked < max_tokens:
        max_tokens = asked
    fallbacks = generation.fallbacks if isinstance(generation.fallbacks, list) else []
    need = _Need(estimate_prompt(history(generation)) + expected, max_tokens,
                 [generation.model, *(key for key in fallbacks if isinstance(key, str))])
    refusal = _immediate_refusal(limits, generation.model, need)

    # The critical section: from the lock to the caller's commit, only ledger work. (A `now`
    # read before waiting for the lock is fine: the windows have no upper bound, so the
    # last admission in any window has counted every earlier one.)
    if refusal is None:
        _lock_account(user_id, db, now)
        if not limits.unlimited:
            charges = QuotaCharge.objects.using(db).filter(user_id=user_id)
            refusal = _period_refusal(limits, usage_of(charges, now), charges, need, now)
    if refusal is not None:
        logger.info("Quota refused a reply for user %s: %s (retry after %s s)",
                    user_id, refusal.limit, refusal.retry_after)
        raise QuotaExceeded(refusal.message, limit=refusal.limit,
                            retry_after=refusal.retry_after)

    # Only now: a refusal rolls back everything this transaction wrote.
    settle_orphans_of(user_id, db, now)
    return QuotaCharge.objects.using(db).create(
        user_id=user_id, generation_id=generation.pk, model=generation.model, at=now,
        prompt_estimate=need.prompt, max_tokens=max_tokens, reserved=need.tokens,
        reserved_cost=need.money,
    )


def _fallbacks_within(generation: Generation, limits: Limits, db: str) -> None:
    """Leave out the fallbacks the user's plan does not let them use: models it does not
    include and, under a money limit, models without a price. The reply never uses them."""
    if (limits.models is None and not limits.spends) or not generation.fallbacks:
        return
    kept = [key for key in generation.fallbacks
            if (limits.models is None or key in limits.models)
            and (not limits.spends or price_of(key) is not None)]
    if kept != generation.fallbacks:
        generation.fallbacks = kept
        Generation.objects.using(db).filter(pk=generation.pk).update(fallbacks=kept)


def _lock_account(user_id: Any, db: str, now: datetime) -> None:
    """Lock the user's account row by counting the admission in it: one statement, whose row
    lock is held to the caller's commit (a refusal rolls the count back with the rest).
    Writing the row, not only locking it, makes a concurrent admission under REPEATABLE READ
    fail with a serialization error rather than read a stale ledger."""
    account = QuotaAccount.objects.using(db).filter(pk=user_id)
    counted = {"admissions": F("admissions") + 1, "last_admitted_at": now}
    if account.update(**counted):
        return
    # Two first admissions may race to create the row: one inserts, the other waits for it.
    QuotaAccount.objects.using(db).bulk_create([QuotaAccount(user_id=user_id)],
                                               ignore_conflicts=True)
    account.update(**counted)


def _immediate_refusal(limits: Limits, model: str, need: _Need) -> _Refusal | None:
    if limits.models is not None and model not in limits.models:
        return _Refusal("models", _(
            "The model “%(model)s” is not included in your plan. Please pick another one."
        ) % {"model": model}, None)
    if limits.max_prompt_tokens is not None and need.prompt > limits.max_prompt_tokens:
        return _Refusal("max_prompt_tokens", _(
            "This conversation is too long to send: about %(size)s tokens, over your limit "
            "of %(limit)s. Please start a new conversation."
        ) % {"size": grouped(need.prompt), "limit": grouped(limits.max_prompt_tokens)}, None)
    if limits.spends and need.money is None:  # the checks say so (chatstream.E036)
        logger.warning("Quota: a money limit applies, and one of %s has no PRICE", need.models)
        return _Refusal("cost_per_day" if limits.cost_per_day is not None else "cost_per_month",
                        _("The model “%(model)s” has no price, and your plan limits what your "
                          "replies may cost. Please pick another one.") % {"model": model},
                        None)
    return None


def _period_refusal(limits: Limits, use: Usage, charges: QuerySet[QuotaCharge], need: _Need,
                    now: datetime) -> _Refusal | None:
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
        ) % {"limit": grouped(rpm), "wait": duration(wait)}, wait))
    refusals += [_allowance_refusal(allowance, charges, need, now)
                 for allowance in _allowances(limits, use, need)
                 if allowance.used + allowance.need > allowance.allowance]
    return max(refusals, key=lambda r: r.rank) if refusals else None


@dataclass(frozen=True)
class _Allowance:
    """One limit on an amount per period (tokens or money, per 24 hours or per month)."""

    limit: str
    allowance: Any  # int tokens, or a Decimal amount: as are the others
    used: Any
    held: Any  # the part of ``used`` held by replies in flight
    need: Any

    @property
    def money(self) -> bool:
        return self.limit.startswith("cost_")

    @property
    def daily(self) -> bool:
        return self.limit.endswith("_per_day")

    def show(self, value: Any) -> str:
        return money(value) if self.money else grouped(value)


def _allowances(limits: Limits, use: Usage, need: _Need) -> list[_Allowance]:
    found = [
        _Allowance("tokens_per_day", limits.tokens_per_day, use.tokens_day, use.held_day,
                   need.tokens),
        _Allowance("tokens_per_month", limits.tokens_per_month, use.tokens_month,
                   use.held_month, need.tokens),
        _Allowance("cost_per_day", limits.cost_per_day, use.cost_day, use.held_cost_day,
                   need.money),
        _Allowance("cost_per_month", limits.cost_per_month, use.cost_month,
                   use.held_cost_month, need.money),
    ]
    return [a for a in found if a.allowance is not None and a.need is not None]


def _allowance_refusal(a: _Allowance, charges: QuerySet[QuotaCharge], need: _Need,
                       now: datetime) -> _Refusal:
    words = _money_words() if a.money else _token_words()
    start, end = month_bounds(now)
    values = {"cost": a.show(a.need), "reply": grouped(need.max_tokens),
              "limit": a.show(a.allowance), "per": _("per 24 hours") if a.daily else _("per month"),
              # The date formats are the language's (Django's format characters).
              "month": date_format(local_time(start), pgettext("date format: month", "F Y")),
              "reset": date_format(local_time(end), pgettext("date format: reset time",
                                                             "j F Y, H:i")),
              "zone": zone_name()}
    if a.need > a.allowance:
        return _Refusal(a.limit, words["too_much"] % values, None)
    if a.used - a.held + a.need <= a.allowance:
        return _Refusal(a.limit, words["held"] % values, IN_FLIGHT_RETRY_AFTER)
    wait = (_day_wait(charges, a.used + a.need - a.allowance, now, a.money) if a.daily
            else _seconds(end - now))
    sentence = words["used_day" if a.daily else "used_month"]
    return _Refusal(a.limit, sentence % {**values, "wait": duration(wait)}, wait)


def _token_words() -> dict[str, str]:
    return {
        "too_much": _("This message needs about %(cost)s tokens (the conversation plus a reply "
                      "of up to %(reply)s), more than your limit of %(limit)s tokens %(per)s."),
        "held": _("Your replies still being written hold the rest of your %(limit)s tokens "
                  "%(per)s. Try again when they finish."),
        "used_day": _("You have used your %(limit)s tokens for the last 24 hours. Enough frees "
                      "up for this message in %(wait)s."),
        "used_month": _("You have used your %(limit)s tokens for %(month)s. The limit resets "
                        "on %(reset)s (%(zone)s), in %(wait)s."),
    }


def _money_words() -> dict[str, str]:
    return {
        "too_much": _("This message may cost up to %(cost)s (the conversation plus a reply of "
                      "up to %(reply)s tokens), more than your limit of %(limit)s %(per)s."),
        "held": _("Your replies still being written hold the rest of your %(limit)s %(per)s. "
                  "Try again when they finish."),
        "used_day": _("You have spent your %(limit)s for the last 24 hours. Enough frees up "
                      "for this message in %(wait)s."),
        "used_month": _("You have spent your %(limit)s for %(month)s. The limit resets on "
                        "%(reset)s (%(zone)s), in %(wait)s."),
    }


def _day_wait(charges: QuerySet[QuotaCharge], excess: Any, now: datetime, in_money: bool
              ) -> int:
    """Seconds until charges totalling at least ``excess`` (tokens, or money) leave the
    24-hour window."""
    freed: Any = 0
    charged, reserved = ("charged_cost", "reserved_cost") if in_money else ("charged", "reserved")
    rows = (charges.filter(at__gt=now - DAY).order_by("at")
            .values_list("at", "settled_at", charged, reserved))
    for at, settled_at, spent, held in rows:
        freed += (held if settled_at is None else spent) or 0
        if freed >= excess:
            return _seconds(at + DAY - now)
    return _seconds(DAY)  # unreachable while excess <= the window's total


def _seconds(delta: timedelta) -> int:
    return max(1, math.ceil(delta.total_seconds()))
