"""Effects: one key before the send, one table for what came back, recovery by declaration."""

from __future__ import annotations

from datetime import timedelta

import pytest

from agentruns.models import Run, Step
from agentruns.runtime import faults
from agentruns.runtime.effects import make_effect_key

pytestmark = pytest.mark.django_db(transaction=True)


def _charge_step(run) -> Step:
    return Step.objects.get(run=run, kind="tool", name__in=["charge", "charge_lookup_only"])


def test_the_effect_key_is_committed_before_the_provider_is_called(harness, provider):
    seen = {}

    def inspect():
        step = Step.objects.get(name="charge")
        seen.update(status=step.status, key=step.effect_key, in_flight=step.in_flight)

    provider.hooks["charge"] = inspect
    run = harness.start("flow")
    harness.advance(run)
    step = _charge_step(run)
    assert seen == {"status": "running", "key": step.effect_key, "in_flight": True}
    assert step.effect_key == make_effect_key(str(run.id), step.step_id, step.input)


def test_a_lost_reply_is_recovered_by_resending_the_same_key(harness, provider):
    """The provider executed, the worker died before recording: the same key replays it."""
    run = harness.start("flow")
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "charge")
    step = _charge_step(run)
    assert step.status == "running" and step.in_flight
    key = step.effect_key
    assert harness.advance(run) == "finished:completed"
    step.refresh_from_db()
    assert step.status == "succeeded"
    assert step.effect_key == key
    assert step.attempts == 2
    assert step.ambiguous_attempts == 1
    assert provider.calls["charge"] == 2
    assert provider.effect_count() == 1
    assert [e["action"] for e in step.recovery_log][:3] == ["send", "resend", "answer"]


def test_a_timeout_after_execution_becomes_unknown_then_settles_by_resend(harness, provider):
    provider.script["charge"] = ["fail_after"]
    run = harness.start("flow")
    assert harness.advance(run) == "suspended:waiting_for_retry"
    step = _charge_step(run)
    assert step.status == "unknown"
    assert step.last_error_class == "timeout"
    run.refresh_from_db()
    assert run.next_attempt_at is not None
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    assert provider.effect_count() == 1
    assert Run.objects.get(pk=run.id).output["charge"]["id"] == "ch_1"


def test_a_definite_refusal_fails_the_step_and_the_agent_sees_the_reason(harness, provider):
    provider.script["charge"] = ["refuse"]
    run = harness.start("flow")
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.output == {
        "charged": False,
        "charge": None,
        "error": "amount exceeds the remaining balance",
    }
    step = _charge_step(run)
    assert step.status == "failed"
    assert step.last_error_class == "invalid_request"
    assert provider.effect_count() == 0


def test_a_429_keeps_the_step_running_and_waits_at_least_retry_after(harness, provider):
    provider.script["charge"] = ["busy"]
    run = harness.start("flow")
    assert harness.advance(run) == "suspended:waiting_for_retry"
    run.refresh_from_db()
    step = _charge_step(run)
    assert step.status == "running" and not step.in_flight
    assert step.provider_retry_after == 2.0
    wait = (run.next_attempt_at - step.last_sent_at).total_seconds()
    assert wait >= 2.0
    # A duplicate wake-up before the due time does not skip the backoff.
    assert harness.advance(run) == "not_claimed"
    assert provider.calls["charge"] == 1
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    step.refresh_from_db()
    assert step.attempts == 2
    assert provider.effect_count() == 1


def test_a_manual_effect_interrupted_mid_call_waits_for_an_operator(harness, provider):
    run = harness.start("mailer")
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "send_email")
    assert harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    run.refresh_from_db()
    assert run.status == "effect_unknown_reconciliation_required"
    step = Step.objects.get(run=run, name="send_email")
    assert step.status == "unknown"
    assert step.recovery_log[-1]["action"] == "needs_operator"
    # No second email, whatever wakes the run.
    assert harness.advance(run) == "not_runnable"
    assert provider.calls["send_email"] == 1


def test_a_manual_effect_with_an_ambiguous_answer_is_never_resent(harness, provider):
    provider.script["send_email"] = ["fail_after"]
    run = harness.start("mailer")
    assert harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    assert provider.calls["send_email"] == 1


def test_a_lookup_tool_interrupted_mid_call_is_found_by_lookup(harness, provider):
    run = harness.start("flow", {"tool": "charge_lookup_only"})
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "charge_lookup_only")
    harness.backdate_sends(run, 60)  # the last send can no longer land
    assert harness.advance(run) == "finished:completed"
    step = _charge_step(run)
    assert step.status == "succeeded"
    assert step.provider_reference == "ch_1"
    assert provider.lookups["charge"] == 1
    assert provider.calls["charge"] == 1
    assert provider.effect_count() == 1


def test_a_lookup_waits_until_the_last_send_can_no_longer_land(harness, provider):
    run = harness.start("flow", {"tool": "charge_lookup_only"})
    harness.interrupt(run, faults.AFTER_STEP_RUNNING, "charge_lookup_only")
    assert harness.advance(run) == "suspended:waiting_for_retry"
    assert provider.lookups["charge"] == 0


def test_conclusive_absence_allows_exactly_one_more_send(harness, provider):
    """Interrupted before the call: the lookup proves absence, and the send happens once."""
    run = harness.start("flow", {"tool": "charge_lookup_only"})
    harness.interrupt(run, faults.AFTER_STEP_RUNNING, "charge_lookup_only")
    harness.backdate_sends(run, 60)
    assert harness.advance(run) == "finished:completed"
    step = _charge_step(run)
    assert step.resent_after_absence
    assert provider.lookups["charge"] == 1
    assert provider.calls["charge"] == 1
    assert provider.effect_count() == 1


def test_absent_again_after_the_one_resend_waits_for_a_person(harness, provider):
    run = harness.start("flow", {"tool": "charge_lookup_only"})
    harness.interrupt(run, faults.AFTER_STEP_RUNNING, "charge_lookup_only")
    harness.backdate_sends(run, 60)
    # The lookup proves absence and clears one more send; that worker dies too.
    harness.interrupt(run, faults.AFTER_STEP_RUNNING, "charge_lookup_only")
    harness.backdate_sends(run, 60)
    assert harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    step = _charge_step(run)
    assert step.status == "unknown" and step.resent_after_absence
    assert "absent again" in step.recovery_log[-1]["reason"]
    assert provider.lookups["charge"] == 2
    assert provider.effect_count() == 0


def test_an_unreachable_lookup_leaves_the_effect_unknown(harness, provider):
    run = harness.start("flow", {"tool": "charge_lookup_only"})
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "charge_lookup_only")
    harness.backdate_sends(run, 60)
    provider.lookup_script.append("unreachable")
    assert harness.advance(run) == "suspended:effect_unknown_reconciliation_required"
    step = _charge_step(run)
    assert step.status == "unknown"
    # The case's reason is Holdfast's words; the provider client's own are kept apart,
    # for those who may read them.
    assert step.recovery_log[-1]["reason"] == "the lookup failed: the provider could not be asked"
    assert "payments API unreachable" in step.recovery_log[-2]["error"]
    assert provider.effect_count() == 1


def test_after_the_idempotency_window_the_engine_looks_up_instead_of_resending(harness, provider):
    run = harness.start("flow")
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "charge")
    harness.backdate_sends(run, timedelta(hours=25).total_seconds())
    assert harness.advance(run) == "finished:completed"
    assert provider.lookups["charge"] == 1
    assert provider.calls["charge"] == 1
    assert provider.effect_count() == 1


def test_repeated_ambiguous_answers_end_with_a_lookup(harness, provider):
    provider.script["charge"] = ["fail_before", "fail_before", "fail_before"]
    run = harness.start("flow")
    run = harness.drive(run, max_rounds=3)
    step = _charge_step(run)
    assert provider.calls["charge"] == 3
    assert step.status == "unknown" and step.ambiguous_attempts == 3
    # Before the lookup can mean anything, the last send must be past landing.
    assert run.status == "waiting_for_retry"
    assert provider.lookups["charge"] == 0
    harness.backdate_sends(run, 60)
    run = harness.drive(run)
    step.refresh_from_db()
    # Two resends under the same key, then the lookup proved absence: one more send.
    assert provider.lookups["charge"] == 1
    assert step.resent_after_absence
    assert run.status == "completed"
    assert provider.effect_count() == 1


def test_nothing_that_may_have_taken_effect_reaches_agent_code_as_an_exception(harness, provider):
    provider.script["send_email"] = ["fail_after"]
    run = harness.start("mailer")
    harness.advance(run)
    run.refresh_from_db()
    # The agent never saw an error: the run waits for the effect to be settled.
    assert run.status == "effect_unknown_reconciliation_required"
    assert run.output is None
