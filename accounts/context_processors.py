"""What needs attention, for the navigation of every page an operator sees."""

from __future__ import annotations

from django.db.models import Count

from accounts.services import for_tenant

ATTENTION_STATES = (
    "waiting_for_approval",
    "effect_unknown_reconciliation_required",
    "blocked",
)


def attention(request) -> dict:
    operator = getattr(getattr(request, "user", None), "operator", None)
    if operator is None:
        return {}
    from agentruns.models import Run
    from approvals.models import Approval
    from reconciliation.models import ReconciliationCase

    counts = dict(
        for_tenant(Run.objects.all(), operator.tenant)
        .filter(status__in=ATTENTION_STATES)
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    attention = {state: counts.get(state, 0) for state in ATTENTION_STATES}
    # What the approvals inbox lists (approval_inbox index), not the runs waiting:
    # an expired approval leaves its run waiting with nothing to decide.
    attention["pending_approvals"] = for_tenant(Approval.objects.pending(), operator.tenant).count()
    # Open cases (case_queue index): one run may wait on several unknown effects.
    attention["open_cases"] = for_tenant(
        ReconciliationCase.objects.filter(status="open"), operator.tenant
    ).count()
    return {"attention": attention}
