"""Interleavings of workers, operators, approvals and late answers around one refund:
each once produced a second effect, a stranded run or a false state."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from agentruns.models import Run, Step
from agentruns.runtime import faults
from agentruns.runtime.store import Store
from agentruns.runtime.writes import NOW, Event, Json, StepUpdate
from agentruns.sweeper import sweep
from approvals.models import Approval, ApprovalAuthority
from approvals.services import approval_decide
from reconciliation.services import (
    CaseConflict,
    CaseRefused,
    case_choices,
    case_record_lookup,
    newest_lookup,
)
from support import adapters
from tests.harness import resolve_as_seen

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def approver(tenant, make_operator):
    # Refunds above 10.00 need an approver in these tests.
    tenant.agent_config = {"refund_support": {"approvals": {"auto_approve_up_to": {"eur": 1000}}}}
    tenant.save()
    user = make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.create(
        tenant=tenant, group=Group.objects.get(name="approver"), currency="eur", max_amount=None
    )
    return user


def _approved_run(world, approver, amount=3000):
    run = world.start(amount=amount)
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = Approval.objects.get(run=run, status="pending")
    approval_decide(
        approval=approval, user=approver, decision="approve", seen_args_hash=approval.args_hash
    )
    return run, approval


def test_a_retry_is_not_offered_on_evidence_that_cannot_tell(world, reconciler):
    world.sandbox.arm("drop_after_commit", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    case = world.case_of(run)
    # Within the key window, on an inconclusive lookup: resending could not refund
    # twice today, but an approval asked again could send it after the window.
    case_record_lookup(
        case=case, user=reconciler, outcome="succeeded", provider_reference="re_x", note="seen"
    )
    case.refresh_from_db()
    choices = {c.resolution: c for c in case_choices(case)}
    assert not choices["retry"].allowed and not choices["cancel"].allowed
    with pytest.raises(CaseRefused):
        resolve_as_seen(case, reconciler, "retry")
    assert world.refunds()["count"] == 1


def test_a_stalled_workers_absent_lookup_never_turns_a_send_in_flight_back_to_planned(
    world, approver, monkeypatch
):
    harness = world.harness
    run, _approval = _approved_run(world, approver)
    world.sandbox.arm("error_before", count=1)
    assert harness.advance(run) == "suspended:waiting_for_retry"
    harness.backdate_sends(run, 2 * 86400)  # past the key window: recovery looks up
    harness.make_due(run)
    real_find = adapters.refund_find
    calls = []

    def find(account, **kwargs):
        calls.append(kwargs)
        answer = real_find(account, **kwargs)  # absent, read by worker A
        if len(calls) == 1:
            # A stalls here past its lease; B takes over, finds it absent too,
            # sends under the approval and dies after the provider refunded.
            Run.objects.filter(pk=run.id).update(lease_expires_at=run.created_at)
            other = harness.build()

            def die():
                raise SystemExit("worker B killed")

            other.faults.arm(faults.AFTER_CALL_RETURNED, die, step_name="issue_refund")
            with pytest.raises(SystemExit):
                other.advance(run.id)
        return answer

    monkeypatch.setattr(adapters, "refund_find", find)
    assert harness.advance(run) == "lease_lost"  # A's stale "absent" decides nothing
    step = Step.objects.get(run=run, name="issue_refund")
    assert step.status == "running" and step.in_flight
    assert list(Approval.objects.filter(run=run).values_list("status", flat=True)) == ["consumed"]
    assert world.refunds() == {"count": 1, "amount": 3000}
    monkeypatch.setattr(adapters, "refund_find", real_find)
    harness.expire_lease(run)
    # B's send is settled by a lookup (past the window): found, never sent again.
    run = world.until_unknown(run)
    assert run.status == "completed"
    assert world.refunds() == {"count": 1, "amount": 3000}


def test_a_decision_during_a_cancel_neither_fails_the_cancel_nor_sends(world, approver):
    harness = world.harness
    run = world.start(amount=3000)
    assert harness.advance(run) == "suspended:waiting_for_approval"
    approval = Approval.objects.get(run=run, status="pending")
    engine = harness.engine
    real_claim = engine._claim

    def claim(run_, owner, **kwargs):
        claimed = real_claim(run_, owner, **kwargs)
        if kwargs.get("for_cancel"):
            # The approver clicks while the canceller holds the run.
            approval_decide(
                approval=approval,
                user=approver,
                decision="approve",
                seen_args_hash=approval.args_hash,
            )
        return claimed

    engine._claim = claim
    try:
        run = engine.request_cancel(run.id, by="user:ops")
    finally:
        engine._claim = real_claim
    assert run.status == "cancelled_no_effect"
    step = Step.objects.get(run=run, name="issue_refund")
    assert step.status == "failed" and step.last_error_class == "cancelled"
    assert list(Approval.objects.filter(run=run).values_list("status", flat=True)) == [
        "invalidated"
    ]
    assert world.refunds()["count"] == 0


def test_send_it_again_sends_nothing_once_a_cancel_was_requested(world, reconciler):
    world.sandbox.arm("error_before", count=50)
    world.lookups_unavailable()
    run = world.start()
    while run.status != "waiting_for_retry":
        world.harness.advance(run)
        run.refresh_from_db()
    run = world.harness.engine.request_cancel(run.id, by="user:ops")
    assert run.cancel_requested_at is not None
    run = world.until_unknown(run)
    assert run.status == "effect_unknown_reconciliation_required"
    case = world.case_of(run)
    world.clear_faults()
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="nothing")
    resolve_as_seen(case, reconciler, "retry")
    world.harness.advance(run)
    run.refresh_from_db()
    assert run.status == "cancelled_no_effect"
    assert world.refunds()["count"] == 0


def test_a_rate_limit_on_the_operators_resend_waits_and_tries_again(world, reconciler):
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    step = Step.objects.get(run=run, name="issue_refund")
    # A day later: past the key window and the step's own retry deadline.
    Step.objects.filter(pk=step.pk).update(
        first_sent_at=step.first_sent_at - timedelta(days=2),
        last_sent_at=step.last_sent_at - timedelta(days=2),
        retry_deadline=timezone.now() - timedelta(days=2),
    )
    case = world.case_of(run)
    world.clear_faults()
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="none")
    resolve_as_seen(case, reconciler, "retry")
    world.sandbox.arm("rate_limit", count=1)
    assert world.harness.advance(run) == "suspended:waiting_for_retry"
    world.harness.make_due(run)
    assert world.harness.advance(run) == "finished:completed"
    assert world.refunds() == {"count": 1, "amount": 700}


def test_a_reopened_case_weighs_only_evidence_about_the_new_send(world, reconciler):
    run = world.start(email_customer=True)
    world.harness.interrupt(run, faults.AFTER_CALL_RETURNED, "send_customer_email")
    world.harness.advance(run)
    case = world.case_of(run, "send_customer_email")
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="log empty")
    resolve_as_seen(case, reconciler, "retry")
    # The resend reaches the mail server; the worker dies before recording it.
    world.harness.interrupt(run, faults.AFTER_CALL_RETURNED, "send_customer_email")
    assert world.harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    case.refresh_from_db()
    assert case.is_open and case.reopened == 1 and newest_lookup(case) is None
    assert not any(c.allowed for c in case_choices(case))
    with pytest.raises(CaseRefused):
        resolve_as_seen(case, reconciler, "cancel")
    assert world.sandbox.stats()["messages"]["total"] == 2


def test_a_late_answer_that_beats_a_resolution_frees_the_run_at_once(world, reconciler):
    world.sandbox.arm("drop_after_commit", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    case = world.case_of(run)
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="not listed yet")
    step = Step.objects.get(run=run, name="issue_refund")
    world.clear_faults()
    [refund] = world.listed_refunds()
    Store().record_fact(
        run.id,
        StepUpdate(
            step.pk,
            {
                "status": "succeeded",
                "completed_at": NOW,
                "provider_reference": refund.id,
                "result": Json({"id": refund.id, "amount": 700, "currency": "eur"}),
            },
            only_if_status=("planned", "running", "unknown"),
        ),
        Event("step_succeeded", step.step_id),
    )
    with pytest.raises(CaseConflict, match="provider's own answer"):
        resolve_as_seen(case, reconciler, "cancel")
    case.refresh_from_db()
    assert case.resolution == "settled_by_provider"
    assert Run.objects.get(pk=run.id).status == "queued"  # not stranded
    assert world.harness.advance(run) == "finished:completed"
    assert world.refunds()["count"] == 1


def test_a_late_answer_after_an_operators_cancel_is_not_written_over_it(world, reconciler):
    world.sandbox.arm("drop_after_commit", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    case = world.case_of(run)
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="wrongly")
    resolve_as_seen(case, reconciler, "cancel")
    step = Step.objects.get(run=run, name="issue_refund")
    written = Store().record_fact(
        run.id,
        StepUpdate(
            step.pk,
            {"status": "succeeded", "completed_at": NOW},
            only_if_status=("planned", "running", "unknown"),
        ),
        Event("step_succeeded", step.step_id),
    )
    assert not written
    step.refresh_from_db()
    assert step.status == "failed"
    newest = run.events.filter(step_id=step.step_id).order_by("-id").first()
    assert newest.type == "late_answer_ignored" and newest.payload["answer"] == "step_succeeded"


def test_it_happened_without_an_amount_means_as_asked(world, reconciler):
    world.sandbox.arm("drop_after_commit", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    case = world.case_of(run)
    world.clear_faults()
    [refund] = world.listed_refunds()
    case_record_lookup(
        case=case,
        user=reconciler,
        outcome="succeeded",
        provider_reference=refund.id,
        note="seen in the dashboard",
    )
    resolve_as_seen(case, reconciler, "happened")
    assert world.harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.output["reply"] == f"Refunded 7.00 EUR as {refund.id}."


def test_the_sweeper_frees_a_run_whose_case_closed_before_it_was_requeued(world):
    world.sandbox.arm("drop_after_commit", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    step = Step.objects.get(run=run, name="issue_refund")
    # As if the process died between closing the case and freeing the run.
    Step.objects.filter(pk=step.pk).update(status="succeeded")
    world.case_of(run).__class__.objects.filter(run=run).update(status="resolved")
    pushed: list[str] = []
    report = sweep(owner="sweeper-test", push=pushed.append)
    assert report.cases["freed"] == 1 and pushed == [str(run.id)]
    assert Run.objects.get(pk=run.id).status == "queued"
