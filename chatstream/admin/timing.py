"""How the admin writes a record's moments and spans: timings need more than minutes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone


def milliseconds(span: Any) -> int | None:
    return None if span is None else round(span.total_seconds() * 1000)


def precise(moment: datetime | None) -> str:
    """A timestamp to the millisecond, in the current time zone: timings need more than minutes."""
    if moment is None:
        return "-"
    return timezone.localtime(moment).isoformat(sep=" ", timespec="milliseconds")
