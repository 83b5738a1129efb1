"""Who may decide an approval: the rules checked when a decision is made.

The engine checks the same rules again, in SQL, before the approved effect's
first send (approvals.gate); these are their words for a person.
"""

from __future__ import annotations

from accounts.models import Tenant
from agentruns.money import format_amount
from approvals.models import ApprovalAuthority

DECIDE_PERMISSION = "accounts.decide_approvals"


def limits_for(user, tenant: Tenant) -> dict[str, int | None]:
    """Each currency ``user``'s roles hold authority in, in ``tenant`` → the largest
    amount they may approve in it (None: no limit). A superuser needs none (see
    ``authority_for``)."""
    limits: dict[str, int | None] = {}
    rows = ApprovalAuthority.objects.filter(tenant=tenant, group__in=user.groups.all())
    for currency, max_amount in rows.values_list("currency", "max_amount"):
        if currency not in limits:
            limits[currency] = max_amount
        elif limits[currency] is not None:
            limits[currency] = None if max_amount is None else max(limits[currency], max_amount)
    return limits


def authority_for(user, tenant: Tenant, currency: str) -> tuple[bool, int | None]:
    """(has authority in ``currency``, the largest amount or None for no limit) in
    ``tenant``. Only a row in that same currency counts."""
    if user.is_superuser:
        return True, None
    limits = limits_for(user, tenant)
    if currency not in limits:
        return False, None
    return True, limits[currency]


def approver_problem(user, tenant: Tenant, amount: int | None, currency: str) -> str | None:
    """Why ``user`` may not decide an approval of ``amount`` ``currency`` in ``tenant``, or None."""
    if not user.is_active:
        return "the account is deactivated"
    operator = getattr(user, "operator", None)
    if operator is None or operator.tenant_id != tenant.pk:
        return f"not an operator of {tenant}"
    if not user.has_perm(DECIDE_PERMISSION):
        return "the role does not allow deciding approvals"
    if amount is None:
        return None
    has_authority, limit = authority_for(user, tenant, currency)
    if not has_authority:
        if not currency:
            return f"the amount {amount} has no currency, so no approval authority covers it"
        return f"you have no approval authority in {currency.upper()}"
    if limit is not None and amount > limit:
        return (
            f"the amount {format_amount(amount, currency)} is above the role's limit of "
            f"{format_amount(limit, currency)}"
        )
    return None


__all__ = ["DECIDE_PERMISSION", "approver_problem", "authority_for", "limits_for"]
