"""A second tool named ``refund``, for the system check that refuses one name twice."""

from __future__ import annotations

from chatstream.tools import tool


@tool
def refund(order_id: int) -> str:
    """Refund an order (another one)."""
    return str(order_id)
