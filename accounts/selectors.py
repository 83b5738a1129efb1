"""Reads of the audit log for its page (and the page's live socket)."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator

from accounts.models import AuditEntry, Tenant
from accounts.services import for_tenant

PAGE_SIZE = 50


def audit_context(tenant: Tenant, params) -> dict[str, Any]:
    """The tenant's audit entries under ``params`` (actor, action, object, page)."""
    entries = for_tenant(AuditEntry.objects.all(), tenant)
    actor = params.get("actor", "").strip()
    action = params.get("action", "").strip()
    object_id = params.get("object", "").strip()
    if actor:
        entries = entries.filter(actor__icontains=actor)
    if action:
        entries = entries.filter(action=action)
    if object_id:
        entries = entries.filter(object_id=object_id)
    ordered = entries.order_by("-created_at", "-id")
    page = Paginator(ordered, PAGE_SIZE).get_page(params.get("page"))
    actions = (
        for_tenant(AuditEntry.objects.all(), tenant)
        .order_by("action")
        .values_list("action", flat=True)
        .distinct()
    )
    return {
        "page": page,
        "actor": actor,
        "action": action,
        "object": object_id,
        "actions": list(actions),
    }
