"""A tool named as the simulator's agent calls it, that always fails with a sentence."""

from chatstream.tools import ToolError, tool


@tool
def get_time(timezone: str) -> str:
    """The time in a timezone."""
    raise ToolError("The clock is broken.")
