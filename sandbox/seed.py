"""Demo orders, each paid by one payment intent (EUR, minor units), in one account.

``seed(api_key, first_number)`` gives the account of ``api_key`` the six demo orders,
numbered from ``first_number``: ord_1001…ord_1006 in the demo key's account by default.
Ids are global primary keys, as Stripe's are, so a second account is seeded from another
number (2001: ord_2001…, pi_3SbxOrd2001…); an id that another account holds is refused,
never shared.
"""

from __future__ import annotations

from django.db import transaction

from sandbox import clock
from sandbox.accounts import account_for
from sandbox.models import (
    DB,
    Fault,
    IdempotencyRecord,
    MailMessage,
    Order,
    PaymentIntent,
    ProviderRequest,
    Refund,
    WebhookDelivery,
)
from sandbox.responses import ApiError

DEMO_API_KEY = "sk_test_sandbox"
DEMO_FIRST_NUMBER = 1001
# Keeps every id within its 64 characters.
MAX_FIRST_NUMBER = 10**9

# (customer name, email, items as (sku, name, quantity, unit amount)), numbered in order.
ORDERS: list[tuple[str, str, list[tuple[str, str, int, int]]]] = [
    ("Ada Lovelace", "ada@example.com", [("KB-01", "Mechanical keyboard", 1, 8900)]),
    (
        "Grace Hopper",
        "grace@example.com",
        [("MUG-02", "Enamel mug", 2, 1250), ("TEA-05", "Loose-leaf tea", 1, 990)],
    ),
    ("Alan Turing", "alan@example.com", [("CHR-07", "Desk chair", 1, 24900)]),
    ("Katherine Johnson", "katherine@example.com", [("LMP-03", "Desk lamp", 1, 4500)]),
    (
        "Edsger Dijkstra",
        "edsger@example.com",
        [("PEN-11", "Fountain pen", 1, 6400), ("INK-02", "Ink bottle", 3, 850)],
    ),
    ("Barbara Liskov", "barbara@example.com", [("HDP-09", "Headphones", 1, 15900)]),
]


def order_id(number: int) -> str:
    return f"ord_{number}"


def payment_intent_id(number: int) -> str:
    return f"pi_3SbxOrd{number}"


def seed(
    api_key: str = DEMO_API_KEY, first_number: int = DEMO_FIRST_NUMBER
) -> list[tuple[str, bool]]:
    """Create the account's demo orders that are missing; returns (order id, created) each.

    Raises ``ApiError`` (400) for an empty key, a number out of range, or an id that
    belongs to another account; then nothing is created.
    """
    if not api_key:
        raise ApiError(400, "api_key must be a non-empty string", param="api_key")
    if not 1 <= first_number <= MAX_FIRST_NUMBER:
        raise ApiError(
            400,
            f"first_number must be an integer from 1 to {MAX_FIRST_NUMBER}",
            param="first_number",
        )
    account = account_for(api_key)
    results: list[tuple[str, bool]] = []
    with transaction.atomic(using=DB):
        for number, (name, email, items) in enumerate(ORDERS, start=first_number):
            amount = sum(quantity * unit for _, _, quantity, unit in items)
            intent, _ = PaymentIntent.objects.using(DB).get_or_create(
                id=payment_intent_id(number),
                defaults={
                    "account": account,
                    "amount": amount,
                    "amount_received": amount,
                    "currency": "eur",
                    "customer": f"cus_SbxCust{number}",
                    "charge_id": f"ch_3SbxOrd{number}",
                    "metadata": {"order_id": order_id(number)},
                    "created": clock.now(),
                },
            )
            _refuse_another_accounts("payment intent", intent.id, intent.account, account)
            order, created = Order.objects.using(DB).get_or_create(
                id=order_id(number),
                defaults={
                    "account": account,
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
            _refuse_another_accounts("order", order.id, order.account, account)
            results.append((order.id, created))
    return results


def _refuse_another_accounts(kind: str, object_id: str, owner: str, account: str) -> None:
    # Raised inside seed()'s transaction: whatever it created so far is rolled back.
    if owner != account:
        raise ApiError(
            400,
            f"The {kind} {object_id} belongs to another account: seed this one from "
            "another first_number.",
            param="first_number",
        )


def wipe() -> None:
    """Delete every sandbox record (tests and demos start from nothing)."""
    with transaction.atomic(using=DB):
        for model in (
            Refund,
            Order,
            PaymentIntent,
            IdempotencyRecord,
            MailMessage,
            Fault,
            ProviderRequest,
            WebhookDelivery,
        ):
            model.objects.using(DB).all().delete()
    clock.reset()
