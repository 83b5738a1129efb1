"""Automatic lookups are workers' tasks, claimed by lease, a few at a time per deployment:
a provider that hangs holds up no recovery of a crashed run."""

from __future__ import annotations

import copy
import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from django.utils.module_loading import import_string

from agentruns.models import Run, Step
from agentruns.sweeper import sweep
from reconciliation import services
from reconciliation.lookups import LOOKUP_TASK, case_lookup_task, lookups_claim, lookups_in_flight
from reconciliation.models import ReconciliationCase

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

CONCURRENCY = 4


@pytest.fixture(autouse=True)
def concurrency(settings):
    settings.HOLDFAST = {**settings.HOLDFAST, "LOOKUP_CONCURRENCY": CONCURRENCY}


def _due_cases(world, count: int) -> Run:
    """``count`` open cases due for an automatic lookup: one real lost refund, and
    copies of its step and case under their own effect keys."""
    world.sandbox.arm("drop_after_commit", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    world.clear_faults()
    case = world.case_of(run)
    step = Step.objects.get(pk=case.step_id)
    steps = []
    for i in range(1, count):
        twin = copy.copy(step)
        twin.pk = None
        twin.seq = step.seq + 1000 + i
        twin.step_id = f"{twin.seq:04d}.tool.issue_refund"
        twin.effect_key = f"{step.effect_key}-{i}"
        steps.append(twin)
    cases = []
    for twin in Step.objects.bulk_create(steps):
        copied = copy.copy(case)
        copied.pk = None
        copied.step_id = twin.pk
        copied.step_id_label = twin.step_id
        copied.effect_key = twin.effect_key
        cases.append(copied)
    ReconciliationCase.objects.bulk_create(cases)
    ReconciliationCase.objects.update(next_lookup_at=timezone.now() - timedelta(seconds=1))
    return run


def _crash(run: Run) -> None:
    """The run's worker died mid-step: it is running, its lease lapsed."""
    Run.objects.filter(pk=run.pk).update(
        status="running",
        lease_owner="dead-worker",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
        enqueued_at=timezone.now() - timedelta(seconds=10),
    )


def test_hanging_lookups_of_200_cases_hold_up_no_recovery_and_stay_within_the_limit(
    world, monkeypatch
):
    # Every lookup hangs in the provider past its timeout (shortened here so the
    # test takes two seconds, not five): the listing of refunds answers late.
    monkeypatch.setattr(services, "LOOKUP_TIMEOUT", 2.0)
    _due_cases(world, 200)
    world.sandbox.arm("delay", path="/v1/refunds", method="GET", count=1000, delay=3)
    events: list[tuple[str, str]] = []
    workers: list[threading.Thread] = []

    def work(task: str, *args) -> None:
        try:
            import_string(task)(*args)
        finally:
            events.append(("lookup ended", str(args[0])))
            connection.close()

    def enqueue(task: str, *args) -> None:
        # Each task goes to a worker of its own at once, as an idle cluster takes it.
        events.append(("lookup enqueued", str(args[0])))
        worker = threading.Thread(target=work, args=(task, *args))
        workers.append(worker)
        worker.start()

    def knock(run_id: str) -> None:
        events.append(("knocked", run_id))

    first = sweep(owner="sweeper-test", push=knock, enqueue=enqueue)
    assert first.cases["lookups_claimed"] == CONCURRENCY
    claimed = {case_id for kind, case_id in events if kind == "lookup enqueued"}
    assert len(claimed) == CONCURRENCY

    # A worker dies mid-step while those lookups hang; the next pass recovers its run.
    crashed = world.start(amount=300)
    _crash(crashed)
    second = sweep(owner="sweeper-test", push=knock, enqueue=enqueue)
    assert second.recovered == [str(crashed.pk)]
    assert second.cases["lookups_claimed"] == 0  # every slot is taken
    # Counted in the database: another claimer (a second sweeper, another host) finds
    # no free slot either.
    assert lookups_in_flight() == CONCURRENCY
    assert lookups_claim(limit=500) == []
    knocked_at = events.index(("knocked", str(crashed.pk)))
    # The run was knocked on before any lookup came back: nothing waited for them.
    assert not [kind for kind, _ in events[:knocked_at] if kind == "lookup ended"]

    for worker in workers:
        worker.join(timeout=30)
    assert not any(worker.is_alive() for worker in workers)
    looked_up = ReconciliationCase.objects.filter(lookup_failures=1)
    assert {str(pk) for pk in looked_up.values_list("pk", flat=True)} == claimed
    for case in looked_up:
        assert case.is_open and case.lookup_claim == "" and case.lookup_lease_expires_at is None
        assert case.next_lookup_at > timezone.now() + timedelta(seconds=30)  # backed off
        assert services.newest_lookup(case).outcome == "inconclusive"
    # Slots free again: the next pass takes the next due cases, never the same ones.
    world.clear_faults()
    third = sweep(owner="sweeper-test", push=knock, enqueue=lambda task, *args: None)
    assert third.cases["lookups_claimed"] == CONCURRENCY
    assert not claimed & {
        str(pk)
        for pk in ReconciliationCase.objects.exclude(lookup_claim="").values_list("pk", flat=True)
    }
    assert ReconciliationCase.objects.filter(lookup_failures=0).count() == 200 - CONCURRENCY


def test_a_lost_lookup_task_is_claimed_again_after_its_lease_and_the_late_one_does_nothing(
    world,
):
    run = _due_cases(world, 2)
    lost: list[tuple] = []
    sweep(owner="sweeper-test", push=lambda run_id: None, enqueue=lambda *task: lost.append(task))
    assert sorted(args[1] for args in lost) == sorted(
        ReconciliationCase.objects.filter(run=run).values_list("pk", flat=True)
    )
    assert {task for task, *_ in lost} == {LOOKUP_TASK}
    # Nobody ran them (the worker died, the broker dropped them); their leases lapse.
    still = sweep(owner="sweeper-test", push=lambda run_id: None, enqueue=lost.append)
    assert still.cases["lookups_claimed"] == 0  # while their leases hold
    ReconciliationCase.objects.update(lookup_lease_expires_at=timezone.now() - timedelta(seconds=1))
    again: list[tuple] = []
    sweep(owner="sweeper-test", push=lambda run_id: None, enqueue=lambda *task: again.append(task))
    assert sorted(args[1] for args in again) == sorted(args[1] for args in lost)
    # A lost task that turns up late finds its claim taken over: no lookup is made.
    _, case_id, old_claim = lost[0]
    assert case_lookup_task(case_id, old_claim) == "claim_lapsed"
    assert not ReconciliationCase.objects.get(pk=case_id).lookups.exists()
    # The newer claim's task makes the lookup; the provider finds the refund, and the
    # case is resolved as the system, through the same path as before.
    [(_, _, claim)] = [task for task in again if task[1] == case_id]
    assert case_lookup_task(case_id, claim) == "succeeded"
    case = ReconciliationCase.objects.get(pk=case_id)
    assert case.status == "resolved" and case.resolved_by == "system"
    assert case.lookup_claim == "" and case.lookup_lease_expires_at is None
