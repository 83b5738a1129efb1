"""An approval authorises one call: its exact arguments, checked again before the send."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from agentruns.models import Run, Step
from agentruns.runtime import Registry, agent, faults
from approvals.models import Approval, ApprovalAuthority
from approvals.services import approval_decide
from support.agents import refund_support
from support.tools import issue_refund, lookup_order
from tests.harness import ORDER, OVER_LIMIT

# A decision wakes the run through the task queue (its own database on SQLite).
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _approve(approval, user, note=""):
    return approval_decide(
        approval=approval,
        user=user,
        decision="approve",
        seen_args_hash=approval.args_hash,
        note=note,
    )


def _refund_step(run) -> Step:
    return Step.objects.get(run=run, name="issue_refund")


def test_a_refund_over_the_limit_waits_holding_nothing_and_binds_its_exact_call(world):
    run = world.start_refund(requested_by="user:requester")
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    run.refresh_from_db()
    assert run.status == "waiting_for_approval"
    assert run.lease_owner == "" and run.lease_expires_at is None
    step = _refund_step(run)
    assert step.status == "planned" and step.first_sent_at is None and step.attempts == 0
    approval = world.waiting_approval(run)
    assert approval.args == step.input
    assert approval.effect_key == step.effect_key
    assert approval.tenant_id == run.tenant_id
    assert approval.requested_by == "user:requester"
    assert approval.resource == f"payment_intent:{world.order['payment_intent']}"
    assert approval.resource_state["amount_received"] == world.order["amount"]
    assert approval.resource_state["amount_refunded"] == 0
    assert approval.amount == OVER_LIMIT and approval.currency == world.order["currency"]
    assert "Refund 60.00 EUR of order ord_1001" in approval.preview
    assert timedelta(hours=23, minutes=59) < approval.expires_at - approval.created_at
    assert world.refunds()["count"] == 0
    # Advancing again changes nothing: the run is not runnable until a decision.
    assert world.harness.advance(run) == "not_runnable"
    assert Approval.objects.filter(run=run).count() == 1


def test_an_approved_refund_is_sent_once_under_its_approval(world, approver):
    run = world.start_refund()
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    _approve(approval, approver)
    run.refresh_from_db()
    assert run.status == "queued" and run.enqueued_at is not None
    assert world.harness.advance(run) == "finished:completed"
    step = _refund_step(run)
    approval.refresh_from_db()
    assert approval.status == "consumed"
    assert approval.consumed_by_effect_key == step.effect_key
    assert world.refunds() == {"count": 1, "amount": OVER_LIMIT}
    refund = world.sandbox.client().v1.refunds.retrieve(step.provider_reference)
    assert refund.metadata["holdfast_approval_id"] == str(approval.pk)
    sent = run.events.get(type="effect_sent")
    assert sent.payload["approval"] == approval.pk


def test_a_rejected_refund_never_executes_and_the_agent_is_told_why(world, approver):
    run = world.start_refund()
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    approval_decide(
        approval=approval,
        user=approver,
        decision="reject",
        seen_args_hash=approval.args_hash,
        note="customer already got a voucher",
    )
    assert world.harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    step = _refund_step(run)
    assert step.status == "failed" and step.last_error_class == "approval_rejected"
    assert step.first_sent_at is None
    assert "customer already got a voucher" in step.last_error
    assert "customer already got a voucher" in run.output["reply"]
    assert world.refunds()["count"] == 0


def _approved(world, approver):
    run = world.start_refund()
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    _approve(approval, approver)
    return run, approval


def _assert_invalidated_and_asked_again(world, run, approval, reason_part):
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval.refresh_from_db()
    assert approval.status == "invalidated"
    assert reason_part in approval.invalidated_reason
    fresh = world.waiting_approval(run)
    assert fresh.replaces_id == approval.pk
    assert any(reason_part in change for change in fresh.changes)
    assert _refund_step(run).status == "planned"
    return fresh


def test_other_arguments_than_approved_invalidate_it(world, approver):
    run, approval = _approved(world, approver)
    Approval.objects.filter(pk=approval.pk).update(args_hash="0" * 64)
    _assert_invalidated_and_asked_again(world, run, approval, "arguments differ")
    assert world.refunds()["count"] == 0


def test_an_approval_that_expired_before_the_send_is_invalidated(world, approver):
    run, approval = _approved(world, approver)
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    _assert_invalidated_and_asked_again(world, run, approval, "expired")
    assert world.refunds()["count"] == 0


def test_an_approval_of_another_tenant_is_invalidated(world, approver, other_tenant):
    run, approval = _approved(world, approver)
    Approval.objects.filter(pk=approval.pk).update(tenant=other_tenant)
    _assert_invalidated_and_asked_again(world, run, approval, "another tenant")
    assert world.refunds()["count"] == 0


def test_a_deactivated_approver_no_longer_authorises(world, approver):
    run, approval = _approved(world, approver)
    approver.is_active = False
    approver.save()
    _assert_invalidated_and_asked_again(world, run, approval, "deactivated")
    assert world.refunds()["count"] == 0


def test_an_approver_who_lost_the_role_no_longer_authorises(world, approver):
    run, approval = _approved(world, approver)
    approver.groups.clear()
    _assert_invalidated_and_asked_again(world, run, approval, "does not allow deciding")
    assert world.refunds()["count"] == 0


def test_an_approver_whose_limit_was_lowered_no_longer_authorises(world, approver, tenant):
    run, approval = _approved(world, approver)
    ApprovalAuthority.objects.filter(tenant=tenant).update(max_amount=1000)
    _assert_invalidated_and_asked_again(world, run, approval, "above the role's limit")
    assert world.refunds()["count"] == 0


def test_a_payment_refunded_meanwhile_invalidates_and_the_new_request_shows_it(world, approver):
    run, approval = _approved(world, approver)
    world.sandbox.client().v1.refunds.create(
        params={"payment_intent": world.order["payment_intent"], "amount": 500}
    )
    fresh = _assert_invalidated_and_asked_again(world, run, approval, "changed since")
    assert "amount_refunded: 0.00 EUR → 5.00 EUR" in fresh.changes
    assert fresh.resource_state["amount_refunded"] == 500
    assert world.refunds() == {"count": 1, "amount": 500}  # only the other refund


@agent(name="insistent", version=1, tools=[lookup_order, issue_refund])
def insistent(ctx, input):
    """Asks for a refund; when it is rejected, asks for a bigger one."""
    args = {
        "order_id": ORDER,
        "payment_intent": input["payment_intent"],
        "amount": OVER_LIMIT,
        "currency": "eur",
    }
    first = ctx.tool("issue_refund", args)
    if first.ok:
        return {"refunded": first.value["id"]}
    second = ctx.tool("issue_refund", {**args, "amount": OVER_LIMIT + 1000})
    return {"second": second.status}


def test_the_agent_cannot_widen_a_rejected_approval_by_asking_again(world, approver):
    world.harness.registry = Registry([insistent])
    world.harness.engine = world.harness.build()
    run = world.harness.start("insistent", {"payment_intent": world.order["payment_intent"]})
    world.harness.advance(run)
    first = world.waiting_approval(run)
    approval_decide(
        approval=first,
        user=approver,
        decision="reject",
        seen_args_hash=first.args_hash,
        note="too much",
    )
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    second = world.waiting_approval(run)
    assert second.pk != first.pk
    assert second.step_id != first.step_id
    assert second.args["amount"] == OVER_LIMIT + 1000
    assert world.refunds()["count"] == 0


def test_a_recovery_after_the_send_is_never_gated_again(world, approver):
    run, approval = _approved(world, approver)
    # Killed after the provider refunded (the fingerprint changed: our own refund)
    # and before the answer was recorded.
    world.harness.interrupt(run, faults.AFTER_CALL_RETURNED, "issue_refund")
    assert world.refunds()["count"] == 1
    assert _refund_step(run).status == "running"
    run = world.harness.drive(run)
    assert run.status == "completed"
    assert world.refunds() == {"count": 1, "amount": OVER_LIMIT}
    approval.refresh_from_db()
    assert approval.status == "consumed"
    assert Approval.objects.filter(run=run).count() == 1


def test_a_crash_after_consuming_and_before_sending_sends_once_under_it(world, approver):
    run, approval = _approved(world, approver)
    world.harness.interrupt(run, faults.AFTER_STEP_RUNNING, "issue_refund")
    approval.refresh_from_db()
    assert approval.status == "consumed"
    assert world.refunds()["count"] == 0
    run = world.harness.drive(run)
    assert run.status == "completed"
    assert world.refunds() == {"count": 1, "amount": OVER_LIMIT}
    refund = world.sandbox.client().v1.refunds.retrieve(_refund_step(run).provider_reference)
    assert refund.metadata["holdfast_approval_id"] == str(approval.pk)


def test_a_lease_lost_at_the_clearing_commit_leaves_the_approval_unconsumed(world, approver):
    from approvals import gate as gate_module

    run, approval = _approved(world, approver)

    real_guard = gate_module.DatabaseApprovalGate.consume_guard

    def guard_then_steal(self, approval_id, **kwargs):
        # Another worker takes the run between the resource read and the clearing
        # commit: the guard would match, the fence does not, so neither is written.
        Run.objects.filter(pk=run.id).update(state_version=10_000)
        return real_guard(self, approval_id, **kwargs)

    gate_module.DatabaseApprovalGate.consume_guard = guard_then_steal
    try:
        assert world.harness.advance(run) == "lease_lost"
    finally:
        gate_module.DatabaseApprovalGate.consume_guard = real_guard
    approval.refresh_from_db()
    assert approval.status == "approved" and approval.consumed_by_effect_key is None
    assert _refund_step(run).status == "planned"
    assert world.refunds()["count"] == 0


def test_a_run_waiting_on_version_1_keeps_its_approval_after_version_2_is_deployed(world, approver):
    run = world.start_refund()
    world.harness.advance(run)
    approval = world.waiting_approval(run)

    @agent(name="refund_support", version=2, tools=[lookup_order, issue_refund])
    def refund_support_v2(ctx, input):
        raise AssertionError("version 2 must not take over a run started on version 1")

    world.harness.registry = Registry([refund_support, refund_support_v2])
    world.harness.engine = world.harness.build()
    _approve(approval, approver)
    assert world.harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.agent_version == 1
    approval.refresh_from_db()
    assert approval.status == "consumed"
    assert world.refunds() == {"count": 1, "amount": OVER_LIMIT}


def test_cancelling_a_run_waiting_for_approval_withdraws_the_request(world):
    run = world.start_refund()
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    run = world.harness.engine.request_cancel(run.id, by="user:ops")
    assert run.status == "cancelled_no_effect"
    approval.refresh_from_db()
    assert approval.status == "invalidated"
    assert "cancelled_no_effect" in approval.invalidated_reason
    step = _refund_step(run)
    assert step.status == "failed" and step.last_error_class == "cancelled"
    assert world.refunds()["count"] == 0


def test_a_decision_that_arrives_while_the_run_is_still_suspending_is_not_lost(world, approver):
    from approvals import gate as gate_module

    run = world.start_refund()
    real_request = gate_module.DatabaseApprovalGate.request

    def request_and_decide_at_once(self, request):
        approval_id = real_request(self, request)
        # The approver is faster than the worker's suspend commit: the decision
        # finds the run still running and cannot resume it.
        _approve(Approval.objects.get(pk=approval_id), approver)
        return approval_id

    gate_module.DatabaseApprovalGate.request = request_and_decide_at_once
    try:
        assert world.harness.advance(run) == "suspended:waiting_for_approval"
    finally:
        gate_module.DatabaseApprovalGate.request = real_request
    run.refresh_from_db()
    assert run.status == "queued"  # the worker looked again after suspending
    assert world.harness.advance(run) == "finished:completed"
    assert world.refunds()["count"] == 1


def test_refunds_under_the_limit_need_no_approval(world):
    run = world.start_refund(amount=4000)
    assert world.harness.advance(run) == "finished:completed"
    assert not Approval.objects.filter(run=run).exists()
    assert world.refunds() == {"count": 1, "amount": 4000}


def test_a_role_limit_is_per_tenant(world, tenant, other_tenant, make_operator):
    from approvals.policy import approver_problem

    user = make_operator(tenant, "approver", username="bo")
    group = Group.objects.get(name="approver")
    ApprovalAuthority.objects.create(
        tenant=other_tenant, group=group, currency="eur", max_amount=None
    )
    assert approver_problem(user, tenant, 100, "eur") == "you have no approval authority in EUR"
    ApprovalAuthority.objects.create(tenant=tenant, group=group, currency="eur", max_amount=100)
    assert approver_problem(user, tenant, 100, "eur") is None
    assert "above the role's limit of 1.00 EUR" in approver_problem(user, tenant, 101, "eur")


def test_a_role_that_lost_only_the_approve_permission_no_longer_authorises(world, approver):
    from django.contrib.auth.models import Permission

    run, approval = _approved(world, approver)
    Group.objects.get(name="approver").permissions.remove(
        Permission.objects.get(codename="decide_approvals")
    )  # the role's authority row stays
    _assert_invalidated_and_asked_again(world, run, approval, "does not allow deciding")
    assert world.refunds()["count"] == 0


def test_an_approval_of_another_tenant_fails_even_when_its_approver_is_that_tenants(
    world, approver, other_tenant
):
    run, approval = _approved(world, approver)
    # Everything about the approver holds for the approval's tenant; only the run's
    # tenant differs, and that alone must refuse the send.
    Approval.objects.filter(pk=approval.pk).update(tenant=other_tenant)
    approver.operator.tenant = other_tenant
    approver.operator.save()
    ApprovalAuthority.objects.create(
        tenant=other_tenant,
        group=Group.objects.get(name="approver"),
        currency="eur",
        max_amount=None,
    )
    _assert_invalidated_and_asked_again(world, run, approval, "another tenant")
    assert world.refunds()["count"] == 0
