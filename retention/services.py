"""Keeping the run tables bounded: each tenant's retention and personal-data redaction.

Two passes, each over the runs of the tenants it is given, bounded by a batch size:

- redaction: ``Tenant.personal_data_days`` after a run ended, the inputs, requests and
  results of its steps that carry personal data are replaced by a redaction marker that
  keeps their hash (``agentruns.archives.redaction_marker``). A tool step carries it when
  its tool declares ``personal_data`` (``@tool``); the run's model steps too, since their
  conversation quotes those tools' arguments and answers.
- archive: ``Tenant.retention_days`` after a run ended, its events and its steps'
  payloads are written as one document (``agentruns.archives``) and removed from the hot
  tables. The run row and its step rows stay (docs/architecture.md §3.14 says why).

Never touched, whatever its age: a run that has not ended, a run with an open
reconciliation case, a run with an approval that is pending or approved and not yet
consumed. The candidates' query leaves them out, and each run is checked again under
its row lock before anything is written.

Each run is redacted, or archived and pruned, in its own transaction. The document is
written inside it, before the prune: a crash in between rolls the prune back and leaves
the document, which the next pass writes again (the same bytes, the same name) before it
prunes. A pruned run without its archive cannot happen.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from accounts.models import Tenant
from agentruns.archives import (
    REDACTED_KEY,
    archive_document,
    archive_write,
    is_redacted,
    redaction_marker,
)
from agentruns.models import TERMINAL_STATUSES, Blob, Run, RunEvent, Step, StepKind
from agentruns.services import get_registry
from approvals.models import LIVE_STATUSES, Approval
from reconciliation.models import CaseStatus, ReconciliationCase

log = logging.getLogger("holdfast.retention")

REDACTION_REASON = "personal data"


@dataclass
class RetentionReport:
    """What one pass did (or, dry, would do), per tenant slug."""

    redacted: dict[str, int] = field(default_factory=dict)
    archived: dict[str, int] = field(default_factory=dict)
    # Runs whose redaction or archive raised (logged); each is tried again next pass.
    failed: dict[str, int] = field(default_factory=dict)

    def add(self, bucket: dict[str, int], slug: str, count: int = 1) -> None:
        if count:
            bucket[slug] = bucket.get(slug, 0) + count

    @property
    def total(self) -> int:
        return sum(self.redacted.values()) + sum(self.archived.values())


# --- which runs --------------------------------------------------------------------


def _open_case():
    return Exists(ReconciliationCase.objects.filter(run=OuterRef("pk"), status=CaseStatus.OPEN))


def _live_approval():
    # Pending, or approved and not yet consumed by its effect (approval_step_latest).
    return Exists(Approval.objects.filter(run=OuterRef("pk"), status__in=LIVE_STATUSES))


def _periods(tenants: Iterable[Tenant], days_of) -> list[tuple[int, list[int]]]:
    """(days, tenant ids) for each distinct period ``days_of(tenant)`` among ``tenants``
    (None: the tenant has none): one query per period, however many tenants share it."""
    by_days: dict[int, list[int]] = {}
    for tenant in tenants:
        days = days_of(tenant)
        if days is not None:
            by_days.setdefault(days, []).append(tenant.pk)
    return sorted(by_days.items())


def _ended_before(tenants: Iterable[Tenant], days_of) -> Q | None:
    """Runs of ``tenants`` that ended more than their tenant's ``days_of(tenant)`` ago."""
    periods = _periods(tenants, days_of)
    if not periods:
        return None
    now = timezone.now()
    condition = Q()
    for days, tenant_ids in periods:
        condition |= Q(tenant_id__in=tenant_ids, finished_at__lt=now - timedelta(days=days))
    return condition


def _candidates(tenants: Iterable[Tenant], days_of) -> list[QuerySet[Run]]:
    """Per distinct period, its tenants' ended runs past it, not archived and not held.

    Ordered as the partial indexes are (tenant, finished_at): the scan reads the index in
    order and stops at the batch, wherever the backlog has got to (an unordered LIMIT lets
    PostgreSQL pick a sequential scan that reads every archived row before the first
    candidate).
    """
    now = timezone.now()
    return [
        Run.objects.filter(tenant_id__in=tenant_ids, finished_at__lt=now - timedelta(days=days))
        .filter(finished_at__isnull=False, archived_at__isnull=True)
        .filter(status__in=sorted(TERMINAL_STATUSES))
        .exclude(_open_case())
        .exclude(_live_approval())
        .order_by("tenant_id", "finished_at")
        for days, tenant_ids in _periods(tenants, days_of)
    ]


def archive_candidates(tenants: Iterable[Tenant]) -> list[QuerySet[Run]]:
    """Ended runs past their tenant's retention period, not held (index run_to_archive)."""
    return _candidates(tenants, lambda t: t.retention_days)


def redaction_candidates(tenants: Iterable[Tenant]) -> list[QuerySet[Run]]:
    """Ended runs past their tenant's personal-data period, not yet redacted, not held
    (index run_to_redact); none when no tenant redacts earlier than it archives."""
    return [
        runs.filter(personal_data_redacted_at__isnull=True)
        for runs in _candidates(tenants, lambda t: t.personal_data_days)
    ]


def _first(candidates: list[QuerySet[Run]], limit: int) -> list[tuple]:
    """(run id, tenant id) of up to ``limit`` runs, period after period."""
    found: list[tuple] = []
    for runs in candidates:
        if len(found) >= limit:
            break
        found += runs.values_list("pk", "tenant_id")[: limit - len(found)]
    return found


def held_runs(tenants: Iterable[Tenant]) -> QuerySet[Run] | None:
    """Runs past their tenant's retention period that are kept: ended with an open case
    or an unconsumed approval, or started that long ago and not ended."""
    tenants = list(tenants)
    ended = _ended_before(tenants, lambda t: t.retention_days)
    if ended is None:
        return None
    now = timezone.now()
    started = Q(pk__in=[])
    for tenant in tenants:
        cutoff = now - timedelta(days=tenant.retention_days)
        started |= Q(tenant_id=tenant.pk, created_at__lt=cutoff)
    not_ended = Q(finished_at__isnull=True) | ~Q(status__in=sorted(TERMINAL_STATUSES))
    return (
        Run.objects.filter(archived_at__isnull=True)
        .filter((ended & (_open_case() | _live_approval())) | (started & not_ended))
        .order_by()
    )


def _is_held(run: Run) -> bool:
    """Checked again under the run's lock: a case or an approval may have come since."""
    return (
        run.status not in TERMINAL_STATUSES
        or run.finished_at is None
        or ReconciliationCase.objects.filter(run=run, status=CaseStatus.OPEN).exists()
        or Approval.objects.filter(run=run, status__in=LIVE_STATUSES).exists()
    )


# --- redaction ---------------------------------------------------------------------


def _personal_tools(run: Run) -> set[str]:
    """The tools of ``run`` that declare personal data, as pinned when it started; for a
    run pinned before tools declared it, as its agent version declares it now."""
    pinned = (run.agent_snapshot or {}).get("tools") or {}
    if pinned and all("personal_data" in spec for spec in pinned.values()):
        return {name for name, spec in pinned.items() if spec.get("personal_data")}
    agent = get_registry().get(run.agent_name, run.agent_version)
    if agent is None:
        return {name for name, spec in pinned.items() if spec.get("personal_data")}
    return {t.name for t in agent.tools if t.personal_data}


def _redact_steps(run: Run) -> int:
    """Replace the personal-data payloads of ``run``'s steps by markers; how many steps."""
    personal = _personal_tools(run)
    steps = list(run.steps.order_by("seq"))
    if not any(s.kind != StepKind.MODEL and s.name in personal for s in steps):
        return 0
    redacted = 0
    released: set[str] = set()
    for step in steps:
        # The model steps' conversation quotes what those tools were given and answered.
        if step.kind != StepKind.MODEL and step.name not in personal:
            continue
        changes = {}
        for column in ("input", "request"):
            value = getattr(step, column)
            if value is not None and not is_redacted(value):
                changes[column] = redaction_marker(value, reason=REDACTION_REASON)
        if step.result_blob_id:
            # The blob's content hash is the step's result_hash, which stays.
            marker = {REDACTED_KEY: REDACTION_REASON, "sha256": step.result_blob_id}
            changes.update(result=marker, result_blob=None)
            released.add(step.result_blob_id)
        elif step.result is not None and not is_redacted(step.result):
            changes["result"] = redaction_marker(step.result, reason=REDACTION_REASON)
        if changes:
            Step.objects.filter(pk=step.pk).update(**changes)
            redacted += 1
    _blobs_release(released)
    return redacted


def run_redact(run_id) -> bool:
    """Redact one run's personal-data payloads in one transaction. False if it is held,
    archived or already redacted (another pass, or the operator's command, was first)."""
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .filter(pk=run_id, archived_at__isnull=True, personal_data_redacted_at__isnull=True)
            .first()
        )
        if run is None or _is_held(run):
            return False
        _redact_steps(run)
        Run.objects.filter(pk=run.pk).update(personal_data_redacted_at=timezone.now())
        return True


# --- archive and prune -------------------------------------------------------------


def _blobs_release(blob_ids: Iterable[str]) -> None:
    """Delete the blobs no step refers to any more; their files once the commit is made
    (a rolled-back prune keeps both)."""
    for sha256 in sorted(blob_ids):
        if Step.objects.filter(result_blob_id=sha256).exists():
            continue  # content-addressed: another step recorded the same result
        blob = Blob.objects.filter(pk=sha256).first()
        if blob is None:
            continue
        blob.delete()
        transaction.on_commit(lambda name=blob.storage_name: default_storage.delete(name))


def archive_prune(run: Run, steps: list[Step], *, name: str, sha256: str) -> None:
    """Remove what the archive now holds from the hot tables and point the run at it."""
    Step.objects.filter(run=run).update(input=None, request=None, result=None, result_blob=None)
    RunEvent.objects.filter(run=run).delete()
    Run.objects.filter(pk=run.pk).update(
        archived_at=timezone.now(), archive_name=name, archive_sha256=sha256
    )
    _blobs_release({s.result_blob_id for s in steps if s.result_blob_id})


def run_archive_and_prune(run_id, *, personal_data_days: int | None) -> bool:
    """Archive one run and prune it, in one transaction; False if it is held or archived.
    ``personal_data_days``: its tenant's; when set, a run not yet redacted is redacted
    first.

    The document is written under the run's lock, before the prune, so it holds exactly
    what is pruned: nothing can add an event to the run in between.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id, archived_at__isnull=True).first()
        if run is None or _is_held(run):
            return False
        if personal_data_days is not None and run.personal_data_redacted_at is None:
            # An archive written after the redaction period holds the markers too.
            _redact_steps(run)
            Run.objects.filter(pk=run.pk).update(personal_data_redacted_at=timezone.now())
        steps = list(run.steps.order_by("seq"))
        events = list(run.events.order_by("id"))
        name, sha256 = archive_write(run, archive_document(run, steps, events))
        archive_prune(run, steps, name=name, sha256=sha256)
        return True


# --- a pass ------------------------------------------------------------------------


def _one_run(report: RetentionReport, slug: str, work, run_id) -> bool:
    """``work(run_id)``; a run that fails (a blob's file gone, say) is logged and counted,
    and the pass goes on with the next: its transaction rolled back, nothing of it changed."""
    try:
        return work(run_id)
    except Exception:
        log.exception("retention: run %s of %s failed; it is tried again next pass", run_id, slug)
        report.add(report.failed, slug)
        return False


def retention_pass(
    *,
    tenants: list[Tenant] | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    keep_going=None,
) -> RetentionReport:
    """One pass over ``tenants`` (all when None): redact, then archive, at most ``limit``
    runs each (``HOLDFAST["RETENTION_BATCH_RUNS"]`` when None). Dry, it only counts.

    ``keep_going`` is asked before each run; the sweeper stops when its lease is lost.
    """
    tenants = list(Tenant.objects.order_by("pk")) if tenants is None else tenants
    limit = settings.HOLDFAST["RETENTION_BATCH_RUNS"] if limit is None else limit
    report = RetentionReport()
    slugs = {t.pk: t.slug for t in tenants}
    days = {t.pk: t.personal_data_days for t in tenants}

    for run_id, tenant_id in _first(redaction_candidates(tenants), limit):
        if keep_going is not None and not keep_going():
            return report
        if dry_run or _one_run(report, slugs[tenant_id], run_redact, run_id):
            report.add(report.redacted, slugs[tenant_id])

    for run_id, tenant_id in _first(archive_candidates(tenants), limit):
        if keep_going is not None and not keep_going():
            return report
        archive = partial(run_archive_and_prune, personal_data_days=days[tenant_id])
        if dry_run or _one_run(report, slugs[tenant_id], archive, run_id):
            report.add(report.archived, slugs[tenant_id])
    return report


def held_counts(tenants: list[Tenant]) -> dict[str, int]:
    """How many runs past each tenant's retention period are kept, and so not archived."""
    held = held_runs(tenants)
    if held is None:
        return {}
    slugs = {t.pk: t.slug for t in tenants}
    counts: dict[str, int] = {}
    for tenant_id in held.values_list("tenant_id", flat=True):
        counts[slugs[tenant_id]] = counts.get(slugs[tenant_id], 0) + 1
    return counts


_last_pass = 0.0


def retention_duty(sweep_pass) -> None:
    """The sweeper's duty: a retention pass every ``RETENTION_INTERVAL_SECONDS``.

    With nothing to do it costs the tenants' settings (a handful of rows) and, per
    distinct period, one query on each partial index (run_to_redact, run_to_archive)
    that finds no entry.
    """
    global _last_pass
    interval = settings.HOLDFAST["RETENTION_INTERVAL_SECONDS"]
    if time.monotonic() - _last_pass < interval:
        return
    _last_pass = time.monotonic()
    report = retention_pass(keep_going=sweep_pass.keep_lease)
    if report.total or report.failed:
        sweep_pass.report.retention = {
            "redacted": sum(report.redacted.values()),
            "archived": sum(report.archived.values()),
            "failed": sum(report.failed.values()),
        }
        log.info(
            "retention: redacted %d runs, archived %d runs",
            sum(report.redacted.values()),
            sum(report.archived.values()),
        )
