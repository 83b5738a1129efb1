"""Unknown effects become cases; lookups and operators settle them; the provider's own
records decide whether the tests pass."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agentruns.models import Run, Step
from agentruns.runtime import faults
from agentruns.runtime.store import Store
from agentruns.runtime.writes import NOW, Event, Json, StepUpdate
from agentruns.services import step_settle
from agentruns.sweeper import sweep
from approvals.models import Approval, ApprovalAuthority
from approvals.services import approval_decide
from reconciliation.models import ReconciliationCase
from reconciliation.services import (
    CaseConflict,
    CaseRefused,
    _case_guard,
    case_choices,
    case_lookup_now,
    case_record_lookup,
    case_resolve,
    newest_lookup,
)
from tests.harness import AMOUNT, resolve_as_seen, run_task_inline

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _lost_reply_without_lookup(world):
    """The provider refunds and the reply is lost, every time; its listing is down."""
    world.sandbox.arm("drop_after_commit", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    assert run.status == "effect_unknown_reconciliation_required"
    return run


def test_a_lost_reply_with_no_lookup_opens_one_case_holding_the_intended_action(world):
    run = _lost_reply_without_lookup(world)
    step = Step.objects.get(run=run, name="issue_refund")
    case = ReconciliationCase.objects.get(run=run)
    assert case.step_id == step.pk and case.is_open
    assert case.tool == "issue_refund" and case.provider == "payments (Stripe API)"
    assert case.effect_key == step.effect_key
    assert case.args == step.input and case.request == step.request
    assert case.amount == AMOUNT and case.currency == "eur"
    assert case.can_look_up and "lookup" in case.recovery
    assert case.next_lookup_at is not None
    assert world.refunds()["count"] == 1  # it did happen; nobody heard
    # Advancing the run changes nothing: a person (or a lookup) must settle it.
    assert world.harness.advance(run) == "not_runnable"
    assert ReconciliationCase.objects.filter(run=run).count() == 1


def test_an_operator_records_it_happened_and_the_run_completes_with_one_refund(world, reconciler):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    world.clear_faults()
    [refund] = world.listed_refunds()
    case_record_lookup(
        case=case,
        user=reconciler,
        outcome="succeeded",
        provider_reference=refund.id,
        observed_amount=refund.amount,
        observed_currency=refund.currency,
        note="found it in the payments dashboard",
    )
    resolve_as_seen(case, reconciler, "happened")
    case.refresh_from_db()
    assert case.status == "resolved" and case.resolution == "happened"
    assert case.resolved_by == "user:rita"
    assert refund.id in case.outcome_summary
    run.refresh_from_db()
    assert run.status == "queued"
    assert world.harness.advance(run) == "finished:completed"
    step = Step.objects.get(run=run, name="issue_refund")
    assert step.status == "succeeded" and step.provider_reference == refund.id
    assert world.refunds() == {"count": 1, "amount": AMOUNT}
    run.refresh_from_db()
    assert refund.id in run.output["reply"]


def test_did_not_happen_then_retry_makes_exactly_one_refund(world, reconciler):
    # A 500 before anything happened, every time, and no listing: nobody can tell.
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    assert run.status == "effect_unknown_reconciliation_required"
    assert world.refunds()["count"] == 0
    case = world.case_of(run)
    world.clear_faults()
    case_record_lookup(
        case=case, user=reconciler, outcome="not_found", note="no refund in the dashboard"
    )
    resolve_as_seen(case, reconciler, "retry")
    case.refresh_from_db()
    assert case.resolution == "retry" and case.retries == 1
    assert world.harness.advance(run) == "finished:completed"
    step = Step.objects.get(run=run, name="issue_refund")
    assert step.effect_key == case.effect_key  # the same key, never a new one
    assert world.refunds() == {"count": 1, "amount": AMOUNT}
    assert world.sandbox.stats()["refunds"]["by_idempotency_key"] == {case.effect_key: 1}


def test_did_not_happen_then_cancel_makes_none_and_says_so(world, reconciler):
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    case = world.case_of(run)
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="not there")
    resolve_as_seen(case, reconciler, "cancel")
    run.refresh_from_db()
    assert run.status == "cancelled_no_effect"
    assert Step.objects.get(run=run, name="issue_refund").status == "failed"
    assert world.refunds()["count"] == 0


def test_a_resolution_needs_the_evidence_it_names(world, reconciler):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    choices = {c.resolution: c for c in case_choices(case)}
    assert not choices["happened"].allowed and "found it" in choices["happened"].why_not
    assert not choices["cancel"].allowed
    with pytest.raises(CaseRefused, match="not possible now"):
        resolve_as_seen(case, reconciler, "happened")
    with pytest.raises(CaseRefused, match="evidence"):
        case_record_lookup(case=case, user=reconciler, outcome="not_found", note=" ")
    with pytest.raises(CaseRefused, match="reference"):
        case_record_lookup(case=case, user=reconciler, outcome="succeeded", note="saw it")
    case.refresh_from_db()
    assert case.is_open and case.lookups.filter(method="operator").count() == 0


def test_newer_evidence_refuses_a_resolution_made_on_older_evidence(world, reconciler):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    first = case_record_lookup(
        case=case, user=reconciler, outcome="not_found", note="looked at 10:00"
    )
    case.refresh_from_db()
    seen_version = case.version
    case_record_lookup(
        case=case,
        user=reconciler,
        outcome="succeeded",
        provider_reference="re_late",
        note="it showed up at 10:05",
    )
    with pytest.raises(CaseConflict, match="newer evidence"):
        case_resolve(
            case=case,
            user=reconciler,
            resolution="cancel",
            seen_version=seen_version,
            seen_lookup_id=first.pk,
        )
    run.refresh_from_db()
    assert run.status == "effect_unknown_reconciliation_required"
    assert world.refunds()["count"] == 1


def test_two_operators_resolving_at_once_produce_one_resolution(world, reconciler, make_operator):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    world.clear_faults()
    [refund] = world.listed_refunds()
    lookup = case_record_lookup(
        case=case,
        user=reconciler,
        outcome="succeeded",
        provider_reference=refund.id,
        observed_amount=AMOUNT,
        note="dashboard",
    )
    case.refresh_from_db()
    other = make_operator(case.tenant, "reconciler", username="ravi")
    resolve_as_seen(case, reconciler, "happened")
    with pytest.raises(CaseConflict, match="already resolved"):
        case_resolve(
            case=case,
            user=other,
            resolution="happened",
            seen_version=case.version,
            seen_lookup_id=lookup.pk,
        )
    assert world.harness.advance(run) == "finished:completed"
    assert world.refunds()["count"] == 1


def test_a_late_answer_and_a_resolution_arriving_together_have_one_winner(world, reconciler):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="not listed yet")
    case.refresh_from_db()
    step = Step.objects.get(run=run, name="issue_refund")
    world.clear_faults()
    [refund] = world.listed_refunds()
    barrier = threading.Barrier(2)
    results: dict[str, object] = {}

    def late_worker() -> None:
        try:
            barrier.wait()
            # A stalled worker's reply finally arrives: it records the fact.
            results["fact"] = Store().record_fact(
                run.id,
                StepUpdate(
                    step.pk,
                    {
                        "status": "succeeded",
                        "completed_at": NOW,
                        "provider_reference": refund.id,
                        "result": Json({"id": refund.id, "amount": AMOUNT}),
                    },
                    only_if_status=("planned", "running", "unknown"),
                ),
                Event("step_succeeded", step.step_id),
            )
        finally:
            connection.close()

    def operator() -> None:
        try:
            barrier.wait()
            results["resolution"] = resolve_as_seen(case, reconciler, "cancel")
        except CaseConflict as exc:
            results["resolution"] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=late_worker), threading.Thread(target=operator)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    step.refresh_from_db()
    case.refresh_from_db()
    run.refresh_from_db()
    if results["fact"]:
        # The answer won: the step is what the provider said; the resolution was
        # refused, and the run is back with the workers, not stranded.
        assert isinstance(results["resolution"], CaseConflict)
        assert step.status == "succeeded"
        assert case.resolution == "settled_by_provider"
        assert run.status == "queued"
    else:
        # The resolution won: the late answer was not written over it, and its
        # event says it was ignored.
        assert not isinstance(results["resolution"], CaseConflict)
        assert step.status == "failed" and case.resolution == "cancel"
        assert run.status == "cancelled_no_effect"
        assert run.events.filter(type="late_answer_ignored", step_id=step.step_id).exists()
    assert world.refunds()["count"] == 1


def test_the_sweeper_looks_up_again_with_backoff_and_a_found_refund_settles_itself(world):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    ReconciliationCase.objects.filter(pk=case.pk).update(next_lookup_at=timezone.now())
    # The sweeper hands the lookup to a worker; here the worker's task runs at once.
    sweep(owner="sweeper-test", push=lambda run_id: None, enqueue=run_task_inline)
    case.refresh_from_db()
    assert case.is_open and case.lookup_failures == 1
    assert case.lookup_claim == "" and case.lookup_lease_expires_at is None  # released
    assert case.next_lookup_at > timezone.now() + timedelta(seconds=30)
    assert newest_lookup(case).outcome == "inconclusive"
    world.clear_faults()  # the provider's listing is back
    ReconciliationCase.objects.filter(pk=case.pk).update(next_lookup_at=timezone.now())
    sweep(owner="sweeper-test", push=lambda run_id: None, enqueue=run_task_inline)
    case.refresh_from_db()
    assert case.status == "resolved" and case.resolution == "happened"
    assert case.resolved_by == "system"
    assert world.harness.advance(run) == "finished:completed"
    assert world.refunds() == {"count": 1, "amount": AMOUNT}


def test_look_up_now_with_an_inconclusive_answer_keeps_the_case_open(world, reconciler):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    lookup = case_lookup_now(case=case, actor="user:rita")
    assert lookup.outcome == "inconclusive" and "error" in lookup.evidence
    case.refresh_from_db()
    assert case.is_open
    run.refresh_from_db()
    assert run.status == "effect_unknown_reconciliation_required"


def test_it_happened_differently_ends_failed_after_effect_and_says_what_remains(world, reconciler):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    case_record_lookup(
        case=case,
        user=reconciler,
        outcome="differently",
        provider_reference="re_partial",
        observed_amount=500,
        observed_currency="eur",
        note="the dashboard shows 5.00, not 7.00",
    )
    choice = {c.resolution: c for c in case_choices(case)}["differently"]
    assert choice.allowed and "5.00 EUR instead of 7.00 EUR" in choice.summary
    assert "Failed after an effect" in choice.summary
    resolve_as_seen(case, reconciler, "differently")
    run.refresh_from_db()
    assert run.status == "failed_after_effect"
    case.refresh_from_db()
    assert "5.00 EUR" in case.outcome_summary and "remains" in case.outcome_summary


def test_an_email_lost_after_acceptance_is_settled_only_by_a_person(world, reconciler):
    run = world.start(email_customer=True)
    world.harness.interrupt(run, faults.AFTER_CALL_RETURNED, "send_customer_email")
    assert world.harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    case = world.case_of(run, "send_customer_email")
    assert not case.can_look_up and case.next_lookup_at is None
    assert case.provider == "mail (SMTP)"
    with pytest.raises(CaseRefused, match="no lookup"):
        case_lookup_now(case=case)
    sweep(owner="sweeper-test", push=lambda run_id: None)  # nothing automatic happens
    case.refresh_from_db()
    assert case.is_open and not case.lookups.exists()
    case_record_lookup(
        case=case,
        user=reconciler,
        outcome="succeeded",
        provider_reference="msg in the mail log",
        note="the mail server logged it as delivered",
    )
    resolve_as_seen(case, reconciler, "happened")
    assert world.harness.advance(run) == "finished:completed"
    assert world.sandbox.stats()["messages"]["total"] == 1


def test_an_email_is_sent_again_only_on_an_explicit_retry(world, reconciler):
    run = world.start(email_customer=True)
    world.harness.interrupt(run, faults.AFTER_CALL_RETURNED, "send_customer_email")
    world.harness.advance(run)
    case = world.case_of(run, "send_customer_email")
    case_record_lookup(
        case=case, user=reconciler, outcome="not_found", note="the mail log has nothing"
    )
    resolve_as_seen(case, reconciler, "retry")
    assert world.harness.advance(run) == "finished:completed"
    assert world.sandbox.stats()["messages"]["total"] == 2  # what the operator chose


def test_cancelling_after_a_refund_says_an_irreversible_effect_remains(world, reconciler):
    run = world.start(email_customer=True)
    world.harness.interrupt(run, faults.AFTER_CALL_RETURNED, "send_customer_email")
    world.harness.advance(run)
    case = world.case_of(run, "send_customer_email")
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="nothing logged")
    resolve_as_seen(case, reconciler, "cancel")
    run.refresh_from_db()
    assert run.status == "cancelled_after_irreversible_effect"
    assert world.sandbox.stats()["messages"]["total"] == 1
    assert world.refunds()["count"] == 1


def test_a_retry_of_an_approved_refund_reuses_its_approval_while_it_still_holds(
    world, reconciler, make_operator, tenant
):
    from django.contrib.auth.models import Group

    approver = make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.create(
        tenant=tenant, group=Group.objects.get(name="approver"), currency="eur", max_amount=None
    )
    run = world.start(amount=6000)
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = Approval.objects.get(run=run)
    approval_decide(
        approval=approval, user=approver, decision="approve", seen_args_hash=approval.args_hash
    )
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(run)
    assert run.status == "effect_unknown_reconciliation_required"
    case = world.case_of(run)
    assert case.approval_id == approval.pk
    world.clear_faults()
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="nothing there")
    resolve_as_seen(case, reconciler, "retry")
    assert world.harness.advance(run) == "finished:completed"
    approval.refresh_from_db()
    assert approval.status == "consumed"
    assert Approval.objects.filter(run=run).count() == 1
    [refund] = world.listed_refunds()
    assert refund.metadata["holdfast_approval_id"] == str(approval.pk)


def test_a_crash_right_after_the_suspend_leaves_no_case_missing(world):
    run = _lost_reply_without_lookup(world)
    ReconciliationCase.objects.filter(run=run).delete()
    report = sweep(owner="sweeper-test", push=lambda run_id: None)
    assert report.cases["opened"] == 1
    assert ReconciliationCase.objects.filter(run=run, status="open").count() == 1


def test_a_late_answer_recorded_by_a_worker_closes_the_case_and_frees_the_run(world):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    step = Step.objects.get(run=run, name="issue_refund")
    Store().record_fact(
        run.id,
        StepUpdate(
            step.pk,
            {"status": "succeeded", "completed_at": NOW, "provider_reference": "re_late"},
            only_if_status=("unknown",),
        ),
        Event("step_succeeded", step.step_id),
    )
    pushed: list[str] = []
    report = sweep(owner="sweeper-test", push=pushed.append)
    assert report.cases["settled"] == 1
    case.refresh_from_db()
    assert case.resolution == "settled_by_provider"
    assert newest_lookup(case).method == "late_answer"
    run = Run.objects.get(pk=run.id)
    assert run.status == "queued" and pushed == [str(run.id)]


def test_refused_resolutions_never_add_up_to_a_crash_loop(world, reconciler):
    run = _lost_reply_without_lookup(world)
    case = world.case_of(run)
    case_record_lookup(case=case, user=reconciler, outcome="not_found", note="not listed")
    case.refresh_from_db()
    # A resolution made on a version that has moved on: the engine's guard refuses it.
    stale = _case_guard(
        case,
        seen_version=case.version - 1,
        resolution="cancel",
        by="user:rita",
        note="",
        summary="",
    )
    before = Run.objects.get(pk=run.id).claim_count
    for _ in range(8):
        outcome = step_settle(
            run.id, case.step_id, resolution="cancel", by="user:rita", guard=stale
        )
        assert outcome == "refused"
    run = Run.objects.get(pk=run.id)
    assert run.status == "effect_unknown_reconciliation_required"
    assert run.claim_count == before and run.lease_owner == ""
    resolve_as_seen(case, reconciler, "cancel")
    run.refresh_from_db()
    assert run.status == "cancelled_no_effect"
