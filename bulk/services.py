"""Bulk actions on runs: what a confirmation says, and carrying the action out.

The set of runs is fixed when the operator confirms (``BulkItem`` rows). A worker
carries it out in the background, one run at a time through the same engine calls
and audit rows as the run page's buttons. Each item is claimed by a conditional
UPDATE (waiting → working) so two workers never act on one run twice; an item left
"working" by a worker that died is handed out again after ``STALE_SECONDS`` (the
engine's cancel and wake are safe to repeat: a run already cancelled is skipped).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from accounts.models import Tenant
from accounts.services import audit_record, for_tenant, user_actor_name
from agentruns.models import TERMINAL_STATUSES, Run, RunStatus, Step
from agentruns.runtime.engine import CancelRefused
from agentruns.services import run_cancel, run_wake
from agentruns.sweeper import claim_batch
from bulk.models import BulkAction, BulkItem

log = logging.getLogger("holdfast.bulk")

# The most runs one bulk action takes: a larger set is narrowed with the filters.
MAX_RUNS = 5000
# A claimed item whose worker has not finished it in this long is handed out again.
STALE_SECONDS = 120
RETRYABLE = (RunStatus.WAITING_FOR_RETRY, RunStatus.SLEEPING)
PERMISSION = {BulkAction.Kind.CANCEL: "cancel_runs", BulkAction.Kind.RETRY: "retry_runs"}


class BulkRefused(Exception):
    """The operator may not take this bulk action, or there is nothing to take it on."""


def why_not(kind: str, run: Run) -> str:
    """Why ``kind`` does nothing to ``run`` in its state now; "" when it applies."""
    if kind == BulkAction.Kind.CANCEL:
        if run.status in TERMINAL_STATUSES:
            return "already ended"
        if run.status == RunStatus.EFFECT_UNKNOWN:
            return "an effect's outcome is unknown: settle it before cancelling"
        return ""
    if run.status not in RETRYABLE:
        return "not waiting to retry"
    return ""


@dataclass
class Plan:
    """What confirming would do: the runs it applies to, those it skips and why, and
    the effects in flight a cancel does not recall."""

    kind: str
    run_ids: list[uuid.UUID]
    by_state: list[tuple[str, int]]
    applies: int
    skipped: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    too_many: bool = False


def bulk_plan(tenant: Tenant, kind: str, run_ids: list[uuid.UUID]) -> Plan:
    runs = for_tenant(Run.objects.all(), tenant).filter(pk__in=run_ids[: MAX_RUNS + 1])
    found = list(runs.only("id", "status"))
    skipped: dict[str, int] = {}
    for run in found:
        reason = why_not(kind, run)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
    states = runs.values_list("status").annotate(n=Count("id")).order_by("-n", "status")
    in_flight = 0
    if kind == BulkAction.Kind.CANCEL:
        in_flight = (
            Step.objects.filter(run__in=runs, in_flight=True)
            .exclude(run__status__in=TERMINAL_STATUSES)
            .values("run_id")
            .distinct()
            .count()
        )
    return Plan(
        kind=kind,
        run_ids=[run.id for run in found][:MAX_RUNS],
        by_state=list(states),
        applies=len(found) - sum(skipped.values()),
        skipped=skipped,
        in_flight=in_flight,
        too_many=len(run_ids) > MAX_RUNS,
    )


def bulk_start(
    *, tenant: Tenant, user, kind: str, run_ids: list[uuid.UUID], selection: dict, request=None
) -> BulkAction:
    """Record the confirmed action with its runs, audited, and hand it to a worker."""
    if kind not in PERMISSION:
        raise BulkRefused("choose cancel or retry now")
    if not user.has_perm(f"accounts.{PERMISSION[kind]}"):
        raise BulkRefused(f"your role may not {BulkAction.Kind(kind).label} runs")
    plan = bulk_plan(tenant, kind, run_ids)
    if plan.too_many:
        raise BulkRefused(f"more than {MAX_RUNS} runs: narrow the selection with the filters")
    if not plan.run_ids:
        raise BulkRefused("no run of this tenant is selected")
    actor = user_actor_name(user)
    with transaction.atomic():
        action = BulkAction.objects.create(
            tenant=tenant,
            kind=kind,
            requested_by=user,
            actor=actor,
            selection=selection,
            total=len(plan.run_ids),
        )
        BulkItem.objects.bulk_create(BulkItem(action=action, run_id=pk) for pk in plan.run_ids)
        audit_record(
            tenant=tenant,
            actor=actor,
            action=f"runs.bulk_{kind}",
            object_type="bulk",
            object_id=str(action.pk),
            after={"runs": action.total, "selection": selection},
            request=request,
        )
        transaction.on_commit(lambda: enqueue_bulk(action.pk))
    return action


def enqueue_bulk(action_id: int) -> None:
    from django_q.tasks import async_task

    async_task("bulk.tasks.carry_out", action_id, group="bulk")


def _claim(action: BulkAction) -> BulkItem | None:
    """The next item to act on, claimed: waiting, or working for too long."""
    stale = timezone.now() - timedelta(seconds=STALE_SECONDS)
    candidates = action.items.filter(
        Q(state=BulkItem.State.WAITING) | Q(state=BulkItem.State.WORKING, claimed_at__lt=stale)
    ).order_by("id")
    for item in candidates[:20]:
        # Compare-and-set on what we read: two workers never take the same item.
        taken = BulkItem.objects.filter(pk=item.pk, state=item.state, claimed_at=item.claimed_at)
        if taken.update(state=BulkItem.State.WORKING, claimed_at=timezone.now()) == 1:
            item.state = BulkItem.State.WORKING
            return item
    return None


def _act(action: BulkAction, run: Run | None) -> tuple[bool, str]:
    """(skipped, what happened) for one run."""
    if run is None:
        return True, "no longer exists"
    reason = why_not(action.kind, run)
    if reason:
        return True, reason
    before = {"status": run.status}
    if action.kind == BulkAction.Kind.CANCEL:
        try:
            run = run_cancel(run.id, by=action.actor)
        except CancelRefused as exc:
            return True, str(exc)
        outcome, audit_action = f"cancel requested; now {run.status}", "run.cancel"
    else:
        if not run_wake(run.id, by=action.actor):
            run.refresh_from_db()
            return True, f"not waiting to retry (now {run.status})"
        run.refresh_from_db()
        outcome, audit_action = "will retry now", "run.retry_now"
    audit_record(
        tenant=action.tenant,
        actor=action.actor,
        action=audit_action,
        object_type="run",
        object_id=str(run.id),
        before=before,
        after={"status": run.status, "bulk": action.pk},
    )
    return False, outcome


def carry_out(action_id: int) -> int:
    """Act on every item of the bulk action not done yet; the number acted on."""
    action = BulkAction.objects.select_related("tenant").get(pk=action_id)
    acted = 0
    while (item := _claim(action)) is not None:
        run = for_tenant(Run.objects.all(), action.tenant).filter(pk=item.run_id).first()
        try:
            skipped, outcome = _act(action, run)
        except Exception as exc:  # one run's failure is its own, not the batch's
            log.exception("bulk %s: run %s", action.pk, item.run_id)
            skipped, outcome = True, f"failed: {type(exc).__name__}"
        BulkItem.objects.filter(pk=item.pk, state=BulkItem.State.WORKING).update(
            state=BulkItem.State.DONE, skipped=skipped, outcome=outcome[:500]
        )
        acted += 0 if skipped else 1
    if not action.items.exclude(state=BulkItem.State.DONE).exists():
        BulkAction.objects.filter(pk=action.pk, finished_at=None).update(finished_at=timezone.now())
    return acted


def bulk_resume_duty(sweep_pass) -> None:
    """The sweeper's duty: a bulk action whose task was lost (a worker died, the broker
    lost it) is handed to a worker again, at most once per ``STALE_SECONDS``."""
    stale = timezone.now() - timedelta(seconds=STALE_SECONDS)

    def hand_out(row: tuple) -> bool:
        # Compare-and-set on enqueued_at: one hand-out per action, whoever else looks.
        action_id, enqueued_at = row
        again = BulkAction.objects.filter(pk=action_id, enqueued_at=enqueued_at)
        return again.update(enqueued_at=timezone.now()) == 1

    lost = BulkAction.objects.filter(finished_at=None, enqueued_at__lt=stale)
    # A batch (SKIP LOCKED on PostgreSQL: an action whose worker is writing its row
    # this moment is left for the next pass); the tasks go out after its commit.
    for action_id, _ in claim_batch(lost.values_list("pk", "enqueued_at"), 20, hand_out):
        enqueue_bulk(action_id)


def progress(action: BulkAction) -> dict:
    counts = dict(action.items.values_list("state").annotate(n=Count("id")).order_by())
    done = counts.get(BulkItem.State.DONE, 0)
    return {
        "done": done,
        "total": action.total,
        "percent": int(100 * done / action.total) if action.total else 100,
        "acted": action.items.filter(state=BulkItem.State.DONE, skipped=False).count(),
        "skipped": list(action.items.filter(skipped=True).order_by("id")[:500]),
        "finished": action.finished_at is not None,
    }
