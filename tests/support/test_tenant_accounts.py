"""Each tenant's tools act with its own provider accounts, and never see another's.

Proved from the provider's side: the sandbox scopes orders, payments and refunds by
API key, as a Stripe account does, and its request log shows every call each
account made (``tests.harness.Sandbox.requests_of``).
"""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from accounts.models import ApiToken
from accounts.provider_accounts import provider_account_set
from agentruns.models import Run, Step
from agentruns.runtime import agent
from approvals.models import Approval
from support.tools import issue_refund
from tests.harness import API_KEY, point_at_sandbox, refund_harness

pytestmark = pytest.mark.django_db(transaction=True)

OTHER_KEY = "sk_test_other_tenant"


class _Asked(BaseModel):
    payment_intent: str
    amount: int


@agent(
    name="direct_refund",
    version=1,
    tools=[issue_refund],
    input_model=_Asked,
    config={"approvals": {"enabled": True, "auto_approve_up_to": 5000}},
)
def direct_refund(ctx, input):
    """A model that names a payment intent it never looked up, in EUR."""
    result = ctx.tool("issue_refund", {"order_id": "ord_1001", "currency": "eur", **input})
    return {"status": result.status, "error": result.error, "class": result.error_class}


@pytest.fixture
def world(sandbox, settings, other_tenant):
    point_at_sandbox(settings, sandbox)
    return refund_harness(other_tenant, direct_refund), sandbox


def _give_other_its_accounts(other_tenant, sandbox, monkeypatch) -> None:
    monkeypatch.setenv("HOLDFAST_SECRET_OTHER", OTHER_KEY)
    for provider, sender in (("payments", ""), ("shop", ""), ("mail", "help@other.example")):
        provider_account_set(
            tenant=other_tenant,
            provider=provider,
            endpoint=sandbox.url if provider != "mail" else "",
            secret_ref="env:HOLDFAST_SECRET_OTHER" if provider != "mail" else "",
            sender=sender,
            actor="user:root",
        )


def _calls(sandbox, api_key: str) -> list[tuple[str, str, int | None]]:
    return [(r["method"], r["path"], r["status"]) for r in sandbox.requests_of(api_key)]


def _every_call(sandbox) -> list[dict]:
    answer = sandbox.get("/_sandbox/requests")
    assert answer.status_code == 200, answer.text
    return answer.json()["requests"]


def test_a_tenant_without_accounts_of_its_own_reaches_no_provider(world):
    harness, sandbox = world
    run = harness.start("refund_support", {"order_id": "ord_1001", "amount": 4000})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.outcome_code == "nothing_to_refund"
    lookup = Step.objects.get(run=run, name="lookup_order")
    assert (lookup.status, lookup.last_error_class) == ("failed", "no_provider_account")
    assert "tenant 'other' has no shop account" in lookup.last_error
    # Not a single request, with the deployment's key or any other.
    assert _every_call(sandbox) == []
    assert sandbox.stats()["refunds"]["total"] == 0


def test_another_tenants_order_is_not_found_and_nothing_about_it_is_recorded(
    world, other_tenant, monkeypatch
):
    harness, sandbox = world
    _give_other_its_accounts(other_tenant, sandbox, monkeypatch)
    run = harness.start("refund_support", {"order_id": "ord_1001", "amount": 4000})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.outcome_code == "nothing_to_refund"
    lookup = Step.objects.get(run=run, name="lookup_order")
    assert (lookup.status, lookup.last_error_class) == ("failed", "not_found")
    recorded = json.dumps(list(Step.objects.filter(run=run).values("input", "result")))
    assert "Ada" not in recorded and "ada@example.com" not in recorded
    # The one call made, with the tenant's own key, was the lookup the shop answered 404.
    assert _calls(sandbox, OTHER_KEY) == [("GET", "/shop/orders/ord_1001", 404)]
    assert _calls(sandbox, API_KEY) == []
    assert sandbox.stats()["refunds"]["total"] == 0


@pytest.mark.parametrize("amount", [1500, 6000], ids=["no approval needed", "over the limit"])
def test_a_payment_of_another_tenant_named_outright_is_never_refunded(
    world, other_tenant, monkeypatch, amount
):
    harness, sandbox = world
    _give_other_its_accounts(other_tenant, sandbox, monkeypatch)
    run = harness.start("direct_refund", {"payment_intent": "pi_3SbxOrd1001", "amount": amount})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert (run.output["status"], run.output["class"]) == ("failed", "resource_missing")
    assert "No such payment_intent: 'pi_3SbxOrd1001'" in run.output["error"]
    # Read and refused; no approval was asked for a payment the tenant cannot see.
    assert not Approval.objects.filter(run=run).exists()
    assert [(method, path.split("?")[0]) for method, path, _ in _calls(sandbox, OTHER_KEY)] == [
        ("GET", "/v1/payment_intents/pi_3SbxOrd1001")
    ]
    assert sandbox.stats()["refunds"]["total"] == 0


def test_a_tenants_own_order_is_refunded_in_its_own_account_and_mailed_from_its_sender(
    world, other_tenant, monkeypatch
):
    harness, sandbox = world
    _give_other_its_accounts(other_tenant, sandbox, monkeypatch)
    seeded = sandbox.post("/_sandbox/seed", json={"api_key": OTHER_KEY, "first_number": 2001})
    assert seeded.status_code == 200, seeded.text
    run = harness.start(
        "refund_support", {"order_id": "ord_2002", "amount": 500, "email_customer": True}
    )
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.outcome_code == "refunded"
    refunds = sandbox.stats()["refunds"]
    assert refunds["by_payment_intent"] == {"pi_3SbxOrd2002": {"count": 1, "amount": 500}}
    assert list(refunds["by_account"].values()) == [{"count": 1, "amount": 500}]
    assert _calls(sandbox, API_KEY) == []
    [message] = sandbox.get("/_sandbox/messages").json()["messages"]
    assert message["mail_from"] == "help@other.example"
    # The deployment's own orders are still invisible to it.
    assert sandbox.get("/shop/orders/ord_1001", api_key=OTHER_KEY).status_code == 404


def test_a_token_of_another_tenant_starting_a_refund_of_the_default_tenants_order_moves_nothing(
    world, client, other_tenant, make_operator, monkeypatch
):
    """The finding, as it was found: tenant other's token, the default tenant's ord_1001."""
    harness, sandbox = world
    _give_other_its_accounts(other_tenant, sandbox, monkeypatch)
    owner = make_operator(other_tenant, "operator", username="other-integrator")
    _, secret = ApiToken.issue(owner=owner, name="helpdesk")
    response = client.post(
        "/api/runs",
        data=json.dumps(
            {
                "agent": "refund_support",
                "input": {"order_id": "ord_1001"},
                "request_id": "ticket-ord-1001",
            }
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.tenant_id == other_tenant.pk
    assert harness.drive(run).status == "completed"
    body = client.get(f"/api/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert body["outcome_code"] == "nothing_to_refund"
    assert "Ada" not in json.dumps(body)
    assert _calls(sandbox, OTHER_KEY) == [("GET", "/shop/orders/ord_1001", 404)]
    assert sandbox.stats()["refunds"]["total"] == 0
    assert sandbox.order("ord_1001")["amount_refunded"] == 0
