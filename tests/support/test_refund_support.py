"""The refund-support agent against the sandbox: the provider's own records decide."""

from __future__ import annotations

import pytest

from agentruns.models import Step
from agentruns.runtime import faults
from support.agents import refund_support
from tests.harness import point_at_sandbox, refund_harness

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = "ord_1001"


@pytest.fixture
def world(sandbox, settings, tenant):
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return harness, sandbox, order


def _refunds(sandbox, order) -> dict:
    return sandbox.stats()["refunds"]["by_payment_intent"].get(
        order["payment_intent"], {"count": 0, "amount": 0}
    )


def _refund_step(run) -> Step:
    return Step.objects.get(run=run, name="issue_refund")


def test_a_refund_completes_and_the_provider_has_exactly_it(world):
    harness, sandbox, order = world
    run = harness.start("refund_support", {"order_id": ORDER, "amount": 1500})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    step = _refund_step(run)
    assert _refunds(sandbox, order) == {"count": 1, "amount": 1500}
    assert sandbox.stats()["refunds"]["by_idempotency_key"] == {step.effect_key: 1}
    assert step.provider_reference.startswith("re_")
    assert run.output["reply"] == f"Refunded 15.00 EUR as {step.provider_reference}."
    refund = sandbox.client().v1.refunds.retrieve(step.provider_reference)
    assert refund.metadata["holdfast_effect_key"] == step.effect_key
    assert refund.metadata["order_id"] == ORDER


def test_the_customer_email_follows_the_refund(world):
    harness, sandbox, order = world
    run = harness.start(
        "refund_support", {"order_id": ORDER, "amount": 2500, "email_customer": True}
    )
    assert harness.advance(run) == "finished:completed"
    messages = sandbox.stats()["messages"]
    assert messages["by_recipient"] == {order["customer"]["email"].lower(): 1}
    assert _refunds(sandbox, order)["amount"] == 2500


def test_a_lost_reply_is_settled_by_the_same_key_without_a_second_refund(world):
    harness, sandbox, order = world
    sandbox.arm("drop_after_commit", count=1)
    run = harness.start("refund_support", {"order_id": ORDER, "amount": 700})
    assert harness.advance(run) == "suspended:waiting_for_retry"
    assert _refunds(sandbox, order)["count"] == 1  # it happened; we just did not hear
    assert _refund_step(run).status == "unknown"
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    assert _refunds(sandbox, order) == {"count": 1, "amount": 700}
    assert _refund_step(run).attempts == 2


def test_a_saved_500_is_settled_by_looking_the_refund_up(world):
    harness, sandbox, order = world
    sandbox.arm("error_after", count=1)
    run = harness.start("refund_support", {"order_id": ORDER, "amount": 900})
    run = harness.drive(run, max_rounds=3)
    # Stripe replays the saved 500 for the same key: resending cannot tell.
    assert _refund_step(run).status == "unknown"
    harness.backdate_sends(run, 60)
    run = harness.drive(run)
    assert run.status == "completed"
    step = _refund_step(run)
    assert any(entry["action"] == "lookup" for entry in step.recovery_log)
    assert _refunds(sandbox, order) == {"count": 1, "amount": 900}


def test_a_rate_limited_refund_waits_and_then_goes_through_once(world):
    harness, sandbox, order = world
    sandbox.arm("rate_limit", count=1, retry_after=4)
    run = harness.start("refund_support", {"order_id": ORDER, "amount": 300})
    assert harness.advance(run) == "suspended:waiting_for_retry"
    step = _refund_step(run)
    assert step.status == "running" and step.provider_retry_after == 4.0
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    assert _refunds(sandbox, order) == {"count": 1, "amount": 300}


def test_an_over_refund_is_refused_and_the_agent_says_so(world, tenant):
    harness, sandbox, order = world
    # No approver in the way: the provider's refusal is what is tested.
    tenant.agent_config = {"refund_support": {"approvals": {"enabled": False}}}
    tenant.save()
    run = harness.start("refund_support", {"order_id": ORDER, "amount": order["amount"] + 1})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert _refund_step(run).status == "failed"
    assert run.output["reply"].startswith("I could not complete the refund")
    assert _refunds(sandbox, order)["count"] == 0


def test_resending_a_run_with_the_same_request_id_creates_no_second_refund(world):
    harness, sandbox, order = world
    first = harness.start(
        "refund_support", {"order_id": ORDER, "amount": 2500}, request_id="ticket-42"
    )
    harness.advance(first)
    again = harness.start(
        "refund_support", {"order_id": ORDER, "amount": 2500}, request_id="ticket-42"
    )
    assert again.id == first.id
    assert harness.advance(again) == "not_runnable"
    assert _refunds(sandbox, order)["count"] == 1


def test_an_email_interrupted_after_acceptance_waits_for_an_operator(world):
    harness, sandbox, order = world
    run = harness.start(
        "refund_support", {"order_id": ORDER, "amount": 2500, "email_customer": True}
    )
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "send_customer_email")
    assert harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    assert Step.objects.get(run=run, name="send_customer_email").status == "unknown"
    assert sandbox.stats()["messages"]["total"] == 1
    assert _refunds(sandbox, order)["count"] == 1


def test_a_refund_over_the_approval_limit_waits_for_an_approver(world):
    harness, sandbox, order = world
    limit = refund_support.config["approvals"]["auto_approve_up_to"]["eur"]
    run = harness.start("refund_support", {"order_id": ORDER, "amount": limit + 1})
    assert harness.advance(run) == "suspended:waiting_for_approval"
    assert _refund_step(run).status == "planned"
    assert _refunds(sandbox, order)["count"] == 0


def test_a_tenant_sets_its_own_auto_approval_amount_pinned_at_start(world, tenant):
    harness, sandbox, order = world
    tenant.agent_config = {"refund_support": {"approvals": {"auto_approve_up_to": {"eur": 8000}}}}
    tenant.save()
    run = harness.start("refund_support", {"order_id": ORDER, "amount": 7000})
    assert run.agent_snapshot["config"]["approvals"] == {
        "enabled": True,
        "auto_approve_up_to": {"eur": 8000},
    }
    # A later change does not reach a started run.
    tenant.agent_config = {}
    tenant.save()
    assert harness.advance(run) == "finished:completed"
    assert _refunds(sandbox, order) == {"count": 1, "amount": 7000}
