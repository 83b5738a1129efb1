"""A run's evidence holds every fact of what happened: a refund approved and sent, and a
refund nobody could tell about, settled by a person; masked as the pages are."""

from __future__ import annotations

import pytest

from accounts.models import AuditEntry
from accounts.services import audit_record
from agentruns.models import Step
from approvals.models import Approval
from evidence.bundle import EXPORT_ACTION, run_bundle
from tests.harness import ORDER, OVER_LIMIT

# A decision wakes the run through the task queue (its own database on SQLite).
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _step(bundle, name):
    return next(step for step in bundle["steps"] if step["name"] == name)


def test_a_refund_run_gives_the_run_and_every_step_in_order(approved_run):
    bundle = run_bundle(approved_run, provider_error_detail=False)
    shown = bundle["run"]
    assert shown["id"] == str(approved_run.id)
    assert shown["agent"] == f"refund_support@{approved_run.agent_version}"
    assert shown["tenant"] == "default"
    assert shown["status"] == "completed" and shown["outcome"]["code"] == "refunded"
    assert shown["input"]["order_id"] == ORDER and shown["input"]["amount"] == OVER_LIMIT
    assert shown["output"]["reply"].startswith("Refunded 60.00 EUR")
    assert shown["requested_by"] == "user:requester"
    assert shown["created_at"] and shown["finished_at"]
    assert shown["usage"]["model_cost"]["currency"] == "USD"
    steps = approved_run.steps.order_by("seq")
    assert [s["step_id"] for s in bundle["steps"]] == [s.step_id for s in steps]
    refund = Step.objects.get(run=approved_run, name="issue_refund")
    shown = _step(bundle, "issue_refund")
    assert shown["effect_key"] == refund.effect_key
    assert shown["provider_reference"] == refund.provider_reference.strip()
    assert shown["provider_reference"].startswith("re_")
    assert shown["attempts"] == 1 and shown["status"] == "succeeded"
    assert shown["input"] == refund.input and shown["request"]["amount"] == OVER_LIMIT
    assert shown["result"]["id"] == refund.provider_reference
    assert shown["recovery_log"][0] == {"action": "send", "attempt": 1, "after": "planned"}
    assert shown["first_sent_at"] and shown["completed_at"]
    model = _step(bundle, "chat")
    assert model["model"]["model_id"] == "scripted-1" and model["model"]["cost"]["display"]
    assert "effect_sent" in [event["type"] for event in bundle["events"]]


def test_an_approval_gives_its_arguments_hash_state_decision_and_what_used_it(approved_run):
    bundle = run_bundle(approved_run, provider_error_detail=False)
    approval = Approval.objects.get(run=approved_run)
    refund = Step.objects.get(run=approved_run, name="issue_refund")
    [shown] = bundle["approvals"]
    assert shown["id"] == approval.pk and shown["status"] == "consumed"
    assert shown["args"] == approval.args and shown["args_hash"] == approval.args_hash
    assert shown["amount"] == {"minor_units": 6000, "currency": "EUR", "display": "60.00 EUR"}
    assert shown["resource"] == approval.resource
    assert shown["resource_state_then"]["amount_refunded"] == 0
    assert shown["resource_fingerprint"] == approval.resource_fingerprint
    assert shown["requested_by"] == "user:requester"
    assert shown["decision"]["by"] == "user:ann" and shown["decision"]["at"]
    assert shown["decision"]["note"] == "the customer ••••@example.com sent the receipt"
    assert shown["consumed"] == {
        "at": shown["consumed"]["at"],
        "by_effect_key": refund.effect_key,
        "by_step_id": refund.step_id,
    }
    assert _step(bundle, "issue_refund")["approval_consumed"] == approval.pk
    [entry] = [e for e in bundle["audit"] if e["object_type"] == "approval"]
    assert entry["action"] == "approval.approve" and entry["actor"] == "user:ann"
    assert entry["after"]["status"] == "approved"
    assert "bob@example.com" not in str(bundle)


def test_a_case_gives_its_lookups_resolution_and_the_attempts(reconciled_run):
    bundle = run_bundle(reconciled_run, provider_error_detail=True)
    [case] = bundle["reconciliation_cases"]
    assert case["status"] == "resolved" and case["tool"] == "issue_refund"
    assert case["amount"]["display"] == "7.00 EUR"
    assert case["effect_key"] == _step(bundle, "issue_refund")["effect_key"]
    [lookup] = case["lookups"]
    assert lookup["method"] == "operator" and lookup["outcome"] == "not_found"
    assert lookup["actor"] == "user:rita" and lookup["conclusive"] and lookup["at"]
    assert lookup["note"] == "not in the dashboard; asked ••••@example.com"
    assert case["resolution"]["code"] == "retry" and case["resolution"]["by"] == "user:rita"
    assert case["resolution"]["note"] == "send it"
    assert "sent again" in case["resolution"]["outcome_summary"]
    refund = _step(bundle, "issue_refund")
    assert refund["status"] == "succeeded" and refund["attempts"] == 4
    actions = [entry["action"] for entry in refund["recovery_log"]]
    assert actions[:3] == ["send", "answer", "resend"] and "settled" in actions
    audited = {entry["action"] for entry in bundle["audit"] if entry["object_type"] == "case"}
    assert audited == {"case.lookup.operator", "case.resolve.retry"}
    assert "effect_settled" in [event["type"] for event in bundle["events"]]


def test_providers_words_are_shown_only_to_who_may_read_them(reconciled_run):
    step = Step.objects.get(run=reconciled_run, name="issue_refund")
    failed_lookup = {
        "action": "lookup",
        "outcome": "inconclusive",
        "conclusive": False,
        "detail": "the lookup failed: the provider could not be asked",
        "error": "ConnectionError: payments.internal:8443 refused ops@example.com",
    }
    Step.objects.filter(pk=step.pk).update(recovery_log=[*step.recovery_log, failed_lookup])
    withheld = _step(run_bundle(reconciled_run, provider_error_detail=False), "issue_refund")
    shown = _step(run_bundle(reconciled_run, provider_error_detail=True), "issue_refund")
    # The sandbox's own words for the lost answers, and a lookup's client error.
    answer = withheld["recovery_log"][1]
    assert answer["message"].startswith("the call failed (reference E-")
    assert "An unknown error occurred" in shown["recovery_log"][1]["message"]
    assert withheld["recovery_log"][-1]["error"].startswith("the call failed (reference E-")
    assert withheld["recovery_log"][-1]["detail"] == failed_lookup["detail"]
    assert shown["recovery_log"][-1]["error"].startswith(
        "ConnectionError: payments.internal:8443 refused ••••@example.com (reference E-"
    )
    assert "internal" not in str(withheld)


def test_an_address_in_a_step_error_is_masked(approved_run):
    Step.objects.filter(run=approved_run, name="lookup_order").update(
        last_error_class="validation", last_error="no order for dave@example.com"
    )
    bundle = run_bundle(approved_run, provider_error_detail=True)
    assert _step(bundle, "lookup_order")["last_error"] == {
        "class": "validation",
        "message": "no order for ••••@example.com",
    }
    assert "dave@" not in str(bundle)


def test_exports_are_audited_but_not_part_of_the_facts(approved_run, approver):
    before = run_bundle(approved_run, provider_error_detail=False)
    audit_record(
        tenant=approved_run.tenant,
        actor="user:ann",
        action=EXPORT_ACTION,
        object_type="run",
        object_id=str(approved_run.id),
        after={"format": "json", "sha256": "0" * 64},
    )
    assert AuditEntry.objects.filter(action=EXPORT_ACTION).exists()
    assert run_bundle(approved_run, provider_error_detail=False) == before
