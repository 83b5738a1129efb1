"""The audit page: every action on the tenant's objects, filterable."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from accounts.access import operator_required
from accounts.models import AuditEntry
from accounts.services import for_tenant


@require_GET
@operator_required("view_audit")
def audit_list(request: HttpRequest) -> HttpResponse:
    entries = for_tenant(AuditEntry.objects.all(), request.tenant)
    actor = request.GET.get("actor", "").strip()
    action = request.GET.get("action", "").strip()
    object_id = request.GET.get("object", "").strip()
    if actor:
        entries = entries.filter(actor__icontains=actor)
    if action:
        entries = entries.filter(action=action)
    if object_id:
        entries = entries.filter(object_id=object_id)
    page = Paginator(entries.order_by("-created_at", "-id"), 50).get_page(request.GET.get("page"))
    actions = (
        for_tenant(AuditEntry.objects.all(), request.tenant)
        .order_by("action")
        .values_list("action", flat=True)
        .distinct()
    )
    context = {
        "page": page,
        "actor": actor,
        "action": action,
        "object": object_id,
        "actions": list(actions),
    }
    return render(request, "accounts/audit_list.html", context)
