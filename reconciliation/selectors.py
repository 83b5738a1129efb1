"""Reads of reconciliation cases for the pages: the queue, one case, the navigation's count."""

from __future__ import annotations

from typing import Any

from accounts.models import AuditEntry, Tenant
from accounts.services import for_tenant
from agentruns.selectors import step_events
from reconciliation.models import CaseStatus, ReconciliationCase
from reconciliation.services import OPERATOR_OUTCOMES, case_choices, newest_lookup

PAGE_SIZE = 100


def case_queue_context(tenant: Tenant, params) -> dict[str, Any]:
    """The queue under ``params`` (show open or resolved, tool, provider)."""
    show = "resolved" if params.get("show") == "resolved" else "open"
    scoped = for_tenant(ReconciliationCase.objects.all(), tenant)
    cases = scoped.select_related("run")
    tool = params.get("tool", "").strip()
    provider = params.get("provider", "").strip()
    if tool:
        cases = cases.filter(tool=tool)
    if provider:
        cases = cases.filter(provider=provider)
    if show == "open":
        cases = cases.filter(status=CaseStatus.OPEN).order_by("opened_at", "id")
    else:
        cases = cases.filter(status=CaseStatus.RESOLVED).order_by("-resolved_at", "-id")
    return {
        "cases": list(cases[:PAGE_SIZE]),
        "show": show,
        "tool": tool,
        "provider": provider,
        "tools": sorted(set(scoped.values_list("tool", flat=True).distinct()[:50])),
        "providers": sorted(set(scoped.values_list("provider", flat=True).distinct()[:50]) - {""}),
        "open_count": scoped.filter(status=CaseStatus.OPEN).count(),
    }


def case_context(case: ReconciliationCase, user) -> dict[str, Any]:
    """Everything the case page shows ``user``. (The case is already the viewer's tenant's.)"""
    return {
        "case": case,
        "step": case.step,
        "newest": newest_lookup(case),
        "lookups": list(case.lookups.order_by("id")),
        "attempt_events": step_events(case.run, case.step_id_label),
        "choices": case_choices(case) if case.is_open else [],
        "outcomes": [(o.value, o.label) for o in OPERATOR_OUTCOMES],
        "can_settle": user.has_perm("accounts.settle_effects"),
        "error_detail": user.has_perm("accounts.view_provider_errors"),
        "audit": list(
            for_tenant(AuditEntry.objects.all(), case.tenant).filter(
                object_type="case", object_id=str(case.pk)
            )[:100]
        ),
    }


def open_case_count(tenant: Tenant) -> dict[str, int]:
    # Open cases (case_queue index): one run may wait on several unknown effects.
    open_cases = for_tenant(ReconciliationCase.objects.filter(status=CaseStatus.OPEN), tenant)
    return {"open_cases": open_cases.count()}
