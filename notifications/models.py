"""How each operator wants to be told, and what waits for their digest."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.models import Tenant


class Delivery(models.TextChoices):
    IMMEDIATE = "immediate", "An email for each approval and case, at once"
    DIGEST = "digest", "One email per period listing what waited"
    OFF = "off", "No email"


class NotificationPreference(models.Model):
    """An operator's choice; without a row an operator is told at once."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    delivery = models.CharField(max_length=16, choices=Delivery.choices, default=Delivery.IMMEDIATE)

    def __str__(self) -> str:
        return f"{self.user}: {self.delivery}"

    @property
    def tenant(self) -> Tenant | None:
        # The admin writes a change to the operator's tenant's audit log.
        operator = getattr(self.user, "operator", None)
        return operator.tenant if operator is not None else None


class DigestEntry(models.Model):
    """One notice held for an operator's next digest (written by a notify run's step)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    # The step's effect key: a resent or recovered step finds its row, never writes two.
    effect_key = models.CharField(max_length=100, unique=True)
    subject = models.CharField(max_length=200)
    summary = models.TextField()
    link = models.URLField(max_length=500)
    created_at = models.DateTimeField(default=timezone.now)
    # The request id of the digest run that listed it; blank until one was started.
    digest_request = models.CharField(max_length=200, blank=True)

    class Meta:
        indexes = [
            # The digest duty: entries no digest run has taken yet.
            models.Index(
                fields=["created_at"],
                condition=models.Q(digest_request=""),
                name="digest_entry_waiting",
            ),
            # A digest run's listing: one operator's entries of one period.
            models.Index(fields=["user", "created_at"], name="digest_entry_user"),
        ]

    def __str__(self) -> str:
        return f"{self.user}: {self.subject}"
