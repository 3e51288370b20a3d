"""The shop's tools, which its model may call (``CHATSTREAM_MODELS[...]["TOOLS"]``): one reads
an order, the other refunds one and asks the user first (docs/tools.md quotes this module)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from django.db import transaction

from chatstream.tools import ToolContext, ToolError, tool

from .models import Order, Refund

OrderId = Annotated[int, msgspec.Meta(ge=1, description="The order number on the receipt")]


@tool
def order_status(order_id: OrderId, context: ToolContext) -> dict[str, Any]:
    """Say where one of the user's orders is."""
    order = _order_of(context.user, order_id)
    return {"order": order.pk, "status": order.status, "total": order.total_cents / 100,
            "refunded": order.refunds.exists()}


@tool(needs_approval=True, timeout=10)
def refund(order_id: OrderId, reason: Literal["damaged", "late"], context: ToolContext) -> str:
    """Refund one of the user's orders in full."""
    order = _order_of(context.user, order_id)
    with transaction.atomic():
        # The call's id is the key: should this call ever reach the shop twice, it refunds once.
        made, created = Refund.objects.get_or_create(
            tool_call_id=context.call.pk,
            defaults={"order": order, "reason": reason, "cents": order.total_cents})
    return (f"Refunded {made.cents / 100:.2f} for order {order.pk}." if created
            else f"Order {order.pk} was already refunded by this call.")


def _order_of(user: Any, order_id: int) -> Order:
    order = Order.objects.filter(pk=order_id, customer=user).first()
    if order is None:
        raise ToolError(f"The user has no order {order_id}; ask for the number on the receipt.")
    return order
