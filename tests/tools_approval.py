"""A tool named as the simulator's agent calls it, which needs the user's approval."""

from chatstream.tools import tool
from tests.test_tool_loop import ran


@tool(needs_approval=True)
def get_time(timezone: str) -> str:
    """The time in a timezone."""
    ran.append(("get_time (approved)", timezone))
    return "12:00"
