"""A run an approver approved says so in the run list: "approved by ann", and ?mark=approved."""

from __future__ import annotations

import pytest

from agentruns.models import Run
from tests.harness import post_decision, recorded_before_marks

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def test_an_approval_marks_its_run_approved_by_the_approver(ann, pending, world):
    assert Run.objects.get(pk=pending.run_id).approved_by == ""
    assert post_decision(ann, pending).status_code == 302
    run = Run.objects.get(pk=pending.run_id)
    assert run.approved_by == "user:ann"
    # The send goes out on it and the run ends; the mark stays.
    run = world.harness.drive(run)
    assert run.status == "completed" and run.approved_by == "user:ann"
    page = ann.get("/runs/").content.decode()
    row = page[page.index(f'<tr id="run-{run.id}"') :]
    assert 'class="mark mark-approved" href="/runs/?mark=approved"' in row
    assert ">approved by ann</a>" in row[: row.index("</tr>")]
    assert f'id="run-{run.id}"' in ann.get("/runs/?mark=approved&state=completed").content.decode()


def test_a_rejection_names_no_approver(ann, pending, world):
    assert post_decision(ann, pending, "reject", note="the customer got a voucher").status_code
    run = world.harness.drive(Run.objects.get(pk=pending.run_id))
    assert run.approved_by == ""
    assert f'id="run-{run.id}"' not in ann.get("/runs/?mark=approved").content.decode()


def test_runs_approved_before_runs_had_marks_get_theirs(ann, pending, world):
    assert post_decision(ann, pending).status_code == 302
    run = world.harness.drive(Run.objects.get(pk=pending.run_id))
    assert run.status == "completed"
    recorded_before_marks()
    assert Run.objects.get(pk=run.id).approved_by == "user:ann"
