"""The shop's order API and the sandbox's own stats."""

from __future__ import annotations

import requests

from sandbox.accounts import account_for
from tests.harness import API_KEY


def test_it_shows_an_order_with_its_customer_and_payment(sandbox):
    answer = sandbox.get("/shop/orders/ord_1002")
    assert answer.status_code == 200
    order = answer.json()
    assert order["id"] == "ord_1002"
    assert order["customer"] == {"name": "Grace Hopper", "email": "grace@example.com"}
    assert [item["sku"] for item in order["items"]] == ["MUG-02", "TEA-05"]
    assert (order["amount"], order["currency"]) == (3490, "eur")
    assert order["payment_intent"] == "pi_3SbxOrd1002"
    assert (order["refund_state"], order["amount_refunded"]) == ("none", 0)


def test_an_order_shows_partial_then_full_refunds(sandbox, client):
    client.v1.refunds.create(params={"payment_intent": "pi_3SbxOrd1002", "amount": 990})
    partial = sandbox.get("/shop/orders/ord_1002").json()
    assert (partial["refund_state"], partial["amount_refunded"]) == ("partial", 990)

    client.v1.refunds.create(params={"payment_intent": "pi_3SbxOrd1002"})
    full = sandbox.get("/shop/orders/ord_1002").json()
    assert (full["refund_state"], full["amount_refunded"]) == ("full", 3490)


def test_the_shop_needs_an_api_key(sandbox):
    answer = requests.get(f"{sandbox.url}/shop/orders/ord_1001", timeout=10)
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "authentication_error"


def test_the_shop_takes_the_key_as_basic_auth_too(sandbox):
    answer = requests.get(f"{sandbox.url}/shop/orders/ord_1001", auth=(API_KEY, ""), timeout=10)
    assert answer.status_code == 200
    assert answer.json()["id"] == "ord_1001"


def test_an_unknown_order_is_a_json_404(sandbox):
    answer = sandbox.get("/shop/orders/ord_9999")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "resource_missing"


def test_stats_count_refunds_per_payment_intent_and_key(sandbox, client):
    client.v1.refunds.create(
        params={"payment_intent": "pi_3SbxOrd1001", "amount": 100},
        options={"idempotency_key": "s-1"},
    )
    client.v1.refunds.create(
        params={"payment_intent": "pi_3SbxOrd1001", "amount": 200},
        options={"idempotency_key": "s-2"},
    )
    client.v1.refunds.create(params={"payment_intent": "pi_3SbxOrd1002", "amount": 50})
    refunds = sandbox.stats()["refunds"]
    assert refunds["total"] == 3
    assert refunds["amount"] == 350
    assert refunds["by_payment_intent"] == {
        "pi_3SbxOrd1001": {"count": 2, "amount": 300},
        "pi_3SbxOrd1002": {"count": 1, "amount": 50},
    }
    # SDK-generated keys count too; the named ones are exact.
    assert refunds["by_idempotency_key"]["s-1"] == 1
    assert refunds["by_idempotency_key"]["s-2"] == 1


def test_stats_count_refunds_per_account(sandbox, client):
    sandbox.post("/_sandbox/seed", json={"api_key": "sk_test_two", "first_number": 2001})
    client.v1.refunds.create(params={"payment_intent": "pi_3SbxOrd1001", "amount": 100})
    client.v1.refunds.create(params={"payment_intent": "pi_3SbxOrd1002", "amount": 200})
    sandbox.client("sk_test_two").v1.refunds.create(
        params={"payment_intent": "pi_3SbxOrd2001", "amount": 50}
    )
    refunds = sandbox.stats()["refunds"]
    assert refunds["by_account"] == {
        account_for(API_KEY): {"count": 2, "amount": 300},
        account_for("sk_test_two"): {"count": 1, "amount": 50},
    }
    assert (refunds["total"], refunds["amount"]) == (3, 350)


def test_reset_wipes_everything_and_seeding_twice_changes_nothing(sandbox, client):
    client.v1.refunds.create(params={"payment_intent": "pi_3SbxOrd1001", "amount": 100})
    assert sandbox.post("/_sandbox/reset").json()["seeded"] == []
    assert sandbox.get("/shop/orders/ord_1001").status_code == 404
    assert sandbox.stats()["refunds"]["total"] == 0

    first = sandbox.post("/_sandbox/seed").json()["seeded"]
    second = sandbox.post("/_sandbox/seed").json()["seeded"]
    assert first == second == [f"ord_{n}" for n in range(1001, 1007)]
    assert sandbox.get("/shop/orders/ord_1006").json()["amount"] == 15900
