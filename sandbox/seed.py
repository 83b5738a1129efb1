"""Demo orders, each paid by one payment intent (EUR, minor units)."""

from __future__ import annotations

from django.db import transaction

from sandbox import clock
from sandbox.models import DB, Fault, IdempotencyRecord, MailMessage, Order, PaymentIntent, Refund

# (order number, customer name, email, items as (sku, name, quantity, unit amount))
ORDERS: list[tuple[int, str, str, list[tuple[str, str, int, int]]]] = [
    (1001, "Ada Lovelace", "ada@example.com", [("KB-01", "Mechanical keyboard", 1, 8900)]),
    (
        1002,
        "Grace Hopper",
        "grace@example.com",
        [("MUG-02", "Enamel mug", 2, 1250), ("TEA-05", "Loose-leaf tea", 1, 990)],
    ),
    (1003, "Alan Turing", "alan@example.com", [("CHR-07", "Desk chair", 1, 24900)]),
    (1004, "Katherine Johnson", "katherine@example.com", [("LMP-03", "Desk lamp", 1, 4500)]),
    (
        1005,
        "Edsger Dijkstra",
        "edsger@example.com",
        [("PEN-11", "Fountain pen", 1, 6400), ("INK-02", "Ink bottle", 3, 850)],
    ),
    (1006, "Barbara Liskov", "barbara@example.com", [("HDP-09", "Headphones", 1, 15900)]),
]


def order_id(number: int) -> str:
    return f"ord_{number}"


def payment_intent_id(number: int) -> str:
    return f"pi_3SbxOrd{number}"


def seed() -> list[tuple[str, bool]]:
    """Create the demo orders that are missing; returns (order id, created) per order."""
    results: list[tuple[str, bool]] = []
    with transaction.atomic(using=DB):
        for number, name, email, items in ORDERS:
            amount = sum(quantity * unit for _, _, quantity, unit in items)
            intent, _ = PaymentIntent.objects.using(DB).get_or_create(
                id=payment_intent_id(number),
                defaults={
                    "amount": amount,
                    "amount_received": amount,
                    "currency": "eur",
                    "customer": f"cus_SbxCust{number}",
                    "charge_id": f"ch_3SbxOrd{number}",
                    "metadata": {"order_id": order_id(number)},
                    "created": clock.now(),
                },
            )
            _, created = Order.objects.using(DB).get_or_create(
                id=order_id(number),
                defaults={
                    "customer_name": name,
                    "customer_email": email,
                    "items": [
                        {"sku": sku, "name": title, "quantity": quantity, "unit_amount": unit}
                        for sku, title, quantity, unit in items
                    ],
                    "amount": amount,
                    "currency": "eur",
                    "payment_intent": intent,
                },
            )
            results.append((order_id(number), created))
    return results


def wipe() -> None:
    """Delete every sandbox record (tests and demos start from nothing)."""
    with transaction.atomic(using=DB):
        for model in (Refund, Order, PaymentIntent, IdempotencyRecord, MailMessage, Fault):
            model.objects.using(DB).all().delete()
    clock.reset()
