"""/api/v1/audit: the tenant's audit log, as its page shows it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from accounts.models import ApiToken, AuditEntry
from accounts.privacy import mask
from accounts.services import for_tenant
from api.auth import operation
from api.errors import ErrorOut
from api.pagination import Page, PageQuery, only_known_parameters, paginate

router = Router()


class AuditFilters(PageQuery):
    actor: str | None = Field(
        default=None, max_length=200, description="part of the actor (`user:ann`), any case"
    )
    action: str | None = Field(default=None, max_length=100, description="e.g. `run.cancel`")
    object_type: str | None = Field(default=None, max_length=100, description="e.g. `run`")
    object_id: str | None = Field(default=None, max_length=100, description="a run id, say")
    created_after: datetime | None = Field(default=None, description="at or after this time")
    created_before: datetime | None = Field(default=None, description="before this time")


class AuditEntryOut(Schema):
    id: int
    created_at: datetime
    actor: str = Field(description='who: "user:ann", or "command:…" for the command line')
    action: str
    object_type: str
    object_id: str
    before: Any = Field(description="what the object was; personal data masked")
    after: Any = Field(description="what it became; through the API, also the `token`")
    remote_addr: str | None


def entry_out(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.pk,
        "created_at": entry.created_at,
        "actor": entry.actor,
        "action": entry.action,
        "object_type": entry.object_type,
        "object_id": entry.object_id,
        # Masked when written; masked again as shown, by the one rule (accounts.privacy).
        "before": mask(entry.before),
        "after": mask(entry.after),
        "remote_addr": entry.remote_addr,
    }


@router.get(
    "",
    **operation(
        ApiToken.SCOPE_AUDIT_READ,
        summary="List audit entries",
        description=(
            "Every action people and client systems took in the token's tenant, newest "
            "first, with the audit page's filters (actor, action, object) and a time range."
        ),
        response={200: Page[AuditEntryOut], 400: ErrorOut},
        url_name="audit",
    ),
)
def audit_list(request: HttpRequest, filters: Query[AuditFilters]):
    only_known_parameters(request, filters)
    token: ApiToken = request.auth
    entries = for_tenant(AuditEntry.objects.all(), token.tenant)
    if filters.actor:
        entries = entries.filter(actor__icontains=filters.actor.strip())
    if filters.action:
        entries = entries.filter(action=filters.action.strip())
    if filters.object_type:
        entries = entries.filter(object_type=filters.object_type.strip())
    if filters.object_id:
        entries = entries.filter(object_id=filters.object_id.strip())
    if filters.created_after:
        entries = entries.filter(created_at__gte=filters.created_after)
    if filters.created_before:
        entries = entries.filter(created_at__lt=filters.created_before)
    page = paginate(entries, filters)
    return {**page, "items": [entry_out(entry) for entry in page["items"]]}
