"""The sweeper: gives every working run whose next move is due a worker.

One pass performs the sweeper's duties in order. The composition root
(``config/wiring.py``) lists them: the run duties defined here (wake runs whose
retry or timer is due, recover runs whose lease expired, re-enqueue queued runs
nobody picked up, report runs with nobody responsible for them) and the ones
the approvals and reconciliation apps offer. The sweeper never advances a run
itself, and it never wakes one run twice within django-q2's redelivery interval
(DESIGN §12.5): the claim decides, the sweeper only knocks. One sweeper is
active at a time, by a lease row (DESIGN §12.9).

Each duty claims its due rows in a batch. On PostgreSQL the batch is selected
``FOR UPDATE SKIP LOCKED`` in a short transaction, so a second sweeper (one whose
lease lapsed mid-pass while another took it over), a worker's own
``_help_recover``, or an engine transition holding a run's row never makes a batch
wait, and two claimers take disjoint rows instead of racing for the same ones. The
compare-and-set on each row still decides who knocks: it is the rule on SQLite,
which has no row locks (its one writer already serialises the batches).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, QuerySet
from django_q.brokers import get_broker
from django_q.models import OrmQ
from django_q.tasks import async_task

from agentruns.broker import queue_row
from agentruns.dbclock import DbNow
from agentruns.models import TIMED_STATUSES, Run, RunStatus, SweeperLease

log = logging.getLogger("holdfast.sweeper")

SWEEPER_LEASE_NAME = "sweeper"


@dataclass
class SweepReport:
    woken: list[str] = field(default_factory=list)
    recovered: list[str] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    # Runs waiting for approval whose approval was decided (or renewed) while
    # the wake-up was lost.
    resumed: list[str] = field(default_factory=list)
    approvals_expired: int = 0
    # Reconciliation: cases opened, closed by a late answer, looked up again.
    cases: dict[str, int] = field(default_factory=dict)
    # Working runs with nobody responsible for their next move (DESIGN §5).
    orphaned: list[str] = field(default_factory=list)
    # Retention: runs whose personal data was redacted, runs archived.
    retention: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.woken) + len(self.recovered) + len(self.requeued) + len(self.resumed)


@dataclass(frozen=True)
class SweepPass:
    """What a duty may use during one pass."""

    owner: str
    push: Callable[[str], None]
    limit: int
    report: SweepReport
    # Hands any other work to a worker: ``enqueue("app.tasks.function", *args)``. A
    # duty never calls a provider itself (a slow one would hold up every recovery
    # behind it): it claims the work and enqueues a task that does it.
    enqueue: Callable[..., None] = field(default=lambda task, *args: enqueue_task(task, *args))

    def keep_lease(self) -> bool:
        """Renew the sweeper's lease before one more long item of a duty (a run's archive
        written to storage); False once it is lost, and the duty stops there, so a pass
        never outlives its lease."""
        return acquire_sweeper_lease(self.owner, ttl=sweeper_lease_seconds())


@dataclass(frozen=True)
class Duty:
    """One thing the sweeper does each pass, named for its logs."""

    name: str
    perform: Callable[[SweepPass], None]


_duties: tuple[Duty, ...] = ()


def install_duties(duties: tuple[Duty, ...]) -> None:
    """The composition root gives the sweeper its duties (config/wiring.py)."""
    global _duties
    _duties = tuple(duties)


def installed_duties() -> tuple[Duty, ...]:
    return _duties


def _ago(seconds: float):
    return ExpressionWrapper(DbNow() - timedelta(seconds=seconds), output_field=DateTimeField())


def sweeper_lease_seconds() -> float:
    """The sweeper's lease lives 4 sweep intervals, at least 5 s."""
    return max(5.0, settings.HOLDFAST["SWEEP_INTERVAL_SECONDS"] * 4)


def acquire_sweeper_lease(owner: str, ttl: float) -> bool:
    SweeperLease.objects.get_or_create(name=SWEEPER_LEASE_NAME)
    expires = ExpressionWrapper(DbNow() + timedelta(seconds=ttl), output_field=DateTimeField())
    taken = (
        SweeperLease.objects.filter(name=SWEEPER_LEASE_NAME)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__lt=DbNow()) | Q(owner=owner))
        .update(owner=owner, expires_at=expires)
    )
    return taken == 1


def release_sweeper_lease(owner: str) -> None:
    """A sweeper that stops hands the lease over at once instead of letting it lapse."""
    SweeperLease.objects.filter(name=SWEEPER_LEASE_NAME, owner=owner).update(expires_at=None)


def sweep(
    *,
    owner: str,
    push: Callable[[str], None],
    limit: int = 500,
    enqueue: Callable[..., None] | None = None,
) -> SweepReport | None:
    """One pass. Returns None when another sweeper holds the lease.

    ``enqueue`` hands the duties' other tasks (a provider lookup) to the workers;
    by default django-q2's queue.
    """
    if not acquire_sweeper_lease(owner, ttl=sweeper_lease_seconds()):
        return None
    if not _duties:
        raise RuntimeError("the sweeper has no duties: config.wiring.install() did not run")
    sweep_pass = SweepPass(owner=owner, push=push, limit=limit, report=SweepReport())
    if enqueue is not None:
        sweep_pass = replace(sweep_pass, enqueue=enqueue)
    for duty in _duties:
        duty.perform(sweep_pass)
    report = sweep_pass.report
    if report.total or report.approvals_expired:
        log.info(
            "sweep: woke %d, recovered %d, requeued %d, resumed %d; %d approvals expired",
            len(report.woken),
            len(report.recovered),
            len(report.requeued),
            len(report.resumed),
            report.approvals_expired,
        )
    return report


# --- the run duties -------------------------------------------------------------------


def row_locks() -> bool:
    """Whether the database can lock a batch's rows and skip those locked (PostgreSQL)."""
    return connection.features.has_select_for_update_skip_locked


def claim_batch(rows: QuerySet, limit: int, claim: Callable[[tuple], bool]) -> list[tuple]:
    """Claim up to ``limit`` of ``rows`` (a ``values_list`` whose first value is the
    primary key), each by ``claim(row)``, a compare-and-set that says whether it won.

    On PostgreSQL in one transaction over a ``SELECT … FOR UPDATE SKIP LOCKED``:
    rows another transaction holds (another sweeper's batch, a worker's
    ``_help_recover``, an engine transition on that run) are left for the next
    pass instead of waited on, and two claimers never select the same rows. On
    SQLite the compare-and-set alone decides, as before.
    """
    if not row_locks():
        return [row for row in rows[:limit] if claim(row)]
    with transaction.atomic():
        # of=("self",): lock the claimed table's rows only, never a joined one.
        batch = list(rows.select_for_update(skip_locked=True, of=("self",))[:limit])
        return [row for row in batch if claim(row)]


def _knock(sweep_pass: SweepPass, runs, bucket: list[str]) -> None:
    def knock(row: tuple) -> bool:
        run_id, enqueued_at = row
        # Compare-and-set on enqueued_at: a second sweeper (or a pass that
        # overlaps this one, or a worker's _help_recover on SQLite) cannot knock on
        # the same run twice; under the row lock it cannot fail, and stays the rule.
        return bool(
            Run.objects.filter(pk=run_id, enqueued_at=enqueued_at).update(enqueued_at=DbNow())
        )

    # The knocks go out once the batch committed: a worker that takes one at once
    # sees the new enqueued_at (and a knock lost after the commit is repaired
    # after the redelivery interval, as any lost knock).
    for run_id, _ in claim_batch(runs.values_list("id", "enqueued_at"), sweep_pass.limit, knock):
        sweep_pass.push(str(run_id))
        bucket.append(str(run_id))


def wake_due(sweep_pass: SweepPass) -> None:
    """Runs waiting for a retry or a timer whose time has come."""
    redelivered_before = _ago(settings.HOLDFAST["REDELIVERY_SECONDS"])
    due = Run.objects.filter(status__in=list(TIMED_STATUSES), next_attempt_at__lte=DbNow()).filter(
        Q(enqueued_at__isnull=True)
        | Q(enqueued_at__lt=F("next_attempt_at"))
        | Q(enqueued_at__lt=redelivered_before)
    )
    _knock(sweep_pass, due, sweep_pass.report.woken)


def recover_expired(sweep_pass: SweepPass) -> None:
    """Runs whose worker died or stalled: their lease expired while they were working."""
    redelivered_before = _ago(settings.HOLDFAST["REDELIVERY_SECONDS"])
    expired = Run.objects.filter(
        status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING], lease_expires_at__lt=DbNow()
    ).filter(
        Q(enqueued_at__isnull=True)
        | Q(enqueued_at__lt=F("lease_expires_at"))
        | Q(enqueued_at__lt=redelivered_before)
    )
    _knock(sweep_pass, expired, sweep_pass.report.recovered)


def waiting_knocks() -> int | None:
    """Knocks the broker holds that no worker has taken yet; None when it cannot tell."""
    try:
        return get_broker().queue_size()
    except Exception:
        return None


def requeue_stale(sweep_pass: SweepPass) -> None:
    """Queued runs whose wake-up was lost (the broker dropped it, or it never got there).

    Not while the broker still holds at least as many untaken knocks as there are
    such runs: then the workers are behind, not the knocks lost, and knocking again
    only lengthens the queue every run waits in (a soak of 1,000 runs made 9,377
    extra knocks that way). Once the backlog drains, a lost knock is repaired.
    """
    stale = (
        Run.objects.filter(status=RunStatus.QUEUED)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=DbNow()))
        .filter(
            Q(enqueued_at__isnull=True)
            | Q(enqueued_at__lt=_ago(settings.HOLDFAST["REQUEUE_AFTER_SECONDS"]))
        )
    )
    waiting = waiting_knocks()
    if waiting and waiting >= stale[: sweep_pass.limit].count():
        return
    _knock(sweep_pass, stale, sweep_pass.report.requeued)


def report_orphans(sweep_pass: SweepPass) -> None:
    """Working runs with nobody responsible for their next move (DESIGN §5): logged."""
    orphans = Run.objects.filter(
        Q(status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING], lease_expires_at__isnull=True)
        | Q(status__in=list(TIMED_STATUSES), next_attempt_at__isnull=True)
    ).values_list("id", "status")[: sweep_pass.limit]
    for run_id, status in orphans:
        sweep_pass.report.orphaned.append(str(run_id))
        log.error("run %s is %s with nobody responsible for its next move", run_id, status)


ADVANCE_TASK = "agentruns.tasks.advance_run"


def push_advance(run_id: str) -> None:
    async_task(ADVANCE_TASK, run_id, group="advance_run")


def advance_row(run_id: str) -> OrmQ | None:
    """``push_advance``'s task as a queue row to insert with the run (PostgreSQL only)."""
    return queue_row(ADVANCE_TASK, run_id, group="advance_run")


def enqueue_task(task: str, *args) -> None:
    """Put ``task`` (a dotted path) on django-q2's queue, grouped by its function's name."""
    async_task(task, *args, group=task.rsplit(".", 1)[-1])
