"""The sweeper: gives every working run whose next move is due a worker.

It wakes runs whose retry or timer is due, recovers runs whose lease expired
(their worker died or stalled), and re-enqueues queued runs nobody picked up.
It never advances a run itself, and it never wakes one run twice within
django-q2's redelivery interval (DESIGN §12.5): the claim decides, the sweeper
only knocks. One sweeper is active at a time, by a lease row (DESIGN §12.9).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db.models import DateTimeField, ExpressionWrapper, F, Q

from agentruns.dbclock import DbNow
from agentruns.models import TIMED_STATUSES, Run, RunStatus, SweeperLease
from agentruns.services import run_resume

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

    @property
    def total(self) -> int:
        return len(self.woken) + len(self.recovered) + len(self.requeued) + len(self.resumed)


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


def sweep(*, owner: str, push: Callable[[str], None], limit: int = 500) -> SweepReport | None:
    """One pass. Returns None when another sweeper holds the lease."""
    conf = settings.HOLDFAST
    if not acquire_sweeper_lease(owner, ttl=max(5.0, conf["SWEEP_INTERVAL_SECONDS"] * 4)):
        return None
    redelivered_before = _ago(conf["REDELIVERY_SECONDS"])
    report = SweepReport()

    due = Run.objects.filter(status__in=list(TIMED_STATUSES), next_attempt_at__lte=DbNow()).filter(
        Q(enqueued_at__isnull=True)
        | Q(enqueued_at__lt=F("next_attempt_at"))
        | Q(enqueued_at__lt=redelivered_before)
    )
    expired = Run.objects.filter(
        status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING], lease_expires_at__lt=DbNow()
    ).filter(
        Q(enqueued_at__isnull=True)
        | Q(enqueued_at__lt=F("lease_expires_at"))
        | Q(enqueued_at__lt=redelivered_before)
    )
    stale = (
        Run.objects.filter(status=RunStatus.QUEUED)
        .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=DbNow()))
        .filter(
            Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=_ago(conf["REQUEUE_AFTER_SECONDS"]))
        )
    )

    for queryset, bucket in (
        (due, report.woken),
        (expired, report.recovered),
        (stale, report.requeued),
    ):
        for run_id, enqueued_at in queryset.values_list("id", "enqueued_at")[:limit]:
            # Compare-and-set on enqueued_at: a second sweeper (or a pass that
            # overlaps this one) cannot knock on the same run twice.
            if Run.objects.filter(pk=run_id, enqueued_at=enqueued_at).update(enqueued_at=DbNow()):
                push(str(run_id))
                bucket.append(str(run_id))

    from approvals.services import approvals_expire, runs_with_decided_approvals
    from reconciliation.services import cases_sweep

    report.approvals_expired = approvals_expire()
    # Lookups call providers: each renews the lease for longer than its own timeout.
    report.cases = cases_sweep(
        limit=limit,
        push=lambda rid: push(str(rid)),
        keep_lease=lambda: acquire_sweeper_lease(owner, ttl=LOOKUP_LEASE_SECONDS),
    )
    for run_id in runs_with_decided_approvals(limit=limit):
        if run_resume(run_id, by="sweeper", enqueue=lambda rid: push(str(rid))):
            report.resumed.append(str(run_id))

    orphans = Run.objects.filter(
        Q(status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING], lease_expires_at__isnull=True)
        | Q(status__in=list(TIMED_STATUSES), next_attempt_at__isnull=True)
    ).values_list("id", "status")[:limit]
    for run_id, status in orphans:
        report.orphaned.append(str(run_id))
        log.error("run %s is %s with nobody responsible for its next move", run_id, status)
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


def push_advance(run_id: str) -> None:
    from django_q.tasks import async_task

    async_task("agentruns.tasks.advance_run", run_id, group="advance_run")
