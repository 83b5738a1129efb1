"""The reconciliation desk the engine reports unknown effects to (DESIGN §9)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import F

from agentruns.dbclock import DbNow
from agentruns.models import Run, Step, StepStatus
from agentruns.services import get_registry
from reconciliation.models import CaseStatus, ReconciliationCase

log = logging.getLogger("holdfast.reconciliation")

FIRST_LOOKUP_DELAY = timedelta(seconds=30)
LONGEST_LOOKUP_DELAY = timedelta(hours=1)


# Called with each case that opens (or opens again), and again whenever the desk is
# asked to open a case that is open already: whoever is told must be told once per
# opening whatever the number of calls. The composition root installs
# notifications' hook (config/wiring.py); without one nobody is told.
_opened_hooks: tuple[Callable[[ReconciliationCase], None], ...] = ()


def install_opened_hooks(*hooks: Callable[[ReconciliationCase], None]) -> None:
    global _opened_hooks
    _opened_hooks = hooks


def _opened(case: ReconciliationCase) -> None:
    for hook in _opened_hooks:
        hook(case)


def lookup_backoff(failures: int) -> timedelta:
    """How long the sweeper waits before its next automatic lookup of a case."""
    return min(FIRST_LOOKUP_DELAY * (2**failures), LONGEST_LOOKUP_DELAY)


class DatabaseDesk:
    def open_case(self, run_id: str, step_pk: int, reason: str) -> None:
        """Open the step's one case, or reopen it after a retry that ended unknown again.

        Never raises: the run is already waiting in its state, and the sweeper
        opens any case that a failure here left missing.
        """
        try:
            case_open(run_id, step_pk, reason)
        except Exception:
            log.exception("run %s: could not open the case of step %s", run_id, step_pk)


def case_open(run_id: str, step_pk: int, reason: str) -> ReconciliationCase | None:
    step = Step.objects.filter(pk=step_pk, run_id=run_id).first()
    if step is None or step.status != StepStatus.UNKNOWN:
        return None
    existing = ReconciliationCase.objects.filter(step_id=step_pk).first()
    if existing is not None:
        if existing.status == CaseStatus.RESOLVED:
            # A retry ended unknown again: the same case, open once more.
            last_lookup = existing.lookups.order_by("-id").values_list("id", flat=True).first()
            ReconciliationCase.objects.filter(pk=existing.pk, status=CaseStatus.RESOLVED).update(
                status=CaseStatus.OPEN,
                evidence_after=last_lookup or 0,
                reason=reason,
                reopened=F("reopened") + 1,
                version=F("version") + 1,
                resolution="",
                resolved_by="",
                resolved_at=None,
                outcome_summary="",
                next_lookup_at=(DbNow() + lookup_backoff(0)) if existing.can_look_up else None,
                lookup_failures=0,
            )
            existing.refresh_from_db()
        if existing.status == CaseStatus.OPEN:
            _opened(existing)
        return existing
    run = Run.objects.get(pk=run_id)
    tool = get_registry().tool_of(run, step.name)
    approval_id = None
    amount, currency = None, ""
    if tool is not None and tool.approval is not None:
        # The approval its send consumed: the run's own (reverse relation; effect
        # keys are per run), read without reaching into the approvals app.
        approval_id = (
            run.approvals.filter(consumed_by_effect_key=step.effect_key)
            .order_by("-id")
            .values_list("pk", flat=True)
            .first()
        )
        if tool.approval.amount is not None:
            money = tool.approval.amount(step.input or {})
            if money:
                amount, currency = money
    can_look_up = bool((step.recovery or {}).get("lookup")) and tool is not None
    case = ReconciliationCase(
        tenant_id=run.tenant_id,
        run_id=run.id,
        step_id=step.pk,
        step_id_label=step.step_id,
        tool=step.name,
        provider=tool.provider if tool is not None else "",
        recovery=(step.recovery or {}).get("describe", ""),
        can_look_up=can_look_up,
        args=step.input,
        request=step.request,
        effect_key=step.effect_key or "",
        approval_id=approval_id,
        amount=amount,
        currency=currency or "",
        reason=reason,
        opened_at=DbNow(),
        # The sweeper looks the effect up again, with backoff, while it cannot tell.
        next_lookup_at=(DbNow() + lookup_backoff(0)) if can_look_up else None,
    )
    try:
        with transaction.atomic():
            case.save(force_insert=True)
    except IntegrityError:
        # Opened by another process at the same moment: one case per step.
        return ReconciliationCase.objects.get(step_id=step_pk)
    _opened(case)
    return case
