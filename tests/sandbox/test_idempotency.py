"""Stripe's v1 idempotency contract: replay, mismatch, in-flight conflict, scope, pruning."""

from __future__ import annotations

import threading
import time

import pytest
import stripe

from tests.harness import TTL_SECONDS

PI = "pi_3SbxOrd1005"  # 8950 EUR
PARAMS = {"payment_intent": PI, "amount": 700, "metadata": {"order_id": "ord_1005"}}


def test_a_repeated_key_replays_the_first_refund_without_a_second_one(sandbox, client):
    first = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-1"})
    # Same parameters in another order on the wire: still the same request.
    again = client.v1.refunds.create(
        params={"metadata": {"order_id": "ord_1005"}, "amount": 700, "payment_intent": PI},
        options={"idempotency_key": "rk-1"},
    )
    assert again.id == first.id
    assert "Idempotent-Replayed" not in first.last_response.headers
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert again.last_response.idempotency_key == "rk-1"
    assert sandbox.stats()["refunds"]["by_idempotency_key"] == {"rk-1": 1}


def test_a_key_reused_with_other_parameters_is_an_idempotency_error(sandbox, client):
    client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-2"})
    with pytest.raises(stripe.IdempotencyError) as error:
        client.v1.refunds.create(
            params={**PARAMS, "amount": 701}, options={"idempotency_key": "rk-2"}
        )
    assert error.value.http_status == 400
    assert error.value.error.type == "idempotency_error"
    assert "can only be used with the same parameters" in error.value.user_message
    assert sandbox.stats()["refunds"]["total"] == 1


def test_a_key_in_flight_answers_409_and_executes_once(sandbox, client):
    sandbox.arm("delay", delay=1.5)
    first: dict = {}
    thread = threading.Thread(
        target=lambda: first.update(
            refund=client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-3"})
        )
    )
    thread.start()
    deadline = time.monotonic() + 5
    while sandbox.stats()["idempotency_records"] == 0:  # the first request has claimed the key
        assert time.monotonic() < deadline
        time.sleep(0.05)

    with pytest.raises(stripe.APIError) as conflict:
        client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-3"})
    assert conflict.value.http_status == 409
    assert conflict.value.error.code == "idempotency_key_in_use"

    thread.join(timeout=10)
    replayed = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-3"})
    assert replayed.id == first["refund"].id
    assert sandbox.stats()["refunds"]["total"] == 1


def test_keys_are_scoped_per_api_key(sandbox, client):
    seeded = sandbox.post("/_sandbox/seed", json={"api_key": "sk_test_two", "first_number": 2001})
    assert seeded.status_code == 200, seeded.text
    one = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "shared"})
    other = sandbox.client("sk_test_two").v1.refunds.create(
        params={"payment_intent": "pi_3SbxOrd2005", "amount": 300},
        options={"idempotency_key": "shared"},
    )
    assert one.id != other.id
    assert "Idempotent-Replayed" not in other.last_response.headers
    assert sandbox.stats()["refunds"]["by_idempotency_key"] == {"shared": 2}


def test_an_expired_key_is_a_new_request(sandbox, client):
    first = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-4"})
    sandbox.post("/_sandbox/clock", json={"advance": TTL_SECONDS + 1})
    second = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-4"})
    assert second.id != first.id
    assert "Idempotent-Replayed" not in second.last_response.headers
    assert sandbox.stats()["refunds"]["by_idempotency_key"] == {"rk-4": 2}


def test_a_key_is_kept_until_it_expires(sandbox, client):
    first = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-5"})
    sandbox.post("/_sandbox/clock", json={"advance": TTL_SECONDS - 5})
    again = client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "rk-5"})
    assert again.id == first.id


def test_an_error_after_execution_began_is_saved_and_replayed(sandbox, client):
    too_much = {"payment_intent": PI, "amount": 999_999}
    with pytest.raises(stripe.InvalidRequestError) as first:
        client.v1.refunds.create(params=too_much, options={"idempotency_key": "rk-6"})
    assert "Idempotent-Replayed" not in first.value.headers
    with pytest.raises(stripe.InvalidRequestError) as again:
        client.v1.refunds.create(params=too_much, options={"idempotency_key": "rk-6"})
    assert again.value.headers["Idempotent-Replayed"] == "true"
    assert again.value.json_body == first.value.json_body


def test_a_validation_error_is_not_saved_so_the_key_can_be_retried(sandbox, client):
    with pytest.raises(stripe.InvalidRequestError):
        client.v1.refunds.create(
            params={"payment_intent": PI, "reason": "bored"}, options={"idempotency_key": "rk-7"}
        )
    refund = client.v1.refunds.create(
        params={"payment_intent": PI, "reason": "duplicate"}, options={"idempotency_key": "rk-7"}
    )
    assert refund.reason == "duplicate"


def test_a_key_longer_than_255_characters_is_rejected(client):
    with pytest.raises(stripe.InvalidRequestError) as error:
        client.v1.refunds.create(params=PARAMS, options={"idempotency_key": "k" * 256})
    assert error.value.http_status == 400
