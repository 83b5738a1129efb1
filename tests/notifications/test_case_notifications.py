"""A case that opens is told, once per opening, to the operators who may settle it."""

from __future__ import annotations

import pytest

from agentruns.models import Step
from notifications.services import case_notify, notifications_missed
from reconciliation.desk import case_open
from reconciliation.models import ReconciliationCase
from tests.harness import AMOUNT

pytestmark = pytest.mark.django_db(transaction=True)


def _unknown_refund(world):
    """A refund that answers 500 each time and whose lookup cannot answer: a case opens."""
    world.sandbox.arm("error_before", count=10)
    world.sandbox.arm("error_before", path="/v1/refunds", method="GET", count=50)
    run = world.harness.start("refund_support", {"order_id": "ord_1001", "amount": AMOUNT})
    for _ in range(30):
        run.refresh_from_db()
        if run.status in ("waiting_for_retry", "sleeping"):
            world.harness.backdate_sends(run, 120)
            world.harness.make_due(run)
        elif run.status not in ("queued", "running"):
            break
        world.harness.advance(run)
    assert run.status == "effect_unknown_reconciliation_required", run.status
    assert world.sandbox.delete("/_sandbox/faults").status_code == 200
    step = Step.objects.get(run=run, name="issue_refund")
    return ReconciliationCase.objects.get(step_id=step.pk)


def test_it_emails_each_operator_who_may_settle_and_nobody_else(world, people):
    case = _unknown_refund(world)
    assert [r.request_id for r in world.notify_runs()] == [f"notify:case:{case.pk}"]
    [run] = world.drive_notifications()
    assert run.status == "completed", run.outcome_detail

    # The reconciler settles effects; so does the admin role, which nobody here holds.
    assert world.recipients() == ["reconciler-rita@ops.example"]
    [message] = world.messages()
    assert message["subject"] == "Case opened: issue_refund, 7.00 EUR"
    assert "Amount: 7.00 EUR" in message["body"]
    assert f"http://127.0.0.1:8000/reconciliation/{case.pk}/" in message["body"]


def test_opening_the_same_case_again_tells_nobody_twice(world, people):
    case = _unknown_refund(world)
    case_open(str(case.run_id), case.step_id, "asked again")
    case_notify(case)
    assert notifications_missed() == 0
    world.drive_notifications()
    assert len(world.notify_runs()) == 1
    assert world.recipients() == ["reconciler-rita@ops.example"]
