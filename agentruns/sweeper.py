"""The sweeper: gives every working run whose next move is due a worker.

One pass performs the sweeper's duties in order. The composition root
(``config/wiring.py``) lists them: the run duties defined here (wake runs whose
retry or timer is due, recover runs whose lease expired, re-enqueue queued runs
nobody picked up, report runs with nobody responsible for them) and the ones
the approvals and reconciliation apps offer. The sweeper never advances a run
itself, and it never wakes one run twice within django-q2's redelivery interval
(DESIGN §12.5): the claim decides, the sweeper only knocks. One sweeper is
active at a time, by a lease row (DESIGN §12.9).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db.models import DateTimeField, ExpressionWrapper, F, Q
from django_q.brokers import get_broker
from django_q.tasks import async_task

from agentruns.dbclock import DbNow
from agentruns.models import TIMED_STATUSES, Run, RunStatus, SweeperLease

log = logging.getLogger("holdfast.sweeper")

SWEEPER_LEASE_NAME = "sweeper"
# Held across one provider lookup of a reconciliation case (its timeout is 5 s).
LOOKUP_LEASE_SECONDS = 15.0


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

    def keep_lease(self) -> bool:
        """Renew the sweeper's lease for one provider call; False once it is lost.

        Duties that call providers ask before each call, so a pass never outlives
        its lease (DESIGN §12.9).
        """
        return acquire_sweeper_lease(self.owner, ttl=LOOKUP_LEASE_SECONDS)


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


def sweep(*, owner: str, push: Callable[[str], None], limit: int = 500) -> SweepReport | None:
    """One pass. Returns None when another sweeper holds the lease."""
    conf = settings.HOLDFAST
    if not acquire_sweeper_lease(owner, ttl=max(5.0, conf["SWEEP_INTERVAL_SECONDS"] * 4)):
        return None
    if not _duties:
        raise RuntimeError("the sweeper has no duties: config.wiring.install() did not run")
    sweep_pass = SweepPass(owner=owner, push=push, limit=limit, report=SweepReport())
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


def _knock(sweep_pass: SweepPass, runs, bucket: list[str]) -> None:
    for run_id, enqueued_at in runs.values_list("id", "enqueued_at")[: sweep_pass.limit]:
        # Compare-and-set on enqueued_at: a second sweeper (or a pass that
        # overlaps this one) cannot knock on the same run twice.
        if Run.objects.filter(pk=run_id, enqueued_at=enqueued_at).update(enqueued_at=DbNow()):
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


def push_advance(run_id: str) -> None:
    async_task("agentruns.tasks.advance_run", run_id, group="advance_run")
