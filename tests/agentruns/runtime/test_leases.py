"""One owner at a time: claims race on one UPDATE, a lost lease stops a worker cold."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from agentruns.models import RUNNABLE_STATUSES, Run
from agentruns.runtime import faults
from agentruns.runtime.store import CLAIMED_COLUMNS
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)


# The worker that loses a race either finds the claim taken or, when the winner has
# already finished the run before it looks (a slow thread start), a run with nothing
# left to do. Both leave the run untouched; which one it sees is the scheduler's choice.
LOST_THE_RACE = {"not_claimed", "not_runnable"}


def _one_advance(outcomes):
    winners = [o for o in outcomes if o == "finished:completed"]
    losers = [o for o in outcomes if o != "finished:completed"]
    assert len(winners) == 1, outcomes
    assert set(losers) <= LOST_THE_RACE, outcomes


def _in_threads(count, target):
    barrier = threading.Barrier(count)
    results = [None] * count

    def work(i):
        try:
            barrier.wait()
            results[i] = target(i)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_workers_racing_for_a_run_yield_one_advance(harness, provider):
    run = harness.start("flow")
    outcomes = _in_threads(2, lambda i: harness.build().advance(run.id, owner=f"worker-{i}"))
    _one_advance(outcomes)
    assert provider.calls["lookup_order"] == 1
    assert provider.effect_count() == 1


def test_two_workers_recovering_an_expired_lease_yield_one_advance(harness, provider):
    run = harness.start("flow")
    harness.interrupt(run, faults.AFTER_RESULT_RECORDED, "lookup_order")
    outcomes = _in_threads(2, lambda i: harness.build().advance(run.id, owner=f"rescuer-{i}"))
    _one_advance(outcomes)
    assert provider.calls["charge"] == 1


def test_a_worker_whose_lease_was_taken_over_fails_its_next_transition(harness, provider):
    """Worker A stalls after a read; B takes over and finishes; A's next write fails."""
    stalled = harness.build()
    run = harness.start("flow")
    takeover = {}

    def lose_the_lease():
        harness.expire_lease(run)
        takeover["outcome"] = harness.build().advance(run.id, owner="worker-b")

    stalled.faults.arm(faults.AFTER_CALL_RETURNED, lose_the_lease, step_name="lookup_order")
    assert stalled.advance(run.id, owner="worker-a") == "lease_lost"
    assert takeover["outcome"] == "finished:completed"
    assert provider.calls["charge"] == 1
    assert provider.effect_count() == 1
    assert Run.objects.get(pk=run.id).status == "completed"


def test_a_worker_that_stalls_past_its_send_budget_does_not_send(harness, provider):
    clock = {"now": 1000.0}
    stalled = harness.build(monotonic=lambda: clock["now"])
    run = harness.start("flow")

    def stall():
        clock["now"] += 3600  # paused for an hour between clearing the send and sending

    stalled.faults.arm(faults.AFTER_STEP_RUNNING, stall, step_name="charge")
    assert stalled.advance(run.id, owner="worker-a") == "lease_lost"
    assert provider.calls["charge"] == 0
    step = run.steps.get(name="charge")
    assert step.status == "running" and step.in_flight
    # Another worker recovers it under the same key once the lease has lapsed.
    harness.expire_lease(run)
    assert harness.advance(run) == "finished:completed"
    assert provider.calls["charge"] == 1


def test_a_late_answer_is_recorded_even_after_the_lease_was_lost(harness, provider):
    """A fact is not a decision: what the provider said is kept, whoever owns the run."""
    slow = harness.build()
    run = harness.start("flow")

    def lease_taken_during_the_call():
        # Another worker bumped the version while this one waited for the provider.
        Run.objects.filter(pk=run.id).update(state_version=999)

    provider.hooks["charge"] = lease_taken_during_the_call
    assert slow.advance(run.id, owner="worker-a") == "lease_lost"
    step = run.steps.get(name="charge")
    assert step.status == "succeeded"
    assert step.provider_reference == "ch_1"


def test_a_crash_loop_ends_in_blocked(harness, provider):
    engine = harness.build()

    def crash():
        raise SystemExit("worker killed")

    engine.faults.arm(faults.BEFORE_STEP_RECORDED, crash, step_name="lookup_order", times=100)
    run = harness.start("flow")
    limit = harness.settings.max_claims_without_progress
    for _ in range(limit):
        with pytest.raises(SystemExit):
            harness.advance(run, engine)
        harness.expire_lease(run)
    assert harness.advance(run, engine) == "blocked"
    run.refresh_from_db()
    assert run.status == "blocked"
    assert run.outcome_detail.startswith(f"crash loop: claimed {limit + 1} times")
    assert provider.calls["lookup_order"] == 0


def test_a_leased_run_cannot_be_claimed(harness):
    engine = harness.build()
    seen = {}

    def try_to_claim():
        seen["other"] = harness.build().advance(run.id, owner="intruder")

    engine.faults.arm(faults.AFTER_RESULT_RECORDED, try_to_claim, step_name="lookup_order")
    run = harness.start("flow")
    assert engine.advance(run.id) == "finished:completed"
    assert seen["other"] == "not_claimed"


def test_a_run_hands_itself_back_to_the_queue_when_its_time_slice_ends(harness, provider):
    engine = harness.build(
        settings=harness.settings.__class__(lease_seconds=30.0, time_slice_seconds=0.0)
    )
    run = harness.start("flow")
    harness.enqueued.clear()
    assert engine.advance(run.id) == "suspended:queued"
    run.refresh_from_db()
    assert run.status == "queued" and run.lease_owner == ""
    assert harness.enqueued == [run.id]
    assert run.steps.count() == 1  # one step per slice with a zero-length slice
    assert harness.advance(run) == "finished:completed"


def test_lease_comparisons_use_the_database_clock_not_the_workers(harness, time_machine):
    """A worker whose host clock runs an hour fast still sees another worker's lease."""
    from datetime import timedelta

    engine = harness.build()
    run = harness.start("flow")
    seen = {}

    def skewed_worker_tries_to_claim():
        time_machine.move_to(timedelta(hours=1))
        seen["outcome"] = harness.build().advance(run.id, owner="skewed")

    engine.faults.arm(
        faults.AFTER_RESULT_RECORDED, skewed_worker_tries_to_claim, step_name="lookup_order"
    )
    assert engine.advance(run.id, owner="honest") == "finished:completed"
    assert seen["outcome"] == "not_claimed"


def test_configuration_is_read_from_the_run_not_from_the_deployment(harness):
    from agentruns.runtime import Registry, agent

    def make(limit):
        @agent(name="configured", version=1, tools=agents.TOOLS, config={"limit": limit})
        def configured(ctx, input):
            ctx.sleep(10)
            return {"limit": ctx.config["limit"]}

        return configured

    harness.registry = Registry([make(100)])
    run = harness.start("configured")
    harness.advance(run, harness.build())
    harness.registry = Registry([make(5)])  # a deploy changed the configuration
    harness.make_due(run)
    assert harness.advance(run, harness.build()) == "finished:completed"
    assert Run.objects.get(pk=run.id).output == {"limit": 100}


def test_the_claim_returns_the_row_as_claimed_so_the_worker_does_not_read_it_again(harness):
    """The claim's compare-and-set matched the version the worker read, so that row plus
    what the claim returned is the run as claimed, a cancel request made meanwhile
    (written without a new version) included."""
    run = harness.start("flow")
    harness.interrupt(run, faults.AFTER_RESULT_RECORDED, "lookup_order")
    engine = harness.build()
    read = Run.objects.get(pk=run.pk)
    engine.store.mark_cancel_requested(run.id, by="alice")
    claimed = engine._claim(read, "rescuer", statuses=sorted(RUNNABLE_STATUSES), due_only=True)
    assert claimed.fenced
    for column, value in claimed.claimed.items():
        setattr(read, column, value)
    read.state_version = claimed.state_version
    fresh = Run.objects.get(pk=run.pk)
    compared = [*CLAIMED_COLUMNS, "state_version", "steps_used", "agent_snapshot", "input"]
    assert {c: getattr(read, c) for c in compared} == {c: getattr(fresh, c) for c in compared}
    assert read.recovered is True and read.lease_owner == "rescuer"
    assert read.cancel_requested_by == "alice"


def test_a_claim_that_misses_returns_no_row(harness):
    run = harness.start("flow")
    engine = harness.build()
    stale = Run.objects.get(pk=run.pk)
    assert harness.advance(run) == "finished:completed"
    missed = engine._claim(stale, "late", statuses=sorted(RUNNABLE_STATUSES), due_only=True)
    assert not missed.fenced and missed.claimed is None
