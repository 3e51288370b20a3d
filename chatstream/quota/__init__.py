"""Per-user quotas: admission before every upstream call, settlement after it.

**Guarantee.** For one user, admissions are serialised across threads, worker processes and
hosts that share the database: each :func:`admit` checks the limits against the ledger *and*
writes its reservation before any other admission of that user can read the ledger. So the sum
of what is admitted never exceeds a limit, however many requests race (no check-then-record gap,
no per-process counter); the only overshoot possible is a provider counting more prompt tokens
than estimated, which is charged as reported (never hidden) and blocks further admissions.

**How.** :func:`admit` runs inside the transaction that creates the pending ``Generation``.
It locks the user's :class:`~chatstream.models.QuotaAccount` row by updating it (its count
of admissions; the row created race-free with ``INSERT ... ON CONFLICT DO NOTHING`` the first
time), then reads the ledger in one statement, decides, and inserts the
:class:`~chatstream.models.QuotaCharge` (the hold: prompt estimate + ``max_tokens``); the
caller's commit releases the lock, and a refusal rolls the count back. On PostgreSQL (READ
COMMITTED, Django's default) the row lock makes the next admission wait, and its statements
then see the committed reservation; under REPEATABLE READ or SERIALIZABLE the account-row
update turns a race into a serialization error, never an over-admission. On SQLite, a row lock
does not exist, but every write transaction already holds the database's single write lock
(``"transaction_mode": "IMMEDIATE"``, checked by ``chatstream.W020``; the view's inserts take it
before admission reads, even without it).

:func:`settle` turns the hold into the charge with one conditional ``UPDATE ... WHERE
settled_at IS NULL``: idempotent, never negative, and needs no account lock (so it cannot
deadlock with an admission). Every exit path of a generation calls it (finish, Stop of a
pending one, the sweeper for dead workers and abandoned ones); an admission also settles any
hold whose generation has ended or vanished without it, so no slot is held forever.

Periods: a charge is dated at admission. "Tokens per day" is any rolling 24 hours (a charge
counts from its instant for exactly 24 h); "tokens per month" is the calendar month in the
site's ``TIME_ZONE`` (``[first day 00:00, next first day 00:00)``); "requests per minute" is
any rolling 60 s. docs/quotas.md is the reference.

Money: a model with a ``PRICE`` gives each reply a cost (``Generation.cost``, computed once at
its final save) and each hold a price (at the dearest model the reply may fall back to); the
money limits (``COST_PER_DAY``, ``COST_PER_MONTH``) are admitted and settled in the same
statements as the tokens, so the guarantee above holds for them too.

The modules: :mod:`.limits` (what applies to a user), :mod:`.ledger` (what they used, per
period), :mod:`.pricing` (prices and costs), :mod:`.admission`, :mod:`.settlement`, and
:mod:`.display` (the sentences users read).
Everything public is imported here: call it as ``quota.admit(...)``, not from the modules.
"""

from __future__ import annotations

from .admission import (
    IN_FLIGHT_RETRY_AFTER,
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    admit,
    estimate_prompt,
)
from .display import Remaining, grouped, money, remaining
from .headroom import aheadroom, headroom
from .ledger import DAY, MINUTE, Usage, month_bounds, usage, usage_for_many
from .limits import SETTING_KEYS, Limits, default_limits, limits_for, limits_for_many, resolve
from .pricing import Price, cost_fields, cost_of, hold_of, price_of
from .settlement import (
    PLAUSIBLE_FACTOR,
    RELEASED,
    Settlement,
    settle,
    settle_deleted,
    settle_orphans,
    settlement_for,
)

__all__ = [
    "DAY",
    "IN_FLIGHT_RETRY_AFTER",
    "MESSAGE_OVERHEAD",
    "MINUTE",
    "PLAUSIBLE_FACTOR",
    "RELEASED",
    "REPLY_PRIMING",
    "SETTING_KEYS",
    "Limits",
    "Price",
    "Remaining",
    "Settlement",
    "Usage",
    "admit",
    "aheadroom",
    "cost_fields",
    "cost_of",
    "default_limits",
    "estimate_prompt",
    "grouped",
    "headroom",
    "hold_of",
    "limits_for",
    "limits_for_many",
    "money",
    "month_bounds",
    "price_of",
    "remaining",
    "resolve",
    "settle",
    "settle_deleted",
    "settle_orphans",
    "settlement_for",
    "usage",
    "usage_for_many",
]
