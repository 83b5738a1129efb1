"""A tenant's webhook endpoints, the events raised for them, and each delivery.

An event is one fact (a run ended, an approval was requested or decided, a case
opened or was resolved) recorded once per tenant: ``topic`` names the fact and is
unique per tenant, so a hook called twice and the sweeper's repair record it once.
A delivery is that event for one endpoint: its ``message_id`` is the
``webhook-id`` header of every attempt, the id a receiver deduplicates by, and one
``webhook_deliver`` run carries it (request id ``webhook:<delivery id>``).
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from accounts.models import Tenant


class EventType(models.TextChoices):
    RUN_ENDED = "run.ended", "A run ended"
    APPROVAL_REQUESTED = "approval.requested", "An approval was requested"
    APPROVAL_DECIDED = "approval.decided", "An approval was decided"
    CASE_OPENED = "case.opened", "A reconciliation case opened"
    CASE_RESOLVED = "case.resolved", "A reconciliation case was resolved"


class WebhookEndpoint(models.Model):
    """Where a tenant wants events sent, and the secret their signatures prove."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    url = models.URLField(max_length=500)
    description = models.CharField(max_length=200, blank=True)
    # The event types it receives (EventType values).
    events = models.JSONField(default=list)
    is_active = models.BooleanField(default=True)
    # The signing secret ("whsec_" + base64): shown once when made or rotated, never
    # written to a log, an audit entry or a page afterwards.
    secret = models.CharField(max_length=100)
    # After a rotation the previous secret signs too, until then: a receiver that
    # has not switched yet still verifies (Standard Webhooks' several signatures).
    previous_secret = models.CharField(max_length=100, blank=True)
    previous_secret_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=200)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = [("manage_webhooks", "Can manage the tenant's webhook endpoints")]
        indexes = [
            # Raising an event: the tenant's active endpoints.
            models.Index(
                fields=["tenant"], condition=Q(is_active=True), name="webhook_endpoint_active"
            ),
        ]

    def __str__(self) -> str:
        return self.description or self.url

    def receives(self, event_type: str) -> bool:
        return self.is_active and event_type in (self.events or [])

    def signing_secrets(self, *, now) -> list[str]:
        """The secrets every attempt is signed with now: the current one, and the
        previous one while its grace period lasts."""
        secrets = [self.secret]
        if self.previous_secret and self.previous_secret_until and now < self.previous_secret_until:
            secrets.append(self.previous_secret)
        return secrets


class WebhookEvent(models.Model):
    """One fact, recorded once, with the payload every endpoint is sent."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    type = models.CharField(max_length=32, choices=EventType.choices)
    # The fact, e.g. "run:<uuid>:ended", "case:7:opened:0": unique per tenant.
    topic = models.CharField(max_length=120)
    object_id = models.CharField(max_length=64)
    payload = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "topic"], name="webhook_event_once"),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.object_id}"

    @property
    def public_id(self) -> str:
        return f"evt_{self.id.hex}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Waiting to be sent"
    RETRYING = "retrying", "Failed, will be sent again"
    DELIVERED = "delivered", "Delivered"
    REFUSED = "refused", "Refused by the endpoint"
    FAILED = "failed", "Given up"
    SKIPPED = "skipped", "Not sent: the endpoint was disabled"


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


class WebhookDelivery(models.Model):
    """One event for one endpoint: what its attempts met so far.

    The ``webhook_deliver`` run's tool writes the attempt columns after each
    attempt (a fact of what the endpoint answered); the run itself holds the
    schedule (its ``next_attempt_at`` while it waits to retry).
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    event = models.ForeignKey(WebhookEvent, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    # The webhook-id header of every attempt: receivers deduplicate by it.
    message_id = models.CharField(max_length=40, unique=True, default=new_message_id)
    # The webhook_deliver run carrying it; null until started (the sweeper starts
    # any the raising transaction's commit hook did not).
    run = models.ForeignKey(
        "agentruns.Run", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.IntegerField(default=0)
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["event", "endpoint"], name="webhook_delivery_once"),
        ]
        indexes = [
            # The delivery log: an endpoint's deliveries, newest first.
            models.Index(fields=["endpoint", "-created_at"], name="webhook_delivery_log"),
            # The sweeper: deliveries whose run was never started.
            models.Index(
                fields=["created_at"], condition=Q(run__isnull=True), name="webhook_unstarted"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} → {self.endpoint_id}"
