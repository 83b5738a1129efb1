"""The provider's request log: every /v1 and /shop request with its account and answer,
written before the reply, read at GET /_sandbox/requests."""

from __future__ import annotations

from datetime import datetime

import pytest
import requests
import stripe

from sandbox import requestlog
from sandbox.accounts import account_for
from sandbox.models import DB, ProviderRequest
from sandbox.responses import new_id
from tests.harness import API_KEY

OTHER_KEY = "sk_test_other"
PI = "pi_3SbxOrd1002"  # 3490 EUR


def seen(rows: list[dict]) -> list[tuple]:
    return [(row["method"], row["path"], row["status"], row["fault"]) for row in rows]


def test_it_records_an_accounts_requests_to_the_provider_oldest_first(sandbox, client):
    assert sandbox.requests_of(API_KEY) == []
    sandbox.order("ord_1002")
    sandbox.get(f"/v1/refunds?payment_intent={PI}&limit=2")
    client.v1.refunds.create(params={"payment_intent": PI, "amount": 100})
    sandbox.get("/shop/orders/ord_9999")

    rows = sandbox.requests_of(API_KEY)
    assert seen(rows) == [
        ("GET", "/shop/orders/ord_1002", 200, ""),
        ("GET", f"/v1/refunds?payment_intent={PI}&limit=2", 200, ""),
        ("POST", "/v1/refunds", 200, ""),
        ("GET", "/shop/orders/ord_9999", 404, ""),
    ]
    assert {row["account"] for row in rows} == {account_for(API_KEY)}
    assert [row["id"] for row in rows] == sorted(row["id"] for row in rows)
    assert all(datetime.fromisoformat(row["received_at"]) for row in rows)


def test_it_records_requests_without_a_key_with_no_account(sandbox):
    answer = requests.get(f"{sandbox.url}/shop/orders/ord_1001", timeout=10)
    assert answer.status_code == 401
    rows = sandbox.get("/_sandbox/requests", params={"account": ""}).json()["requests"]
    assert seen(rows) == [("GET", "/shop/orders/ord_1001", 401, "")]
    assert rows[0]["account"] == ""


def test_it_records_faults_and_dropped_replies(sandbox, client):
    sandbox.arm("drop_after_commit")
    with pytest.raises(stripe.APIConnectionError):
        client.v1.refunds.create(params={"payment_intent": PI, "amount": 100})
    sandbox.arm("error_before", method="GET", path="/v1/payment_intents/")
    with pytest.raises(stripe.APIError):
        client.v1.payment_intents.retrieve(PI)
    sandbox.arm("rate_limit", method="GET", path="/shop/")
    assert sandbox.get("/shop/orders/ord_1002").status_code == 429

    assert seen(sandbox.requests_of(API_KEY)) == [
        ("POST", "/v1/refunds", None, "drop_after_commit"),
        ("GET", f"/v1/payment_intents/{PI}", 500, "error_before"),
        ("GET", "/shop/orders/ord_1002", 429, "rate_limit"),
    ]


def test_the_sandboxs_own_routes_are_not_recorded(sandbox):
    sandbox.stats()
    sandbox.get("/_sandbox/messages")
    sandbox.get("/_sandbox/faults")
    sandbox.get("/_sandbox/clock")
    sandbox.post("/_sandbox/seed")
    sandbox.requests_of(API_KEY)
    assert sandbox.get("/_sandbox/requests").json() == {"requests": []}


def test_it_lists_one_accounts_requests_by_key_or_by_account(sandbox):
    sandbox.post("/_sandbox/seed", json={"api_key": OTHER_KEY, "first_number": 2001})
    sandbox.order("ord_1001")
    sandbox.order("ord_2001", api_key=OTHER_KEY)
    sandbox.get("/shop/orders/ord_1001", api_key=OTHER_KEY)

    assert seen(sandbox.requests_of(API_KEY)) == [("GET", "/shop/orders/ord_1001", 200, "")]
    theirs = sandbox.requests_of(OTHER_KEY)
    assert seen(theirs) == [
        ("GET", "/shop/orders/ord_2001", 200, ""),
        ("GET", "/shop/orders/ord_1001", 404, ""),
    ]
    by_account = sandbox.get("/_sandbox/requests", params={"account": account_for(OTHER_KEY)})
    assert by_account.json()["requests"] == theirs
    everyone = sandbox.get("/_sandbox/requests").json()["requests"]
    assert [row["account"] for row in everyone] == [
        account_for(API_KEY),
        account_for(OTHER_KEY),
        account_for(OTHER_KEY),
    ]


def test_asking_for_a_key_and_an_account_at_once_is_refused(sandbox):
    answer = sandbox.get(
        "/_sandbox/requests", params={"api_key": API_KEY, "account": account_for(API_KEY)}
    )
    assert answer.status_code == 400


def test_reset_wipes_the_log(sandbox):
    sandbox.order("ord_1001")
    sandbox.post("/_sandbox/reset", json={"seed": True})
    assert sandbox.requests_of(API_KEY) == []


# --- in-process, on the sandbox's test database --------------------------------------


def record(account: str = "acct_test") -> ProviderRequest:
    return requestlog.record(
        account=account,
        method="GET",
        path=f"/shop/orders/{new_id('ord_', 6)}",
        status=200,
        fault="",
        received_at=datetime.fromisoformat("2026-01-01T00:00:00+00:00"),
    )


@pytest.mark.django_db(databases=["default", "sandbox"])
def test_the_log_keeps_only_the_newest_rows(monkeypatch):
    monkeypatch.setattr(requestlog, "KEEP", 3)
    monkeypatch.setattr(requestlog, "PRUNE_EVERY", 1)
    rows = [record() for _ in range(5)]
    kept = ProviderRequest.objects.using(DB).order_by("id").values_list("id", flat=True)
    assert list(kept) == [row.pk for row in rows[-3:]]


@pytest.mark.django_db(databases=["default", "sandbox"])
def test_the_list_has_the_newest_matching_rows_oldest_first(monkeypatch):
    monkeypatch.setattr(requestlog, "LIST_LIMIT", 2)
    rows = [record() for _ in range(3)]
    record(account="acct_someone_else")
    listed = requestlog.recent(account="acct_test")
    assert [row["id"] for row in listed] == [row.pk for row in rows[-2:]]
