"""The demo's tools, named as the simulated upstream's ``agent`` scenario calls them: it asks
for both in one reply and, sent their results, answers quoting them. The time needs the
user's approval, so the demo shows both kinds of call (docs/tools.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from chatstream.tools import ToolError, tool


@tool
def get_weather(city: str, unit: str = "celsius") -> dict[str, Any]:
    """The weather in a city (the demo's is always fair)."""
    return {"city": city, "sky": "fair", "temperature": 21 if unit == "celsius" else 70,
            "unit": unit}


@tool(needs_approval=True)
def get_time(timezone: str) -> str:
    """The time now in a timezone (an IANA name, such as Europe/Paris)."""
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"There is no timezone {timezone!r}; use an IANA name.") from None
    return datetime.now(zone).strftime("%H:%M")
