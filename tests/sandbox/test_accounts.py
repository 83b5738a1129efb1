"""Each API key is an account: another key sees and touches none of the demo account's
payment intents, refunds and orders, and learns nothing about them (the same 404 as an
id that does not exist)."""

from __future__ import annotations

import pytest
import requests
import stripe

OTHER_KEY = "sk_test_other"
PI = "pi_3SbxOrd1003"  # 24900 EUR, the demo account's


@pytest.fixture
def demo_refund(client) -> stripe.Refund:
    return client.v1.refunds.create(params={"payment_intent": PI, "amount": 500})


def missing(answer: requests.Response, object_id: str) -> tuple[int, str]:
    """The answer with the id it names taken out, to compare it with another id's."""
    return answer.status_code, answer.text.replace(object_id, "<id>")


def test_another_key_gets_a_demo_payment_intent_as_if_it_did_not_exist(sandbox):
    theirs = sandbox.get(f"/v1/payment_intents/{PI}", api_key=OTHER_KEY)
    unknown = sandbox.get("/v1/payment_intents/pi_3SbxOrd9999", api_key=OTHER_KEY)
    assert theirs.json()["error"]["code"] == "resource_missing"
    assert missing(theirs, PI) == missing(unknown, "pi_3SbxOrd9999")
    assert missing(theirs, PI)[0] == 404
    assert sandbox.get(f"/v1/payment_intents/{PI}").status_code == 200


def test_another_key_gets_a_demo_refund_as_if_it_did_not_exist(sandbox, demo_refund):
    theirs = sandbox.get(f"/v1/refunds/{demo_refund.id}", api_key=OTHER_KEY)
    unknown = sandbox.get("/v1/refunds/re_nope", api_key=OTHER_KEY)
    assert theirs.status_code == 404
    assert theirs.json()["error"]["code"] == "resource_missing"
    assert missing(theirs, demo_refund.id) == missing(unknown, "re_nope")


def test_another_keys_refund_lists_are_empty(sandbox, demo_refund):
    other = sandbox.client(OTHER_KEY)
    assert other.v1.refunds.list().data == []
    assert other.v1.refunds.list(params={"payment_intent": PI}).data == []
    assert [refund.id for refund in sandbox.client().v1.refunds.list().data] == [demo_refund.id]


@pytest.mark.parametrize("cursor", ["starting_after", "ending_before"])
def test_another_key_cannot_page_from_a_demo_refund(sandbox, demo_refund, cursor):
    theirs = sandbox.get(f"/v1/refunds?{cursor}={demo_refund.id}", api_key=OTHER_KEY)
    unknown = sandbox.get(f"/v1/refunds?{cursor}=re_nope", api_key=OTHER_KEY)
    assert theirs.status_code == 404
    assert theirs.json()["error"]["param"] == cursor
    assert missing(theirs, demo_refund.id) == missing(unknown, "re_nope")


def test_another_key_cannot_refund_a_demo_payment_intent(sandbox, demo_refund):
    before = sandbox.stats()["refunds"]
    theirs = sandbox.post(
        "/v1/refunds",
        data={"payment_intent": PI, "amount": "100"},
        headers={"Authorization": f"Bearer {OTHER_KEY}", "Idempotency-Key": "steal-1"},
    )
    unknown = sandbox.post(
        "/v1/refunds",
        data={"payment_intent": "pi_3SbxOrd9999", "amount": "100"},
        headers={"Authorization": f"Bearer {OTHER_KEY}", "Idempotency-Key": "steal-2"},
    )
    assert theirs.status_code == 404
    assert theirs.json()["error"]["code"] == "resource_missing"
    assert missing(theirs, PI) == missing(unknown, "pi_3SbxOrd9999")

    after = sandbox.stats()["refunds"]
    assert (
        after["by_payment_intent"]
        == before["by_payment_intent"]
        == {PI: {"count": 1, "amount": 500}}
    )
    assert after["by_account"] == before["by_account"]
    assert len(after["by_account"]) == 1
    assert after["total"] == 1


def test_another_key_gets_a_demo_order_as_if_it_did_not_exist(sandbox):
    theirs = sandbox.get("/shop/orders/ord_1001", api_key=OTHER_KEY)
    unknown = sandbox.get("/shop/orders/ord_9999", api_key=OTHER_KEY)
    assert theirs.status_code == 404
    assert theirs.json()["error"]["code"] == "resource_missing"
    assert missing(theirs, "ord_1001") == missing(unknown, "ord_9999")
    assert sandbox.order("ord_1001")["id"] == "ord_1001"
