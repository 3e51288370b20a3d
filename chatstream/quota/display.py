"""What users read about their quota: the remaining-allowance sentence, and the numbers,
durations and dates that refusals are worded with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.utils import timezone
from django.utils.formats import number_format
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from ..conf import conf
from .ledger import Usage, usage
from .limits import Limits, limits_for


@dataclass(frozen=True)
class Remaining:
    """A user's allowance left (tokens, money), printable as one sentence for the chat page."""

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

    @property
    def cost_day(self) -> Decimal | None:
        day = self.limits.cost_per_day
        return None if day is None else max(Decimal(0), day - self.usage.cost_day)

    @property
    def cost_month(self) -> Decimal | None:
        month = self.limits.cost_per_month
        return None if month is None else max(Decimal(0), month - self.usage.cost_month)

    @property
    def tokens(self) -> int | None:
        """Tokens left under the tightest token limit (None: no token limit)."""
        left = [n for n in (self.tokens_day, self.tokens_month) if n is not None]
        return min(left) if left else None

    @property
    def requests_minute(self) -> int | None:
        """Requests left in the rolling minute (None: no request limit)."""
        per_minute = self.limits.requests_per_minute
        return None if per_minute is None else max(0, per_minute - self.usage.requests_minute)

    def __str__(self) -> str:
        parts = []
        if self.tokens_day is not None:
            parts.append(_("%(left)s of %(limit)s tokens left (rolling 24 hours)") % {
                "left": grouped(self.tokens_day),
                "limit": grouped(self.limits.tokens_per_day or 0)})
        if self.tokens_month is not None:
            parts.append(_("%(left)s of %(limit)s tokens left this month") % {
                "left": grouped(self.tokens_month),
                "limit": grouped(self.limits.tokens_per_month or 0)})
        if self.cost_day is not None:
            parts.append(_("%(left)s of %(limit)s left to spend (rolling 24 hours)") % {
                "left": money(self.cost_day), "limit": money(self.limits.cost_per_day or 0)})
        if self.cost_month is not None:
            parts.append(_("%(left)s of %(limit)s left to spend this month") % {
                "left": money(self.cost_month), "limit": money(self.limits.cost_per_month or 0)})
        return " · ".join(parts)


def remaining(user: Any, *, now: datetime | None = None) -> Remaining | None:
    """What ``user`` has left, for the chat page (None: no token or money limit applies)."""
    if not getattr(user, "is_authenticated", False):
        return None
    limits = limits_for(user)
    if limits.tokens_per_day is None and limits.tokens_per_month is None and not limits.spends:
        return None
    return Remaining(limits, usage(user, now=now))


def grouped(value: int) -> str:
    """``value`` with the locale's thousands separators (1,033)."""
    return number_format(value, force_grouping=True)


def money(value: Decimal | int, currency: str | None = None) -> str:
    """An amount in ``currency`` (default CHATSTREAM_CURRENCY), to the cent ("1,234.50 USD");
    under 1, to the hundredth of a cent, so that a small cost does not read as nothing
    ("0.0042 USD")."""
    value = Decimal(value)
    places = 2 if value == 0 or abs(value) >= 1 else 4
    shown = value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return _("%(amount)s %(currency)s") % {
        "amount": number_format(shown, decimal_pos=places, force_grouping=True),
        "currency": currency or conf.CURRENCY}


def duration(seconds: int) -> str:
    """A wait in words, rounded up to the unit that matters ("2 hours 5 minutes")."""
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


def local_time(value: datetime) -> datetime:
    """``value`` in the site's TIME_ZONE (naive values already are)."""
    return value if timezone.is_naive(value) else timezone.localtime(
        value, timezone.get_default_timezone()
    )


def zone_name() -> str:
    return str(timezone.get_default_timezone_name())
