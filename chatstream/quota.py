"""Per-user quotas: admission before the upstream call, settlement after it.

(The limits themselves arrive with issue 6; until then every request is admitted and
settlement records nothing.)
"""

from __future__ import annotations

from typing import Any


def settle(generation: Any) -> None:
    """Settle ``generation``'s reservation to its final usage (inside the caller's transaction)."""


def admit(generation: Any) -> None:
    """Reserve ``generation``'s estimated cost, or raise QuotaExceeded (inside a transaction)."""


def remaining(user: Any) -> None:
    """What ``user`` has left, for the chat page (None: no limits configured)."""
    return None
