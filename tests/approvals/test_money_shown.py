"""Every amount an approver reads is money in its currency, never a bare number of minor units."""

from __future__ import annotations

import re

import pytest

from agentruns.money import format_amount
from approvals.selectors import _rows
from support.tools import _refund_preview

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _cells(page: str, key: str) -> str:
    match = re.search(rf"<th[^>]*>{key}</th>\s*<td[^>]*><code>(.*?)</code></td>", page, re.S)
    assert match, f"no row {key!r} on the page"
    return match.group(1).strip()


def test_the_card_shows_the_payment_and_the_arguments_as_money(client, approver, world):
    run = world.start_refund(requested_by="user:requester")
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = world.waiting_approval(run)
    client.force_login(approver)
    page = client.get(f"/approvals/{approval.pk}/").content.decode()
    currency = world.order["currency"]
    assert _cells(page, "amount_received") == format_amount(world.order["amount"], currency)
    assert _cells(page, "amount_refunded") == format_amount(0, currency)
    assert _cells(page, "amount") == format_amount(approval.args["amount"], currency)


def test_an_amount_beside_a_currency_uses_that_currencys_decimals():
    rows = dict(_rows({"amount": 8000, "currency": "jpy", "amount_refunded": 0, "order": "o-1"}))
    assert rows == {
        "amount": "8,000 JPY",
        "currency": "jpy",
        "amount_refunded": "0 JPY",
        "order": "o-1",
    }
    # Without a currency there is nothing to say what the units are: shown as they are.
    assert dict(_rows({"amount": 8000})) == {"amount": "8000"}


def test_the_refund_preview_uses_the_currencys_own_decimals():
    args = {"order_id": "o-1", "payment_intent": "pi_1", "reason": "requested_by_customer"}
    assert _refund_preview({**args, "amount": 8000, "currency": "jpy"}).startswith(
        "Refund 8,000 JPY of order o-1"
    )
    assert _refund_preview({**args, "amount": 8000, "currency": "eur"}).startswith(
        "Refund 80.00 EUR of order o-1"
    )
