"""Health for load balancers and orchestrators: ``/healthz`` (the process answers) and
``/readyz`` (this deployment can do its work now).

Readiness is four checks: the database answers, no migration is unapplied on it,
a sweeper holds its lease (``SweeperLease``, renewed every pass), and no run
that is due has waited for a worker longer than ``HOLDFAST_READY_QUEUE_LAG_SECONDS``.

Every database read here (and the aggregates ``/metrics`` reads) goes through
``probe``: one thread of its own, a statement timeout on PostgreSQL, and a
deadline for the answer. Under daphne every synchronous view shares one thread,
so a read that hung there would hang the whole dashboard, not just the probe.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db import DatabaseError, connections, transaction
from django.db.backends.utils import typecast_timestamp
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Count, Min, Q
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agentruns.dbclock import DbNow, now_sql
from agentruns.models import TIMED_STATUSES, Run, RunStatus, SweeperLease
from agentruns.sweeper import SWEEPER_LEASE_NAME

log = logging.getLogger("holdfast.health")

T = TypeVar("T")
CHECKS = ("database", "migrations", "sweeper", "queue")


# --- bounded reads ------------------------------------------------------------------


class ProbeFailed(Exception):
    """The database did not answer a probe in time, or refused it."""


_probe_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="holdfast-probe")


def probe(read: Callable[[], T], *, timeout: float) -> T:
    """``read()`` against the default database, answered within ``timeout`` seconds or
    ``ProbeFailed``.

    On PostgreSQL the read runs in a transaction whose statement timeout is
    ``timeout``; whatever the database, the caller stops waiting at the deadline.
    A read that hangs anyway (a connection that never completes) keeps the probe
    thread; later probes queue behind it, time out, and are withdrawn unstarted,
    so a hung database costs one thread, never one per probe.
    """
    future: Future[T] = _probe_thread.submit(_bounded, read, timeout)
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        future.cancel()
        raise ProbeFailed(f"no answer within {timeout:g} s") from None


def _bounded(read: Callable[[], T], timeout: float) -> T:
    connection = connections["default"]
    try:
        if connection.vendor != "postgresql":
            # SQLite: plain reads in autocommit. A transaction here would be BEGIN
            # IMMEDIATE (settings), taking the engine's write lock; reads under WAL wait
            # for nobody, and the busy timeout bounds anything else.
            return read()
        with transaction.atomic(using="default"), connection.cursor() as cursor:
            cursor.execute(
                "SELECT set_config('statement_timeout', %s, true)", [str(int(timeout * 1000))]
            )
            return read()
    finally:
        # The probe thread keeps no connection between probes: one connect every few
        # seconds is cheap, and an idle connection would hold a slot of the
        # database's connection budget (and, after an outage, be a broken one).
        connections.close_all()


def _isolated(read: Callable[[], T]) -> T:
    """One check inside the probe's transaction: on PostgreSQL a failed statement would
    abort the transaction, so each check gets a savepoint of its own."""
    if connections["default"].vendor != "postgresql":
        return read()
    with transaction.atomic(using="default"):
        return read()


def db_now() -> datetime:
    """The database's clock (every age here is measured against it, not a host's)."""
    connection = connections["default"]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_sql(connection.vendor)}")
        value = cursor.fetchone()[0]
    if isinstance(value, datetime):
        return value
    return timezone.make_aware(typecast_timestamp(value), UTC)


# --- what the checks and the metrics read -----------------------------------------------


@dataclass(frozen=True)
class SweeperLeaseState:
    # None: no sweeper has held the lease, or the last one handed it back.
    expires_at: datetime | None
    now: datetime

    @property
    def held(self) -> bool:
        return self.expires_at is not None and self.expires_at > self.now

    @property
    def overdue_seconds(self) -> float | None:
        """How long ago the lease expired (negative: still held); None if nobody holds it."""
        if self.expires_at is None:
            return None
        return (self.now - self.expires_at).total_seconds()


def sweeper_lease() -> SweeperLeaseState:
    now = db_now()
    expires_at = (
        SweeperLease.objects.filter(name=SWEEPER_LEASE_NAME)
        .values_list("expires_at", flat=True)
        .first()
    )
    return SweeperLeaseState(expires_at=expires_at, now=now)


# Runs that are due and that no worker holds, each with the column that says since
# when it has waited and the partial index that finds them (agentruns.models.Run):
# - queued (run_queued): since it was queued. Its last change, not enqueued_at: the
#   sweeper re-knocks on a queued run every HOLDFAST_REQUEUE_AFTER_SECONDS, moving
#   enqueued_at, so enqueued_at would hide workers that take nothing.
# - sleeping or waiting for a retry, and due (run_due_wakeups): since next_attempt_at.
# - running or compensating with an expired lease (run_leases): since the lease
#   expired; the sweeper or the next claim recovers it.
def _backlog_sets():
    now = DbNow()
    return {
        "queued": (
            Run.objects.filter(status=RunStatus.QUEUED).filter(
                Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now)
            ),
            "updated_at",
        ),
        "due": (
            Run.objects.filter(status__in=list(TIMED_STATUSES), next_attempt_at__lte=now),
            "next_attempt_at",
        ),
        "lease_expired": (
            Run.objects.filter(
                status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING],
                lease_expires_at__lt=now,
            ),
            "lease_expires_at",
        ),
    }


@dataclass(frozen=True)
class Backlog:
    """Due runs no worker holds, by why they are due: how many, and the longest wait."""

    depth: dict[str, int]
    waited_seconds: dict[str, float]

    @property
    def lag_seconds(self) -> float:
        return max(self.waited_seconds.values(), default=0.0)


def backlog() -> Backlog:
    now = db_now()
    depth: dict[str, int] = {}
    waited: dict[str, float] = {}
    for reason, (runs, since_column) in _backlog_sets().items():
        row = runs.aggregate(n=Count("pk"), since=Min(since_column))
        depth[reason] = row["n"]
        since = row["since"]
        waited[reason] = max(0.0, (now - since).total_seconds()) if since else 0.0
    return Backlog(depth=depth, waited_seconds=waited)


# --- readiness ------------------------------------------------------------------------


def _migrations_check() -> str:
    connection = connections["default"]
    executor = MigrationExecutor(connection)
    unapplied = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return "ok" if not unapplied else f"{len(unapplied)} unapplied migration(s)"


def _sweeper_check() -> str:
    lease = sweeper_lease()
    overdue = lease.overdue_seconds
    if overdue is None:
        return "no sweeper holds its lease"
    if overdue > settings.HOLDFAST_READY_SWEEPER_GRACE_SECONDS:
        return f"the sweeper's lease expired {overdue:.0f} s ago"
    return "ok"


def _queue_check() -> str:
    limit = settings.HOLDFAST_READY_QUEUE_LAG_SECONDS
    lag = backlog().lag_seconds
    if lag > limit:
        return f"a due run has waited {lag:.0f} s for a worker (limit {limit:g} s)"
    return "ok"


def _checks() -> dict[str, str]:
    results: dict[str, str] = {}
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
    results["database"] = "ok"
    for name, check in (
        ("migrations", _migrations_check),
        ("sweeper", _sweeper_check),
        ("queue", _queue_check),
    ):
        try:
            results[name] = _isolated(check)
        except Exception as exc:
            log.warning("readiness check %s failed: %s: %s", name, type(exc).__name__, exc)
            results[name] = f"could not be read ({type(exc).__name__})"
    return results


def readiness() -> dict[str, str]:
    """Each check's result: "ok", or why not (nothing a caller without a login may not see)."""
    try:
        return probe(_checks, timeout=settings.HOLDFAST_PROBE_TIMEOUT_SECONDS)
    except ProbeFailed as exc:
        reason = str(exc)
    except DatabaseError as exc:
        # The message may name the host or the user; the log keeps it, the answer not.
        log.warning("readiness: database unreachable: %s: %s", type(exc).__name__, exc)
        reason = f"unreachable ({type(exc).__name__})"
    return {"database": reason, **{name: "not checked" for name in CHECKS[1:]}}


# --- the views ------------------------------------------------------------------------


@login_not_required
@never_cache
@require_GET
def healthz(request):
    """The process is up and answers; it touches no database."""
    return JsonResponse({"status": "ok"})


@login_not_required
@never_cache
@require_GET
def readyz(request):
    checks = readiness()
    failed = [name for name, result in checks.items() if result != "ok"]
    _log_change(failed, checks)
    body = {"status": "not ready" if failed else "ready", "failed": failed, "checks": checks}
    answer = JsonResponse(body, status=503 if failed else 200)
    # A 503 here is an answer, not a server error: Django would log every one of them
    # (one line per probe, every few seconds); _log_change logs one per change.
    answer._has_been_logged = True
    return answer


_last_failed: list[str] = []


def _log_change(failed: list[str], checks: dict[str, str]) -> None:
    global _last_failed
    if failed == _last_failed:
        return
    if failed:
        log.warning("not ready: %s", "; ".join(f"{name}: {checks[name]}" for name in failed))
    else:
        log.info("ready again")
    _last_failed = failed
