"""The shop's order API: what the support agent reads about an order.

Like the payments API it answers an account (the caller's API key): another account's
order is the same 404 ``resource_missing`` as an order that does not exist.
"""

from __future__ import annotations

from typing import Any

from sandbox.models import DB, Order
from sandbox.payments import refund_totals
from sandbox.responses import ApiError


def order_json(order: Order, refunded: int) -> dict[str, Any]:
    received = order.payment_intent.amount_received
    if refunded <= 0:
        refund_state = "none"
    elif refunded >= received:
        refund_state = "full"
    else:
        refund_state = "partial"
    return {
        "id": order.id,
        "object": "order",
        "customer": {"name": order.customer_name, "email": order.customer_email},
        "items": order.items,
        "amount": order.amount,
        "currency": order.currency,
        "payment_intent": order.payment_intent_id,
        "refund_state": refund_state,
        "amount_refunded": refunded,
    }


def order_retrieve(order_id: str, *, account: str) -> dict[str, Any]:
    order = (
        Order.objects.using(DB)
        .select_related("payment_intent")
        .filter(id=order_id, account=account)
        .first()
    )
    if order is None:
        raise ApiError(404, f"No such order: '{order_id}'", code="resource_missing", param="id")
    refunded = refund_totals([order.payment_intent_id]).get(order.payment_intent_id, 0)
    return order_json(order, refunded)
