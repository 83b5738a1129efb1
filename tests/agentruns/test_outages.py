"""A lost database connection is a pause: the worker's facts, the sweeper and the live
pages wait it out and carry on, logging the outage once."""

from __future__ import annotations

import logging
import os
import signal

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.db.utils import OperationalError

from agentruns.models import Run, Step
from agentruns.runtime import outages
from agentruns.runtime.outages import Outage, through_outages
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite has no connection to lose"
)


def _terminate_my_connection() -> None:
    """What a PostgreSQL restart does to this process's connection, from another one."""
    import psycopg

    pid = connection.connection.info.backend_pid
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
        user=settings["USER"],
        dbname=settings["NAME"],
        autocommit=True,
    ) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


@postgres_only
def test_a_statement_on_a_connection_the_server_dropped_is_made_again_on_a_new_one(caplog):
    connection.ensure_connection()
    _terminate_my_connection()
    outage = Outage("test", logging.getLogger("holdfast.test"))
    with caplog.at_level(logging.WARNING, logger="holdfast.test"):
        answer = through_outages(
            lambda: Run.objects.count(), outage=outage, budget=5.0, sleep=lambda s: None
        )
    assert answer == 0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("test: database unreachable (OperationalError")
    assert lines[1].startswith("test: database back after")


def test_an_error_on_a_working_connection_is_the_callers(caplog):
    def refused():
        raise OperationalError("a deadlock, a constraint: not an outage")

    outage = Outage("test", logging.getLogger("holdfast.test"))
    connection.ensure_connection()
    with pytest.raises(OperationalError):
        through_outages(refused, outage=outage, budget=5.0, sleep=lambda s: None)
    assert not outage.down


@postgres_only
def test_past_its_budget_the_loss_is_raised():
    connection.ensure_connection()
    calls = []

    def always_lost():
        calls.append(1)
        _terminate_my_connection() if connection.connection else None
        return Run.objects.count()

    outage = Outage("test", logging.getLogger("holdfast.test"))
    with pytest.raises(OperationalError):
        through_outages(always_lost, outage=outage, budget=0.0, sleep=lambda s: None)
    assert calls and outage.down


@postgres_only
@pytest.mark.parametrize("reconnect_seconds", [15.0, 0.0])
def test_a_providers_answer_that_arrives_while_the_connection_is_gone_is_still_recorded(
    tenant, reconnect_seconds
):
    """The finding: a worker whose reply arrived while PostgreSQL restarted logged
    'abandoned' and left the run running. Now the fact waits for the database."""
    from tests.harness import Harness

    agents.PROVIDER.reset()

    # During the charge, the server drops the worker's connection: the answer is in
    # hand when the engine next writes.
    def once():
        agents.PROVIDER.hooks.pop("charge")
        _terminate_my_connection()

    agents.PROVIDER.hooks["charge"] = once
    try:
        harness = Harness(tenant, reconnect_seconds=reconnect_seconds)
        run = harness.start("flow", {"amount": 500})
        outcome = harness.advance(run)
        if reconnect_seconds:
            assert outcome == "finished:completed"
        else:
            # No time to wait: the worker gives up, and the usual recovery (same-key
            # resend after the lease lapses) finishes the run with one charge.
            assert outcome == "abandoned"
            harness.expire_lease(run)
            assert harness.advance(run) == "finished:completed"
            assert agents.PROVIDER.calls["charge"] == 2
            assert len(agents.PROVIDER.effects) == 1
    finally:
        agents.PROVIDER.reset()
    step = Step.objects.get(run=run, name="charge")
    assert (step.status, step.attempts) == ("succeeded", 1 if reconnect_seconds else 2)


def test_the_sweeper_loop_outlives_a_failed_pass(monkeypatch):
    passes = []

    def flaky_sweep(**kwargs):
        passes.append(1)
        if len(passes) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        if len(passes) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # as a supervisor stopping it
        return None

    monkeypatch.setattr("agentruns.management.commands.sweep.sweep", flaky_sweep)
    monkeypatch.setattr("agentruns.management.commands.sweep.FAILED_PASS_PAUSE", 0.01)
    monkeypatch.setattr(outages, "backoff", lambda attempt: 0.01)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        call_command("sweep", "--loop", "--interval", "0.01")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(passes) == 3


def test_the_connections_are_left_usable_after_an_outage():
    # Sanity for the tests above: the test database is reachable again.
    assert connections["default"].cursor().execute("SELECT 1") is not None
