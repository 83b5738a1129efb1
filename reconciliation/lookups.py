"""Automatic lookups as workers' tasks, claimed by lease, a few at a time per deployment.

The sweeper only claims: each pass, ``lookups_duty`` counts the lookups in flight
(cases whose ``lookup_lease_expires_at`` has not passed), claims due cases up to
``HOLDFAST_LOOKUP_CONCURRENCY`` minus that count, and enqueues one
``case_lookup_task`` per claim. A worker makes the lookup (``case_lookup_now``, the
same path an operator's "look up now" takes, so a conclusive answer resolves the
case as ``system``) and releases the claim. A provider that hangs therefore holds
at most that many workers for its timeout, and never the sweeper: recovering a
crashed run waits for no lookup.

A task that is lost (its worker died, the broker dropped it) leaves its lease to
lapse; the case is still due, so a later pass claims it again. A task that starts
after its lease lapsed does nothing: the claim's token no longer matches, and the
newer claim's task makes the lookup. A lookup is only a read, and a resolution a
compare-and-set on the case's version, so even two lookups of one case would write
nothing twice.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q

from agentruns import shutdown
from agentruns.dbclock import DbNow
from agentruns.models import SweeperLease
from agentruns.runtime.engine import new_owner_id
from agentruns.sweeper import SweepPass, row_locks
from reconciliation.desk import lookup_backoff
from reconciliation.models import CaseStatus, ReconciliationCase
from reconciliation.services import LOOKUP_TIMEOUT, case_lookup_now

log = logging.getLogger("holdfast.reconciliation")

LOOKUP_TASK = "reconciliation.lookups.case_lookup_task"
# A claim outlives one lookup (its provider timeout) with room for the task to wait
# in the queue and start; past it the case is claimed again.
LOOKUP_LEASE_SECONDS = 3 * LOOKUP_TIMEOUT
# The row whose lock serialises claimers on PostgreSQL, so that two of them (a
# sweeper whose lease lapsed mid-pass and the one that took over) cannot both count
# the same free slots. On SQLite the IMMEDIATE transaction's write lock does it.
CLAIMS_LOCK = "reconciliation-lookups"


def _lease_until():
    return ExpressionWrapper(
        DbNow() + timedelta(seconds=LOOKUP_LEASE_SECONDS), output_field=DateTimeField()
    )


def lookups_in_flight() -> int:
    """Automatic lookups claimed and not yet released or lapsed, deployment-wide."""
    return ReconciliationCase.objects.filter(lookup_lease_expires_at__gt=DbNow()).count()


def lookups_claim(*, limit: int) -> list[tuple[int, str]]:
    """Claim due automatic lookups up to the free slots; ``(case id, claim)`` each.

    One short transaction: the slots are counted and taken under the claimers'
    lock, the due cases selected ``FOR UPDATE SKIP LOCKED`` on PostgreSQL (a case an
    operator is resolving this moment is left for the next pass rather than waited
    on), and each claim is a compare-and-set on the lease, which is the rule on
    SQLite.
    """
    if row_locks():
        SweeperLease.objects.get_or_create(name=CLAIMS_LOCK)
    token = new_owner_id()
    claimed: list[tuple[int, str]] = []
    with transaction.atomic():
        if row_locks():
            SweeperLease.objects.select_for_update().filter(name=CLAIMS_LOCK).first()
        free = min(limit, settings.HOLDFAST["LOOKUP_CONCURRENCY"] - lookups_in_flight())
        if free <= 0:
            return []
        unclaimed = Q(lookup_lease_expires_at__isnull=True) | Q(
            lookup_lease_expires_at__lte=DbNow()
        )
        due = (
            ReconciliationCase.objects.filter(status=CaseStatus.OPEN, next_lookup_at__lte=DbNow())
            .filter(unclaimed)
            .order_by("next_lookup_at", "pk")
            .values_list("pk", flat=True)
        )
        if row_locks():
            due = due.select_for_update(skip_locked=True, of=("self",))
        for case_id in list(due[:free]):
            claim = f"{case_id}:{token}"[:100]  # unique by the case id, whatever is cut
            taken = (
                ReconciliationCase.objects.filter(pk=case_id, status=CaseStatus.OPEN)
                .filter(unclaimed)
                .update(lookup_claim=claim, lookup_lease_expires_at=_lease_until())
            )
            if taken:
                claimed.append((case_id, claim))
    return claimed


def lookups_duty(sweep_pass: SweepPass) -> None:
    """The sweeper's duty: claim due automatic lookups and hand each to a worker.

    Enqueued after the claims committed: a task that runs at once finds its claim.
    """
    claimed = lookups_claim(limit=sweep_pass.limit)
    for case_id, claim in claimed:
        sweep_pass.enqueue(LOOKUP_TASK, case_id, claim)
    sweep_pass.report.cases["lookups_claimed"] = len(claimed)


def case_lookup_task(case_id: int, claim: str) -> str:
    """django-q2 entry point: make the claimed automatic lookup, then release the claim."""
    with shutdown.Working():
        # Renew the claim as the lookup starts: a task that waited in the queue past
        # its lease finds the case claimed again (or looked up) and does nothing.
        held = ReconciliationCase.objects.filter(
            pk=case_id, lookup_claim=claim, lookup_lease_expires_at__gt=DbNow()
        ).update(lookup_lease_expires_at=_lease_until())
        if not held:
            return "claim_lapsed"
        case = ReconciliationCase.objects.select_related("run", "tenant").get(pk=case_id)
        try:
            if not case.is_open:
                return "resolved"
            outcome = case_lookup_now(case=case).outcome
        except Exception:
            # Not the provider's answer (an unreachable one is recorded by the
            # lookup itself): a fault here. Asked again later, waiting longer each time.
            log.exception("case %s: automatic lookup failed", case_id)
            ReconciliationCase.objects.filter(pk=case_id, status=CaseStatus.OPEN).update(
                next_lookup_at=DbNow() + lookup_backoff(case.lookup_failures + 1),
                lookup_failures=F("lookup_failures") + 1,
            )
            outcome = "failed"
        finally:
            ReconciliationCase.objects.filter(pk=case_id, lookup_claim=claim).update(
                lookup_claim="", lookup_lease_expires_at=None
            )
        log.info("case %s: automatic lookup: %s", case_id, outcome)
        return outcome
