"""Bulk actions: the confirmation says what will happen and changes nothing; a worker
carries the action out run by run, each audited, skipping (and listing) the runs
whose state forbids it; an item is acted on once even when two workers race or one
dies."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.test import Client
from django.utils import timezone

from accounts.models import AuditEntry
from agentruns.models import Run, RunStatus, Step
from bulk import services
from bulk.models import BulkAction, BulkItem
from bulk.services import bulk_resume_duty, carry_out
from tests.harness import Harness

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def runs(tenant):
    """Three runs of the tenant: sleeping, waiting to retry, and ended."""
    harness = Harness(tenant)
    sleeping = harness.start("flow", {"sleep": 600})
    assert harness.advance(sleeping).startswith("suspended")
    waiting = harness.start("flow", {"sleep": 600})
    Run.objects.filter(pk=waiting.pk).update(status=RunStatus.WAITING_FOR_RETRY)
    ended = harness.start("flow", {})
    Run.objects.filter(pk=ended.pk).update(status=RunStatus.COMPLETED)
    return sleeping, waiting, ended


@pytest.fixture
def operator(tenant, make_operator):
    client = Client()
    client.force_login(make_operator(tenant, "operator", username="olga"))
    return client


def _ids(*runs) -> list[str]:
    return [str(run.id) for run in runs]


def test_the_confirmation_counts_skips_and_warns_and_changes_nothing(operator, runs):
    sleeping, _waiting, _ended = runs
    Step.objects.filter(run=sleeping).update(in_flight=True)
    page = operator.post("/runs/bulk/", {"kind": "cancel", "run": _ids(*runs)})
    body = page.content.decode()
    assert page.status_code == 200
    assert "Cancel 3 runs?" in body
    assert "<strong>2</strong> will be asked to stop" in body
    assert "1: already ended" in body
    assert "<strong>1</strong> of them have an effect in flight" in body
    assert BulkAction.objects.count() == 0
    assert not AuditEntry.objects.filter(action__startswith="runs.bulk").exists()
    assert Run.objects.get(pk=sleeping.pk).status == RunStatus.SLEEPING


def test_a_confirmed_cancel_is_carried_out_run_by_run_and_audited(operator, runs, tenant):
    sleeping, waiting, ended = runs
    answer = operator.post("/runs/bulk/start", {"kind": "cancel", "run": _ids(*runs)})
    action = BulkAction.objects.get()
    assert answer.status_code == 302 and answer["Location"] == f"/runs/bulk/{action.pk}/"
    assert AuditEntry.objects.filter(action="runs.bulk_cancel", object_id=str(action.pk)).exists()
    progress = operator.get(f"/runs/bulk/{action.pk}/").content.decode()
    assert "0 of 3 done, working…" in progress and 'hx-trigger="every 1s"' in progress

    assert carry_out(action.pk) == 2
    assert carry_out(action.pk) == 0  # nothing is acted on twice
    assert Run.objects.get(pk=sleeping.pk).status == RunStatus.CANCELLED_NO_EFFECT
    assert Run.objects.get(pk=waiting.pk).status == RunStatus.CANCELLED_NO_EFFECT
    audited = AuditEntry.objects.filter(action="run.cancel")
    assert sorted(audited.values_list("object_id", flat=True)) == sorted(_ids(sleeping, waiting))
    assert all(entry.after["bulk"] == action.pk for entry in audited)
    progress = operator.get(f"/runs/bulk/{action.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert "3 of 3 done — finished" in progress and "every 1s" not in progress
    assert "<strong>2</strong> asked to stop; <strong>1</strong> skipped" in progress
    assert f"/runs/{ended.id}/" in progress and "already ended" in progress


def test_retry_now_makes_only_waiting_runs_due(operator, runs):
    _sleeping, waiting, ended = runs
    operator.post("/runs/bulk/start", {"kind": "retry", "run": _ids(*runs)})
    action = BulkAction.objects.get()
    assert carry_out(action.pk) == 2
    outcomes = dict(action.items.values_list("run_id", "outcome"))
    assert outcomes[waiting.id] == "will retry now"
    assert outcomes[ended.id] == "not waiting to retry"
    assert AuditEntry.objects.filter(action="run.retry_now").count() == 2


def test_all_matching_takes_every_run_the_filter_shows(operator, runs):
    sleeping, _waiting, _ended = runs
    page = operator.post("/runs/bulk/", {"kind": "cancel", "all": "1", "state": "sleeping"})
    assert "Cancel 1 run?" in page.content.decode()
    assert "<code>state=sleeping</code>" in page.content.decode()
    operator.post("/runs/bulk/start", {"kind": "cancel", "all": "1", "state": "sleeping"})
    assert list(BulkItem.objects.values_list("run_id", flat=True)) == [sleeping.id]


def test_permissions_and_the_tenant_are_checked(client, tenant, other_tenant, make_operator, runs):
    viewer = Client()
    viewer.force_login(make_operator(tenant, "viewer"))
    assert viewer.post("/runs/bulk/", {"kind": "cancel", "run": _ids(*runs)}).status_code == 403
    assert (
        viewer.post("/runs/bulk/start", {"kind": "cancel", "run": _ids(*runs)}).status_code == 400
    )
    assert BulkAction.objects.count() == 0
    # Another tenant's operator names this tenant's runs: none is theirs.
    outsider = Client()
    outsider.force_login(make_operator(other_tenant, "operator"))
    page = outsider.post("/runs/bulk/", {"kind": "cancel", "run": _ids(*runs)})
    assert page.status_code == 400 and "No run of your tenant is selected" in page.content.decode()
    assert (
        outsider.post("/runs/bulk/start", {"kind": "cancel", "run": _ids(*runs)}).status_code == 400
    )
    assert not Run.objects.filter(status__startswith="cancelled").exists()


def test_a_claimed_item_is_not_taken_again_until_its_worker_is_presumed_dead(operator, runs):
    operator.post("/runs/bulk/start", {"kind": "cancel", "run": _ids(runs[0])})
    action = BulkAction.objects.get()
    item = action.items.get()
    # Another worker holds it: nothing to do here.
    BulkItem.objects.filter(pk=item.pk).update(state="working", claimed_at=timezone.now())
    assert carry_out(action.pk) == 0
    assert Run.objects.get(pk=runs[0].pk).status == RunStatus.SLEEPING
    # That worker died: after STALE_SECONDS the item is handed out again, once.
    later = timezone.now() + timedelta(seconds=services.STALE_SECONDS + 1)
    with time_machine.travel(later):
        assert carry_out(action.pk) == 1
    assert Run.objects.get(pk=runs[0].pk).status == RunStatus.CANCELLED_NO_EFFECT
    assert BulkAction.objects.get().finished_at is not None


def test_the_sweeper_hands_a_lost_bulk_action_to_a_worker_once_per_window(
    operator, runs, monkeypatch
):
    asked = []
    monkeypatch.setattr(services, "enqueue_bulk", asked.append)
    operator.post("/runs/bulk/start", {"kind": "cancel", "run": _ids(runs[0])})
    action = BulkAction.objects.get()
    asked.clear()
    bulk_resume_duty(None)
    assert asked == []  # just asked
    later = timezone.now() + timedelta(seconds=services.STALE_SECONDS + 1)
    with time_machine.travel(later):
        bulk_resume_duty(None)
        bulk_resume_duty(None)
    assert asked == [action.pk]
