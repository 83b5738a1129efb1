"""Marks on a run (retried, recovered, reconciled, compensated) come from what the engine
did to it, written in the commit that records the fact; approvals mark theirs in
tests/approvals/test_approved_mark.py."""

from __future__ import annotations

import pytest

from agentruns.marks import marks_of
from agentruns.models import Run
from agentruns.runtime import Registry, agent, faults
from agentruns.runtime.store import Store
from agentruns.runtime.writes import NOW, Event, StepUpdate
from agentruns.sweeper import sweep
from reconciliation.models import ReconciliationCase
from reconciliation.services import case_record_lookup
from tests.agentruns.runtime import agents
from tests.harness import resolve_as_seen

pytestmark = pytest.mark.django_db(transaction=True)


def _marks(run: Run) -> list[str]:
    run.refresh_from_db()
    return [mark.text for mark in marks_of(run)]


def test_a_run_that_went_straight_through_has_no_mark(harness):
    run = harness.drive(harness.start("flow", {"sleep": 5}))
    assert run.status == "completed"
    assert _marks(run) == []


def test_a_read_that_took_a_second_attempt_marks_the_run_retried(harness, provider):
    provider.script["lookup_order"] = ["fail_before"]
    run = harness.start("flow")
    assert harness.advance(run) == "suspended:waiting_for_retry"
    assert _marks(run) == []  # one attempt so far, failed
    run = harness.drive(run)
    assert run.status == "completed"
    assert run.steps.get(name="lookup_order").attempts == 2
    assert _marks(run) == ["retried"]


def test_an_effect_sent_again_under_its_key_after_a_lost_reply_is_retried(harness, provider):
    provider.script["charge"] = ["fail_after"]
    run = harness.drive(harness.start("flow"))
    assert run.status == "completed"
    assert provider.effect_count() == 1
    assert run.steps.get(name="charge").attempts == 2
    assert _marks(run) == ["retried"]


def test_an_operators_retry_now_marks_the_run_retried(harness, client, tenant, make_operator):
    client.force_login(make_operator(tenant, "operator"))
    run = harness.start("flow", {"sleep": 600})
    harness.advance(run)
    assert _marks(run) == []
    assert client.post(f"/runs/{run.id}/retry").status_code == 302
    assert _marks(run) == ["retried"]
    assert run.events.filter(type="woken").exists()


def test_a_run_taken_over_after_its_worker_died_is_marked_recovered(harness, provider):
    run = harness.start("flow")
    harness.interrupt(run, faults.AFTER_RESULT_RECORDED, "lookup_order")
    # The worker that died claimed a queued run: that was no takeover.
    assert _marks(run) == []
    assert harness.advance(run) == "finished:completed"
    assert provider.calls["lookup_order"] == 1  # replayed, not asked again
    assert _marks(run) == ["recovered"]


def test_a_send_interrupted_by_a_crash_is_recovered_and_retried(harness, provider):
    run = harness.start("flow")
    harness.interrupt(run, faults.AFTER_STEP_RUNNING, "charge")
    run = harness.drive(run)
    assert run.status == "completed"
    assert provider.effect_count() == 1
    assert _marks(run) == ["retried", "recovered"]


def test_a_run_that_only_slept_and_woke_is_not_recovered(harness):
    run = harness.start("flow", {"sleep": 600})
    assert harness.advance(run) == "suspended:sleeping"
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    assert _marks(run) == []


def test_a_failed_run_whose_effects_were_undone_is_marked_compensated(harness, provider):
    run = harness.start("flow", {"fail_after_charge": True})
    assert harness.advance(run) == "finished:compensated"
    assert _marks(run) == ["compensated"]


@agent(name="charge_then_email", version=1, tools=agents.TOOLS)
def charge_then_email(ctx, input):
    ctx.tool("charge", {"order_id": "o-1", "amount": 100})
    ctx.tool("send_email", {"to": "a@example.com", "body": "charged"})
    raise RuntimeError("the agent could not finish")


def test_an_undo_that_leaves_an_effect_behind_is_still_marked_compensated(harness, provider):
    harness.registry = Registry([charge_then_email, *harness.registry._agents.values()])
    harness.engine = harness.build()
    run = harness.start("charge_then_email")
    # The charge is undone; the email has no undo and stays.
    assert harness.advance(run) == "finished:failed_after_effect"
    assert _marks(run) == ["compensated"]


def test_a_failure_with_nothing_to_undo_is_not_marked_compensated(harness, provider):
    provider.script["charge"] = ["refuse"]
    run = harness.start("flow", {"fail_after_charge": True})
    assert harness.advance(run) == "finished:failed_before_effect"
    assert _marks(run) == []


def _unknown_email(harness, provider) -> tuple[Run, ReconciliationCase]:
    """An email whose provider may have sent it: nobody can tell, a case opens."""
    provider.script["send_email"] = ["fail_after"]
    run = harness.start("mailer")
    assert harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    step = run.steps.get(name="send_email")
    return run, ReconciliationCase.objects.get(step_id=step.pk)


def test_a_case_resolved_by_a_person_marks_the_run_reconciled(
    harness, provider, tenant, make_operator
):
    reconciler = make_operator(tenant, "reconciler", username="rita")
    run, case = _unknown_email(harness, provider)
    assert _marks(run) == []
    case_record_lookup(
        case=case,
        user=reconciler,
        outcome="succeeded",
        provider_reference="msg_1",
        note="it is in the mail provider's sent folder",
    )
    resolve_as_seen(case, reconciler, "happened")
    assert _marks(run) == ["reconciled"]
    run = harness.drive(run)
    assert run.status == "completed"
    assert provider.calls["send_email"] == 1  # not sent again
    assert _marks(run) == ["reconciled"]


def test_a_case_closed_by_the_providers_late_answer_marks_the_run_reconciled(harness, provider):
    run, case = _unknown_email(harness, provider)
    step = run.steps.get(name="send_email")
    Store().record_fact(
        run.id,
        StepUpdate(
            step.pk,
            {"status": "succeeded", "completed_at": NOW, "provider_reference": "msg_late"},
            only_if_status=("unknown",),
        ),
        Event("step_succeeded", step.step_id),
    )
    assert _marks(run) == []  # the answer alone decides nothing about the run
    sweep(owner="sweeper-test", push=lambda run_id: None)
    case.refresh_from_db()
    assert case.resolution == "settled_by_provider"
    assert _marks(run) == ["reconciled"]
    assert Run.objects.get(pk=run.id).status == "queued"
