"""What an event says: a small JSON object, masked by the one rule (accounts.privacy).

Every payload has the same shape, whatever its type::

    {"id": "evt_…", "type": "run.ended", "created_at": "2026-…Z", "tenant": "default",
     "data": {"object": "run", "id": "…", "status": "completed",
              "url": "https://…/api/v1/runs/…", …}}

``data.url`` is the API address that reads the object as it is now; a receiver
that needs more than the status reads it there, with its own token.
"""

from __future__ import annotations

from typing import Any, TypedDict

from django.conf import settings

from accounts.privacy import mask
from agentruns.models import Run
from approvals.models import Approval
from reconciliation.models import ReconciliationCase


class EventData(TypedDict, total=False):
    object: str
    id: str
    status: str
    url: str
    agent: str
    run_id: str
    request_id: str
    tool: str
    resolution: str


class Payload(TypedDict):
    id: str
    type: str
    created_at: str
    tenant: str
    data: EventData


def api_url(kind: str, object_id: object) -> str:
    return f"{settings.HOLDFAST_BASE_URL.rstrip('/')}/api/v1/{kind}/{object_id}"


def run_data(run: Run) -> EventData:
    return {
        "object": "run",
        "id": str(run.pk),
        "status": run.status,
        "agent": run.agent_name,
        "request_id": run.request_id or "",
        "url": api_url("runs", run.pk),
    }


def approval_data(approval: Approval) -> EventData:
    return {
        "object": "approval",
        "id": str(approval.pk),
        "status": approval.status,
        "run_id": str(approval.run_id),
        "tool": approval.tool,
        "url": api_url("approvals", approval.pk),
    }


def case_data(case: ReconciliationCase) -> EventData:
    data: EventData = {
        "object": "case",
        "id": str(case.pk),
        "status": case.status,
        "run_id": str(case.run_id),
        "tool": case.tool,
        "url": api_url("cases", case.pk),
    }
    if case.resolution:
        data["resolution"] = case.resolution
    return data


def payload(
    *, event_id: str, event_type: str, created_at: str, tenant_slug: str, data: EventData
) -> dict[str, Any]:
    body: Payload = {
        "id": event_id,
        "type": event_type,
        "created_at": created_at,
        "tenant": tenant_slug,
        "data": data,
    }
    # The one masking rule: the API shows these values the same way.
    return mask(dict(body))
