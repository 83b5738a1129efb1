"""/healthz and /readyz: what a load balancer or an orchestrator is told, without a login."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.utils import timezone

from agentruns.models import Run, SweeperLease
from agentruns.sweeper import SWEEPER_LEASE_NAME
from config import health
from tests.harness import Harness

# The checks read the database from a thread of their own, which sees only what
# is committed.
transactional = pytest.mark.django_db(transaction=True)


def _lease(seconds_from_now: float | None) -> None:
    expires = (
        None if seconds_from_now is None else timezone.now() + timedelta(seconds=seconds_from_now)
    )
    SweeperLease.objects.update_or_create(
        name=SWEEPER_LEASE_NAME, defaults={"owner": "sweeper-1", "expires_at": expires}
    )


def _seconds(text: str, pattern: str) -> int:
    """The whole seconds in ``text``, which reads as ``pattern`` with them at ``{}``."""
    found = re.fullmatch(re.escape(pattern).replace(r"\{\}", r"(\d+)"), text)
    assert found, text
    return int(found.group(1))


def _ready(client):
    answer = client.get("/readyz")
    return answer.status_code, answer.json()


def test_healthz_answers_without_a_login_or_the_database(client):
    # No django_db mark: a query here would fail the test.
    answer = client.get("/healthz")
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}
    assert "no-cache" in answer["Cache-Control"]


@transactional
def test_readyz_is_ready_when_every_check_passes(client):
    _lease(4)
    status, body = _ready(client)
    assert status == 200
    assert body == {
        "status": "ready",
        "failed": [],
        "checks": {"database": "ok", "migrations": "ok", "sweeper": "ok", "queue": "ok"},
    }


@transactional
def test_readyz_names_a_stale_sweeper_lease(client):
    _lease(-30)
    status, body = _ready(client)
    assert status == 503
    assert body["failed"] == ["sweeper"]
    assert _seconds(body["checks"]["sweeper"], "the sweeper's lease expired {} s ago") in range(
        30, 40
    )


@transactional
def test_readyz_tolerates_a_lease_that_just_expired(client):
    _lease(-2)  # within HOLDFAST_READY_SWEEPER_GRACE_SECONDS (5 s): a handover
    assert _ready(client)[0] == 200


@transactional
@pytest.mark.parametrize("lease", ["no row", "handed back"])
def test_readyz_names_a_sweeper_lease_nobody_holds(client, lease):
    if lease == "handed back":
        _lease(None)
    status, body = _ready(client)
    assert status == 503
    assert body["failed"] == ["sweeper"]
    assert body["checks"]["sweeper"] == "no sweeper holds its lease"


@transactional
def test_readyz_names_an_unapplied_migration(client):
    _lease(4)
    plan = [(mock.Mock(name="0099_later"), False)]
    with mock.patch.object(health.MigrationExecutor, "migration_plan", return_value=plan):
        status, body = _ready(client)
    assert status == 503
    assert body["failed"] == ["migrations"]
    assert body["checks"]["migrations"] == "1 unapplied migration(s)"


@transactional
def test_readyz_names_a_queued_run_no_worker_took(client, tenant, settings):
    settings.HOLDFAST_READY_QUEUE_LAG_SECONDS = 60
    _lease(4)
    run = Harness(tenant).start("flow")
    assert _ready(client)[0] == 200
    # The sweeper's knocks move enqueued_at every 15 s; the wait is since it was queued.
    Run.objects.filter(pk=run.id).update(
        updated_at=timezone.now() - timedelta(seconds=90), enqueued_at=timezone.now()
    )
    status, body = _ready(client)
    assert status == 503
    assert body["failed"] == ["queue"]
    waited = _seconds(
        body["checks"]["queue"], "a due run has waited {} s for a worker (limit 60 s)"
    )
    assert waited in range(90, 100)


@transactional
@pytest.mark.parametrize("waiting", ["a retry came due", "its worker's lease expired"])
def test_readyz_names_a_due_run_nobody_took(client, tenant, waiting):
    _lease(4)
    run = Harness(tenant).start("flow")
    long_ago = timezone.now() - timedelta(seconds=120)
    if waiting == "a retry came due":
        change = {"status": "waiting_for_retry", "next_attempt_at": long_ago}
    else:
        change = {"status": "running", "lease_owner": "w1", "lease_expires_at": long_ago}
    Run.objects.filter(pk=run.id).update(**change)
    status, body = _ready(client)
    assert status == 503
    assert body["failed"] == ["queue"]
    waited = _seconds(
        body["checks"]["queue"], "a due run has waited {} s for a worker (limit 60 s)"
    )
    assert waited in range(120, 130)


@transactional
def test_readyz_fails_fast_when_the_database_does_not_answer(client, settings):
    settings.HOLDFAST_PROBE_TIMEOUT_SECONDS = 0.3
    _lease(4)
    release = threading.Event()

    def hung():
        release.wait(10)
        return {}

    try:
        with mock.patch.object(health, "_checks", hung):
            started = time.monotonic()
            status, body = _ready(client)
            elapsed = time.monotonic() - started
            # A second probe queues behind the hung one and is given up too.
            second_status, _ = _ready(client)
    finally:
        release.set()
    assert status == second_status == 503
    assert elapsed < 2
    assert body["failed"] == ["database", "migrations", "sweeper", "queue"]
    assert body["checks"] == {
        "database": "no answer within 0.3 s",
        "migrations": "not checked",
        "sweeper": "not checked",
        "queue": "not checked",
    }
    # The probe thread is free again once the database answers.
    assert _ready(client)[0] == 200


@transactional
@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server-side statement timeout")
def test_a_probe_statement_is_cancelled_by_the_database_at_the_timeout():
    def slow():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_sleep(5)")

    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 (the deadline or the server's cancel)
        health.probe(slow, timeout=0.5)
    # Cancelled by the server, not just abandoned: the next probe gets the thread at once.
    assert health.probe(lambda: "answered", timeout=1.0) == "answered"
    assert time.monotonic() - started < 2


@transactional
def test_readyz_reveals_nothing_but_the_checks(client):
    _lease(4)
    body = _ready(client)[1]
    assert set(body) == {"status", "failed", "checks"}
    assert set(body["checks"]) == {"database", "migrations", "sweeper", "queue"}


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_probe_is_a_get(client, path):
    assert client.post(path).status_code == 405
