"""The tools of bench_tools.py's model: the two the simulator's ``agent`` scenario asks for, each
returning at once (one sync, run in chatstream's tool threads; one async, run on the loop), as
tests/test_tool_loop.py declares them. Imported by the servers through ``TOOLS``; the peer
(bare_proxy.py) has its own two functions, the same bodies without ``@tool``.
"""

from __future__ import annotations

from typing import Any

from chatstream.tools import tool


@tool
def get_weather(city: str, unit: str) -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "sky": "clear", "unit": unit}


@tool
async def get_time(timezone: str) -> str:
    """The time in a timezone."""
    return "12:00"

