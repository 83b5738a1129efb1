"""Who may decide an approval: the rules checked when a decision is made.

The engine checks the same rules again, in SQL, before the approved effect's
first send (approvals.gate); these are their words for a person.
"""

from __future__ import annotations

from django.db.models import Max

from accounts.models import Tenant
from agentruns.money import format_amount
from approvals.models import ApprovalAuthority

DECIDE_PERMISSION = "accounts.decide_approvals"


def authority_for(user, tenant: Tenant) -> tuple[bool, int | None]:
    """(has any authority, the largest amount or None for no limit) in ``tenant``."""
    if user.is_superuser:
        return True, None
    rows = ApprovalAuthority.objects.filter(tenant=tenant, group__in=user.groups.all())
    if not rows.exists():
        return False, None
    if rows.filter(max_amount__isnull=True).exists():
        return True, None
    return True, rows.aggregate(limit=Max("max_amount"))["limit"]


def approver_problem(user, tenant: Tenant, amount: int | None, currency: str = "") -> str | None:
    """Why ``user`` may not decide an approval of ``amount`` in ``tenant``, or None."""
    if not user.is_active:
        return "the account is deactivated"
    operator = getattr(user, "operator", None)
    if operator is None or operator.tenant_id != tenant.pk:
        return f"not an operator of {tenant}"
    if not user.has_perm(DECIDE_PERMISSION):
        return "the role does not allow deciding approvals"
    if amount is None:
        return None
    has_authority, limit = authority_for(user, tenant)
    if not has_authority:
        return f"no approval limit is set for the role in {tenant}"
    if limit is not None and amount > limit:
        return (
            f"the amount {format_amount(amount, currency)} is above the role's limit of "
            f"{format_amount(limit, currency)}"
        )
    return None


__all__ = ["DECIDE_PERMISSION", "approver_problem", "authority_for"]
