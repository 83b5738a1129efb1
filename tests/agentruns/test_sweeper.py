"""The sweeper knocks on every run whose next move is due, once per redelivery interval."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from agentruns.models import Run, SweeperLease
from agentruns.sweeper import sweep

pytestmark = pytest.mark.django_db(transaction=True)


def _sweep(owner="sweeper-1"):
    pushed: list[str] = []
    report = sweep(owner=owner, push=pushed.append)
    return report, pushed


def _age(run, **fields):
    Run.objects.filter(pk=run.id).update(**fields)


def test_it_wakes_a_run_whose_retry_is_due_once(harness, provider):
    provider.script["lookup_order"] = ["fail_before"]
    run = harness.start("flow")
    harness.advance(run)
    report, pushed = _sweep()
    assert pushed == []  # not due yet
    harness.make_due(run)
    report, pushed = _sweep()
    assert pushed == [str(run.id)] and report.woken == [str(run.id)]
    # A second pass within the redelivery interval does not knock again.
    assert _sweep()[1] == []


def test_it_wakes_a_due_run_again_after_the_redelivery_interval(harness, provider):
    run = harness.start("flow", {"sleep": 60})
    harness.advance(run)
    harness.make_due(run)
    assert _sweep()[1] == [str(run.id)]
    _age(run, enqueued_at=timezone.now() - timedelta(hours=1))
    assert _sweep()[1] == [str(run.id)]


def test_it_recovers_a_run_whose_worker_died(harness):
    run = harness.start("flow")
    _age(
        run,
        status="running",
        lease_owner="dead-worker",
        lease_expires_at=timezone.now() + timedelta(seconds=30),
        enqueued_at=timezone.now() - timedelta(seconds=5),
    )
    assert _sweep()[1] == []  # the lease is still valid
    harness.expire_lease(run)
    report, _ = _sweep()
    assert report.recovered == [str(run.id)]
    assert _sweep()[1] == []


def test_it_requeues_a_queued_run_nobody_picked_up(harness):
    run = harness.start("flow")
    assert _sweep()[1] == []  # just enqueued
    _age(run, enqueued_at=timezone.now() - timedelta(minutes=5))
    report, _ = _sweep()
    assert report.requeued == [str(run.id)]


def test_it_leaves_runs_waiting_for_people_alone(harness, provider):
    provider.script["send_email"] = ["fail_after"]
    run = harness.start("mailer")
    harness.advance(run)
    _age(run, enqueued_at=timezone.now() - timedelta(hours=5))
    assert _sweep()[1] == []


def test_it_reports_a_working_run_nobody_is_responsible_for(harness):
    run = harness.start("flow")
    _age(run, status="waiting_for_retry", next_attempt_at=None)
    report, _ = _sweep()
    assert report.orphaned == [str(run.id)]


def test_only_one_sweeper_is_active_at_a_time(harness):
    assert _sweep("sweeper-1")[0] is not None
    assert _sweep("sweeper-2")[0] is None
    assert _sweep("sweeper-1")[0] is not None
    SweeperLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _sweep("sweeper-2")[0] is not None


def test_it_does_not_requeue_while_the_broker_still_holds_their_knocks(harness, monkeypatch):
    from agentruns import sweeper

    run = harness.start("flow")
    _age(run, enqueued_at=timezone.now() - timedelta(minutes=5))
    # The workers are behind: as many untaken knocks wait as there are such runs.
    monkeypatch.setattr(sweeper, "waiting_knocks", lambda: 1)
    assert _sweep()[0].requeued == []
    # The backlog drained and the run is still queued: its knock was lost.
    monkeypatch.setattr(sweeper, "waiting_knocks", lambda: 0)
    assert _sweep()[0].requeued == [str(run.id)]


@pytest.mark.skipif(
    connection.vendor != "postgresql",
    reason="row locks: SQLite has none (its one writer serialises the batches)",
)
def test_a_batch_skips_a_run_another_transaction_holds_instead_of_waiting_for_it(harness):
    held, free = harness.start("flow"), harness.start("flow")
    for run in (held, free):
        _age(
            run,
            status="running",
            lease_owner="dead-worker",
            lease_expires_at=timezone.now() - timedelta(seconds=1),
            enqueued_at=timezone.now() - timedelta(seconds=5),
        )
    locked, release = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        # Another sweeper's batch, a worker's _help_recover, or an engine transition.
        try:
            with transaction.atomic():
                Run.objects.select_for_update().get(pk=held.pk)
                locked.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(timeout=10)
        report, pushed = _sweep()
        # The pass went on without the held row (it returned while the row was held).
        assert pushed == [str(free.id)] and report.recovered == [str(free.id)]
    finally:
        release.set()
        holder.join(timeout=30)
    # Once it is free, the next pass takes it.
    assert _sweep()[1] == [str(held.id)]
