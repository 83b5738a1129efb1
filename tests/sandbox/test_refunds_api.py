"""Stripe v1 refunds and payment intents, driven through the unmodified stripe SDK."""

from __future__ import annotations

import pytest
import requests
import stripe

PI = "pi_3SbxOrd1003"  # 24900 EUR
PI_SMALL = "pi_3SbxOrd1004"  # 4500 EUR


def test_it_creates_a_refund_that_keeps_its_metadata(client):
    refund = client.v1.refunds.create(
        params={
            "payment_intent": PI,
            "amount": 500,
            "reason": "requested_by_customer",
            "metadata": {"order_id": "ord_1003", "case": "42"},
        }
    )
    assert isinstance(refund, stripe.Refund)
    assert refund.id.startswith("re_")
    assert (refund.amount, refund.currency, refund.status) == (500, "eur", "succeeded")
    assert refund.payment_intent == PI
    assert refund.reason == "requested_by_customer"
    assert refund.last_response.request_id.startswith("req_")

    fetched = client.v1.refunds.retrieve(refund.id)
    assert isinstance(fetched, stripe.Refund)
    assert fetched.id == refund.id
    assert fetched.metadata.to_dict() == {"order_id": "ord_1003", "case": "42"}


def test_a_refund_without_amount_refunds_the_remaining_amount(client):
    client.v1.refunds.create(params={"payment_intent": PI_SMALL, "amount": 1000})
    rest = client.v1.refunds.create(params={"payment_intent": PI_SMALL})
    assert rest.amount == 3500


def test_it_lists_refunds_newest_first_and_pages(client):
    created = [
        client.v1.refunds.create(params={"payment_intent": PI, "amount": 100 + n}).id
        for n in range(3)
    ]
    client.v1.refunds.create(params={"payment_intent": PI_SMALL, "amount": 100})
    newest_first = created[::-1]

    page = client.v1.refunds.list(params={"payment_intent": PI, "limit": 2})
    assert page.object == "list"
    assert page.url == "/v1/refunds"
    assert [refund.id for refund in page.data] == newest_first[:2]
    assert page.has_more is True
    assert [refund.id for refund in page.auto_paging_iter()] == newest_first

    after = client.v1.refunds.list(
        params={"payment_intent": PI, "limit": 2, "starting_after": newest_first[1]}
    )
    assert [refund.id for refund in after.data] == newest_first[2:]
    assert after.has_more is False
    before = client.v1.refunds.list(
        params={"payment_intent": PI, "limit": 1, "ending_before": newest_first[2]}
    )
    assert [refund.id for refund in before.data] == [newest_first[1]]
    assert before.has_more is True
    assert len(client.v1.refunds.list().data) == 4


def test_it_refuses_to_refund_more_than_remains(client):
    client.v1.refunds.create(params={"payment_intent": PI_SMALL, "amount": 4000})
    with pytest.raises(stripe.InvalidRequestError) as error:
        client.v1.refunds.create(params={"payment_intent": PI_SMALL, "amount": 600})
    assert error.value.http_status == 400
    assert error.value.param == "amount"
    assert error.value.code == "amount_too_large"
    assert "is greater than unrefunded amount on charge (€5.00)" in error.value.user_message


def test_it_refuses_to_refund_a_fully_refunded_payment(client):
    client.v1.refunds.create(params={"payment_intent": PI_SMALL})
    with pytest.raises(stripe.InvalidRequestError) as error:
        client.v1.refunds.create(params={"payment_intent": PI_SMALL, "amount": 1})
    assert error.value.http_status == 400
    assert error.value.code == "charge_already_refunded"
    assert error.value.error.type == "invalid_request_error"


def test_unknown_refunds_and_payment_intents_are_404_resource_missing(client):
    with pytest.raises(stripe.InvalidRequestError) as missing_refund:
        client.v1.refunds.retrieve("re_nope")
    assert missing_refund.value.http_status == 404
    assert missing_refund.value.code == "resource_missing"
    assert missing_refund.value.user_message == "No such refund: 're_nope'"

    with pytest.raises(stripe.InvalidRequestError) as missing_intent:
        client.v1.refunds.create(params={"payment_intent": "pi_nope", "amount": 100})
    assert missing_intent.value.http_status == 404
    assert missing_intent.value.code == "resource_missing"

    with pytest.raises(stripe.InvalidRequestError) as missing_lookup:
        client.v1.payment_intents.retrieve("pi_nope")
    assert missing_lookup.value.http_status == 404


def test_it_rejects_invalid_parameters_before_execution(client):
    with pytest.raises(stripe.InvalidRequestError) as no_intent:
        client.v1.refunds.create(params={"amount": 100})
    assert no_intent.value.param == "payment_intent"
    with pytest.raises(stripe.InvalidRequestError) as bad_reason:
        client.v1.refunds.create(params={"payment_intent": PI, "reason": "bored"})
    assert bad_reason.value.param == "reason"


def test_it_shows_a_payment_intent_and_its_refunded_amount(client):
    client.v1.refunds.create(params={"payment_intent": PI, "amount": 900})
    intent = client.v1.payment_intents.retrieve(PI)
    assert isinstance(intent, stripe.PaymentIntent)
    assert (intent.amount, intent.amount_received, intent.currency) == (24900, 24900, "eur")
    assert intent.status == "succeeded"
    assert intent.metadata.to_dict() == {"order_id": "ord_1003"}

    expanded = client.v1.payment_intents.retrieve(PI, params={"expand": ["latest_charge"]})
    assert isinstance(expanded.latest_charge, stripe.Charge)
    assert expanded.latest_charge.amount_refunded == 900
    assert expanded.latest_charge.refunded is False


def test_it_requires_an_api_key(sandbox):
    answer = requests.get(f"{sandbox.url}/v1/refunds", timeout=10)
    assert answer.status_code == 401
    assert answer.json()["error"]["type"] == "authentication_error"
    assert answer.headers["Request-Id"].startswith("req_")


def test_unknown_urls_are_404_in_the_error_envelope(sandbox):
    answer = sandbox.get("/v1/charges", headers={"Authorization": "Bearer sk_test_x"})
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == "Unrecognized request URL (GET: /v1/charges)."
