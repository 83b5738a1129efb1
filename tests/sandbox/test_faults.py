"""Injected faults: lost replies, errors before and after commit, rate limits, refusals."""

from __future__ import annotations

import time

import pytest
import requests
import stripe

PI = "pi_3SbxOrd1006"  # 15900 EUR
PARAMS = {"payment_intent": PI, "amount": 1200}


def test_a_lost_reply_committed_the_refund_and_the_key_replays_it(sandbox, client):
    sandbox.arm("drop_after_commit")
    with pytest.raises(stripe.APIConnectionError):
        client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "lost-1"})
    stats = sandbox.stats()["refunds"]
    assert stats["by_idempotency_key"] == {"lost-1": 1}

    replayed = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "lost-1"})
    assert replayed.last_response.headers["Idempotent-Replayed"] == "true"
    assert [refund.id for refund in client.v1.refunds.list(params={"payment_intent": PI})] == [
        replayed.id
    ]
    assert sandbox.stats()["refunds"]["total"] == 1


def test_an_error_after_commit_is_a_saved_500_replayed_verbatim(sandbox, client):
    sandbox.arm("error_after")
    with pytest.raises(stripe.APIError) as first:
        client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "late-1"})
    assert first.value.http_status == 500
    assert first.value.headers["Stripe-Should-Retry"] == "false"
    assert sandbox.stats()["refunds"]["by_idempotency_key"] == {"late-1": 1}

    with pytest.raises(stripe.APIError) as again:
        client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "late-1"})
    assert again.value.http_status == 500
    assert again.value.headers["Idempotent-Replayed"] == "true"
    assert again.value.headers["Stripe-Should-Retry"] == "false"
    assert sandbox.stats()["refunds"]["total"] == 1


def test_an_error_before_execution_is_not_saved(sandbox, client):
    sandbox.arm("error_before")
    with pytest.raises(stripe.APIError) as error:
        client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "early-1"})
    assert error.value.http_status == 500
    assert sandbox.stats()["refunds"]["total"] == 0

    refund = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "early-1"})
    assert "Idempotent-Replayed" not in refund.last_response.headers
    assert sandbox.stats()["refunds"]["total"] == 1


def test_a_rate_limit_answers_429_with_retry_after_and_saves_nothing(sandbox, client):
    sandbox.arm("rate_limit", retry_after=7)
    with pytest.raises(stripe.RateLimitError) as error:
        client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "busy-1"})
    assert error.value.http_status == 429
    assert error.value.headers["Retry-After"] == "7"
    assert error.value.error.code == "rate_limit"

    refund = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "busy-1"})
    assert refund.amount == 1200
    assert sandbox.stats()["refunds"]["total"] == 1


def test_a_fault_fires_for_its_count_then_stops(sandbox, client):
    sandbox.arm("error_before", method="GET", path="/v1/payment_intents/", count=2)
    for _ in range(2):
        with pytest.raises(stripe.APIError):
            client.v1.payment_intents.retrieve(PI)
    assert client.v1.payment_intents.retrieve(PI).id == PI


def test_faults_are_listed_and_cleared(sandbox):
    sandbox.arm("delay", path="/shop/", method="GET", delay=0.2, count=3)
    listed = sandbox.get("/_sandbox/faults").json()["faults"]
    assert [(f["kind"], f["path"], f["remaining"]) for f in listed] == [("delay", "/shop/", 3)]
    started = time.monotonic()
    assert sandbox.get("/shop/orders/ord_1001").status_code == 200
    assert time.monotonic() - started >= 0.2

    assert sandbox.delete("/_sandbox/faults").status_code == 200
    assert sandbox.get("/_sandbox/faults").json()["faults"] == []


def test_refuse_closes_the_listener_for_a_while(sandbox, client):
    sandbox.arm("refuse", delay=1.5)
    deadline = time.monotonic() + 1
    while True:  # the listener closes just after the fault is acknowledged
        try:
            sandbox.get("/_sandbox/stats")
        except requests.ConnectionError:
            break
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(stripe.APIConnectionError):
        client.v1.payment_intents.retrieve(PI)

    deadline = time.monotonic() + 5
    while True:
        try:
            assert sandbox.get("/_sandbox/stats").status_code == 200
            break
        except requests.ConnectionError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert client.v1.payment_intents.retrieve(PI).id == PI
