"""Approvals that expire, are requested again, or whose wake-up was lost: the sweeper's part."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns.models import Run
from agentruns.sweeper import sweep
from approvals.models import Approval
from approvals.services import DecisionConflict, approval_decide, approval_rerequest

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _sweep():
    pushed: list[str] = []
    report = sweep(owner="sweeper-test", push=pushed.append)
    return report, pushed


def _waiting(world):
    run = world.start_refund()
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    return run, world.waiting_approval(run)


def _lapse(approval) -> None:
    Approval.objects.filter(pk=approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


def test_the_sweeper_expires_an_approval_and_the_run_stays_visibly_waiting(world):
    run, approval = _waiting(world)
    _lapse(approval)
    report, pushed = _sweep()
    assert report.approvals_expired == 1 and pushed == []
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.status == "expired"
    assert run.status == "waiting_for_approval"
    assert run.events.filter(type="approval_expired", step_id=approval.step_id).exists()
    # Nothing more happens by itself: a second pass changes nothing.
    report, pushed = _sweep()
    assert report.approvals_expired == 0 and pushed == []
    assert world.harness.advance(run) == "not_runnable"


def test_an_expired_approval_cannot_be_decided(world, approver):
    _run, approval = _waiting(world)
    _lapse(approval)  # past its time, not yet marked by the sweeper
    with pytest.raises(DecisionConflict, match="expired"):
        approval_decide(
            approval=approval, user=approver, decision="approve", seen_args_hash=approval.args_hash
        )
    approval.refresh_from_db()
    assert approval.status == "pending" and approval.decided_by is None


def test_requesting_again_reads_the_resource_afresh_and_asks_anew(
    world, approver, make_operator, tenant
):
    run, approval = _waiting(world)
    _lapse(approval)
    _sweep()
    operator = make_operator(tenant, "operator", username="olga")
    approval.refresh_from_db()
    approval_rerequest(approval=approval, user=operator)
    run.refresh_from_db()
    assert run.status == "queued"
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    fresh = world.waiting_approval(run)
    assert fresh.replaces_id == approval.pk
    assert "the earlier request expired" in fresh.changes
    assert fresh.expires_at > timezone.now()
    with pytest.raises(DecisionConflict):
        approval_rerequest(approval=Approval.objects.get(pk=approval.pk), user=operator)
    approval_decide(
        approval=fresh, user=approver, decision="approve", seen_args_hash=fresh.args_hash
    )
    assert world.harness.advance(run) == "finished:completed"
    assert world.refunds()["count"] == 1


def test_a_decision_whose_wake_up_was_lost_is_picked_up_by_the_sweeper(world, approver):
    run, approval = _waiting(world)
    approval_decide(
        approval=approval, user=approver, decision="approve", seen_args_hash=approval.args_hash
    )
    # As if the process had died between the decision's commit and the run's wake-up.
    Run.objects.filter(pk=run.id).update(status="waiting_for_approval", enqueued_at=None)
    report, pushed = _sweep()
    assert report.resumed == [str(run.id)] and pushed == [str(run.id)]
    run.refresh_from_db()
    assert run.status == "queued"
    assert _sweep()[0].resumed == []
    assert world.harness.advance(run) == "finished:completed"
    assert world.refunds()["count"] == 1


def test_a_pending_approval_is_not_touched_by_the_sweeper(world):
    _run, approval = _waiting(world)
    report, pushed = _sweep()
    assert report.approvals_expired == 0 and report.resumed == [] and pushed == []
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_an_expired_approval_of_a_finished_run_is_not_asked_again(world, make_operator, tenant):
    run, approval = _waiting(world)
    _lapse(approval)
    _sweep()
    world.harness.engine.request_cancel(run.id, by="user:ops")
    operator = make_operator(tenant, "operator", username="olga")
    approval.refresh_from_db()
    with pytest.raises(DecisionConflict, match="still waiting"):
        approval_rerequest(approval=approval, user=operator)
    assert Run.objects.get(pk=run.id).status == "cancelled_no_effect"
