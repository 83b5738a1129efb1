"""The refund agent's Pydantic AI twin against the sandbox: the provider's records decide."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from agentruns.models import Step
from approvals.models import Approval, ApprovalAuthority
from approvals.services import approval_decide
from support.pydantic_agent import refund_support_pydantic_ai
from tests.harness import OVER_LIMIT, point_at_sandbox, refund_harness

# A decision wakes the run through the task queue (its own database on SQLite).
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

ORDER = "ord_1001"
TWIN = "refund_support_pydantic_ai"


@pytest.fixture
def world(sandbox, settings, tenant):
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant, refund_support_pydantic_ai)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return harness, sandbox, order


def _refunds(sandbox, order) -> dict:
    return sandbox.stats()["refunds"]["by_payment_intent"].get(
        order["payment_intent"], {"count": 0, "amount": 0}
    )


def test_the_twin_refunds_once_with_the_effect_key_as_the_providers_idempotency_key(world):
    harness, sandbox, order = world
    run = harness.start(TWIN, {"order_id": ORDER, "amount": 1500})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    step = Step.objects.get(run=run, name="issue_refund")
    assert _refunds(sandbox, order) == {"count": 1, "amount": 1500}
    assert sandbox.stats()["refunds"]["by_idempotency_key"] == {step.effect_key: 1}
    assert run.output == f"Refunded 15.00 EUR as {step.provider_reference}."
    assert run.outcome_code == "refunded"
    refund = sandbox.client().v1.refunds.retrieve(step.provider_reference)
    assert refund.metadata["holdfast_effect_key"] == step.effect_key
    assert refund.metadata["holdfast_run_id"] == str(run.id)
    assert refund.metadata["order_id"] == ORDER
    # The same declarations as the native agent's tools.
    assert step.recovery["describe"] == "idempotent(86400s)+lookup"
    assert Step.objects.get(run=run, name="lookup_order").recovery["read_only"] is True


def test_the_twin_emails_the_customer_after_the_refund(world):
    harness, sandbox, order = world
    run = harness.start(TWIN, {"order_id": ORDER, "amount": 2500, "email_customer": True})
    assert harness.advance(run) == "finished:completed"
    assert sandbox.stats()["messages"]["by_recipient"] == {order["customer"]["email"].lower(): 1}
    email = Step.objects.get(run=run, name="send_customer_email")
    assert email.recovery["describe"] == "manual"


def test_a_lost_reply_is_settled_under_the_same_key_without_a_second_refund(world):
    harness, sandbox, order = world
    sandbox.arm("drop_after_commit", count=1)
    run = harness.start(TWIN, {"order_id": ORDER, "amount": 700})
    assert harness.advance(run) == "suspended:waiting_for_retry"
    assert Step.objects.get(run=run, name="issue_refund").status == "unknown"
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    assert _refunds(sandbox, order) == {"count": 1, "amount": 700}


def test_a_refund_over_the_limit_waits_for_an_approver_as_the_native_agents_does(
    world, make_operator
):
    harness, sandbox, order = world
    approver = make_operator(harness.tenant, "approver", username="ann")
    ApprovalAuthority.objects.update_or_create(
        tenant=harness.tenant,
        group=Group.objects.get(name="approver"),
        currency="eur",
        defaults={"max_amount": None},
    )
    run = harness.start(TWIN, {"order_id": ORDER, "amount": OVER_LIMIT})
    assert harness.advance(run) == "suspended:waiting_for_approval"
    approval = Approval.objects.get(run_id=run.id, status="pending")
    assert approval.amount == OVER_LIMIT and approval.currency == "eur"
    assert approval.resource == f"payment_intent:{order['payment_intent']}"
    assert f"Refund 60.00 EUR of order {ORDER}" in approval.preview
    assert _refunds(sandbox, order)["count"] == 0
    approval_decide(
        approval=approval, user=approver, decision="approve", seen_args_hash=approval.args_hash
    )
    run = harness.drive(run)
    assert run.status == "completed"
    assert _refunds(sandbox, order) == {"count": 1, "amount": OVER_LIMIT}
    refund = Step.objects.get(run=run, name="issue_refund")
    refund_at_provider = sandbox.client().v1.refunds.retrieve(refund.provider_reference)
    assert refund_at_provider.metadata["holdfast_approval_id"] == str(approval.id)


def test_an_order_the_shop_does_not_know_ends_with_nothing_to_refund(world):
    harness, sandbox, _ = world
    run = harness.drive(harness.start(TWIN, {"order_id": "ord_4040"}))
    assert run.status == "completed"
    assert run.outcome_code == "nothing_to_refund"
    assert run.output.startswith("I could not find that order: ")
    lookup = Step.objects.get(run=run, name="lookup_order")
    assert lookup.status == "failed"
    assert not Step.objects.filter(run=run, name="issue_refund").exists()
    assert sandbox.stats()["refunds"]["total"] == 0
