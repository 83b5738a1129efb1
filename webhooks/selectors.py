"""Reads of the webhooks pages and their live socket: a tenant's endpoints and one
endpoint's delivery log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q

from accounts.services import for_tenant
from agentruns.models import RunStatus
from webhooks.models import DeliveryStatus, EventType, WebhookDelivery, WebhookEndpoint

# The delivery log shows the newest deliveries of an endpoint.
LOG_LIMIT = 100


def endpoints_of(tenant) -> list[WebhookEndpoint]:
    return list(
        for_tenant(WebhookEndpoint.objects, tenant)
        .annotate(
            delivered=Count("deliveries", filter=Q(deliveries__status=DeliveryStatus.DELIVERED)),
            failing=Count(
                "deliveries",
                filter=Q(
                    deliveries__status__in=[
                        DeliveryStatus.RETRYING,
                        DeliveryStatus.REFUSED,
                        DeliveryStatus.FAILED,
                    ]
                ),
            ),
        )
        .order_by("-created_at", "-pk")
    )


def endpoint_of(tenant, endpoint_id: int) -> WebhookEndpoint | None:
    return for_tenant(WebhookEndpoint.objects, tenant).filter(pk=endpoint_id).first()


@dataclass(frozen=True)
class LogRow:
    delivery: WebhookDelivery
    event_type: str
    next_retry_at: datetime | None
    # Why a delivery that is neither delivered nor refused will not be sent again.
    stopped: str


def delivery_log(endpoint: WebhookEndpoint, limit: int = LOG_LIMIT) -> list[LogRow]:
    deliveries = (
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .select_related("event", "run")
        .order_by("-created_at", "-pk")[:limit]
    )
    labels = dict(EventType.choices)
    rows = []
    for delivery in deliveries:
        run = delivery.run
        waiting = run is not None and run.status == RunStatus.WAITING_FOR_RETRY
        stopped = ""
        unsettled = delivery.status in (DeliveryStatus.PENDING, DeliveryStatus.RETRYING)
        if unsettled and run is not None and run.is_terminal:
            stopped = f"its run ended as {run.status}"
        rows.append(
            LogRow(
                delivery=delivery,
                event_type=labels.get(delivery.event.type, delivery.event.type),
                next_retry_at=run.next_attempt_at if waiting else None,
                stopped=stopped,
            )
        )
    return rows


def log_run_ids(endpoint: WebhookEndpoint, run_ids) -> bool:
    """Whether any of these runs delivers for the endpoint (the live page's question)."""
    return WebhookDelivery.objects.filter(endpoint=endpoint, run_id__in=list(run_ids)).exists()
