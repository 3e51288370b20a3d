"""A tool named as the simulator's agent calls it, which runs until the test lets it end."""

import threading

from chatstream.tools import tool

gate = threading.Event()


@tool
def get_time(timezone: str) -> str:
    """The time in a timezone."""
    gate.wait(20)
    return "12:00"
