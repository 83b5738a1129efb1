"""Cancel: an idle run ends now; a running one at its next step boundary; effects are kept."""

from __future__ import annotations

import pytest

from agentruns.models import Run
from agentruns.runtime import CancelRefused, faults

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancelling_a_queued_run_ends_it_with_no_effect(harness, provider):
    run = harness.start("flow")
    run = harness.engine.request_cancel(run.id, by="operator:ann")
    assert run.status == "cancelled_no_effect"
    assert run.cancel_requested_by == "operator:ann"
    assert "cancelled by operator:ann" in run.outcome_detail
    assert harness.advance(run) == "not_runnable"
    assert provider.calls["lookup_order"] == 0


def test_cancelling_a_sleeping_run_ends_it_at_once(harness, provider):
    run = harness.start("flow", {"sleep": 3600})
    assert harness.advance(run) == "suspended:sleeping"
    run = harness.engine.request_cancel(run.id, by="ann")
    assert run.status == "cancelled_no_effect"
    assert run.finished_at is not None
    assert provider.calls["charge"] == 0


def test_a_cancel_during_an_effect_in_flight_keeps_the_effects_record(harness, provider):
    run = harness.start("support", {"scenario": "refund"})
    provider.hooks["charge"] = lambda: harness.engine.request_cancel(run.id, by="ann")
    assert harness.advance(run) == "finished:cancelled_after_irreversible_effect"
    run.refresh_from_db()
    step = run.steps.get(name="charge")
    assert step.status == "succeeded"
    assert step.provider_reference == "ch_1"
    assert run.status == "cancelled_after_irreversible_effect"
    assert provider.effect_count() == 1


def test_a_running_run_stops_at_its_next_step_boundary(harness, provider):
    engine = harness.build()
    run = harness.start("flow")
    engine.faults.arm(
        faults.AFTER_RESULT_RECORDED,
        lambda: harness.engine.request_cancel(run.id, by="ann"),
        step_name="lookup_order",
    )
    assert engine.advance(run.id) == "finished:cancelled_no_effect"
    assert provider.calls["charge"] == 0


def test_cancel_waits_for_an_interrupted_effect_to_be_settled(harness, provider):
    run = harness.start("support", {"scenario": "refund"})
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "charge")
    run = harness.engine.request_cancel(run.id, by="ann")
    # The charge may have happened: the run is handed back to settle it first.
    assert run.status == "queued"
    assert harness.enqueued[-1] == run.id
    assert harness.advance(run) == "finished:cancelled_after_irreversible_effect"
    assert provider.effect_count() == 1


def test_a_rate_limited_effect_that_never_got_through_is_closed_by_cancel(harness, provider):
    provider.script["charge"] = ["busy"]
    run = harness.start("flow")
    harness.advance(run)
    run = harness.engine.request_cancel(run.id, by="ann")
    assert run.status == "cancelled_no_effect"
    assert run.steps.get(name="charge").status == "failed"


def test_cancel_is_refused_while_an_effect_is_unknown(harness, provider):
    provider.script["send_email"] = ["fail_after"]
    run = harness.start("mailer")
    harness.advance(run)
    with pytest.raises(CancelRefused, match="settle it before cancelling"):
        harness.engine.request_cancel(run.id, by="ann")
    assert Run.objects.get(pk=run.id).cancel_requested_at is None


def test_cancel_is_refused_for_a_finished_run(harness):
    run = harness.start("flow")
    harness.advance(run)
    with pytest.raises(CancelRefused, match="already ended as completed"):
        harness.engine.request_cancel(run.id, by="ann")


def test_a_blocked_run_can_be_cancelled(harness):
    run = harness.start("flow")
    Run.objects.filter(pk=run.id).update(status="blocked", outcome_detail="version gone")
    assert harness.engine.request_cancel(run.id, by="ann").status == "cancelled_no_effect"
