"""Runs recorded before runs had marks: the migrations mark them from the steps and
events they kept, and a run a worker died in replays to its end afterwards."""

from __future__ import annotations

import pytest

from agentruns.marks import marks_of
from agentruns.models import Run
from agentruns.runtime import faults
from reconciliation.models import ReconciliationCase
from reconciliation.services import case_record_lookup
from tests.harness import recorded_before_marks, resolve_as_seen

pytestmark = pytest.mark.django_db(transaction=True)


def _marks(run: Run) -> list[str]:
    run.refresh_from_db()
    return [mark.text for mark in marks_of(run)]


def test_runs_recorded_before_the_marks_get_them_and_replay(
    harness, provider, tenant, make_operator
):
    provider.script["lookup_order"] = ["fail_before"]
    retried = harness.drive(harness.start("flow", {"order_id": "a"}))
    undone = harness.start("flow", {"order_id": "b", "fail_after_charge": True})
    assert harness.advance(undone) == "finished:compensated"
    provider.script["send_email"] = ["fail_after"]
    settled = harness.start("mailer")
    harness.advance(settled)
    case = ReconciliationCase.objects.get(run=settled)
    rita = make_operator(tenant, "reconciler", username="rita")
    case_record_lookup(case=case, user=rita, outcome="succeeded", provider_reference="m", note="x")
    resolve_as_seen(case, rita, "happened")
    halfway = harness.start("flow", {"order_id": "c"})
    harness.interrupt(halfway, faults.AFTER_RESULT_RECORDED, "lookup_order")
    calls = provider.calls["lookup_order"]

    recorded_before_marks()

    assert _marks(retried) == ["retried"]
    assert _marks(undone) == ["compensated"]
    assert _marks(settled) == ["reconciled"]
    assert _marks(halfway) == []
    # The run a worker died in goes on from its last recorded step, taken over.
    assert harness.advance(halfway) == "finished:completed"
    assert provider.calls["lookup_order"] == calls
    assert _marks(halfway) == ["recovered"]
    assert harness.drive(settled).status == "completed"
