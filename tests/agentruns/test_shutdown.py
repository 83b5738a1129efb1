"""A worker told to stop hands its run back at the next step; recovery of a dead
worker's run does not hang on one sweeper."""

from __future__ import annotations

import signal
from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns import shutdown, sweeper, tasks
from agentruns.models import Run, RunEvent, SweeperLease
from agentruns.runtime import faults
from tests.agentruns.runtime import agents
from tests.harness import Harness

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_provider():
    agents.PROVIDER.reset()
    yield
    agents.PROVIDER.reset()


@pytest.fixture
def worker_process(monkeypatch):
    """This process as a django-q2 worker process: its SIGTERM handler installed."""
    previous = signal.getsignal(signal.SIGTERM)
    shutdown.install()
    exits: list[int] = []
    monkeypatch.setattr(shutdown.os, "_exit", exits.append)
    yield exits
    signal.signal(signal.SIGTERM, previous)
    shutdown._stopping.clear()
    shutdown._busy.clear()


def test_a_stopping_worker_hands_the_run_back_at_the_next_step(tenant):
    harness = Harness(tenant)
    # Told to stop while the lookup is in flight: the lookup's answer is recorded,
    # the charge is not started.
    engine = harness.build(stopping=lambda: agents.PROVIDER.calls["lookup_order"] > 0)
    run = harness.start("flow", {"amount": 500})
    assert harness.advance(run, engine) == "suspended:queued"
    run.refresh_from_db()
    assert (run.status, run.lease_owner, run.lease_expires_at) == ("queued", "", None)
    assert run.enqueued_at is not None and harness.enqueued[-1] == run.id
    assert agents.PROVIDER.calls["charge"] == 0
    reason = RunEvent.objects.filter(run=run, type="suspended").latest("id").payload["reason"]
    assert reason == "the worker is shutting down"
    # Another worker continues at once, from the recorded lookup.
    assert harness.advance(run) == "finished:completed"
    assert agents.PROVIDER.calls == {"lookup_order": 1, "charge": 1}


def test_sigterm_to_an_idle_worker_process_exits_it_at_once(worker_process):
    with pytest.raises(SystemExit):
        signal.raise_signal(signal.SIGTERM)
    assert shutdown.stopping()


def test_sigterm_to_a_busy_worker_process_lets_it_finish_the_step_then_exit(
    worker_process, settings
):
    settings.HOLDFAST = {**settings.HOLDFAST, "SHUTDOWN_GRACE_SECONDS": 0.05}
    with pytest.raises(SystemExit), shutdown.Working():
        signal.raise_signal(signal.SIGTERM)  # mid-task: only noted
        assert shutdown.stopping()
    # The grace timer fired meanwhile: a call still in flight would have been abandoned.
    import time

    time.sleep(0.2)
    assert worker_process == [0]


def test_a_stopping_sweeper_hands_its_lease_to_the_standby_at_once():
    assert sweeper.acquire_sweeper_lease("sweeper-a", ttl=5.0)
    assert not sweeper.acquire_sweeper_lease("sweeper-b", ttl=5.0)  # standing by
    sweeper.release_sweeper_lease("sweeper-a")
    assert sweeper.acquire_sweeper_lease("sweeper-b", ttl=5.0)
    # b dies without a word: its lease lapses, and a takes over again.
    SweeperLease.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert sweeper.acquire_sweeper_lease("sweeper-a", ttl=5.0)


def test_a_worker_knocks_on_a_run_whose_lease_expired_without_the_sweeper(tenant, monkeypatch):
    harness = Harness(tenant)
    run = harness.start("flow", {"amount": 500})
    harness.interrupt(run, faults.AFTER_CALL_RETURNED, "charge")
    Run.objects.filter(pk=run.id).update(enqueued_at=None)
    knocked = []
    monkeypatch.setattr(sweeper, "push_advance", knocked.append)
    monkeypatch.setattr(tasks, "_last_help", 0.0)
    tasks._help_recover()
    assert knocked == [str(run.id)]
    # Throttled, and never twice on one run.
    tasks._help_recover()
    monkeypatch.setattr(tasks, "_last_help", 0.0)
    tasks._help_recover()
    assert knocked == [str(run.id)]
