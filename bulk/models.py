"""An operator's action on many runs at once, and what it did to each."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from accounts.models import Tenant


class BulkAction(models.Model):
    """Cancel or retry now, asked once for a set of runs fixed when it was confirmed."""

    class Kind(models.TextChoices):
        CANCEL = "cancel", "cancel"
        RETRY = "retry", "retry now"

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="bulk_actions")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    actor = models.CharField(max_length=200)
    # What the operator chose: the filter of "all matching", or the runs ticked.
    selection = models.JSONField(default=dict)
    total = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    # When a worker was last asked to carry it out (the sweeper asks again, rarely).
    enqueued_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"bulk {self.get_kind_display()} of {self.total} runs ({self.tenant.slug})"


class BulkItem(models.Model):
    """One run of a bulk action: waiting, being acted on (claimed by one worker), or done."""

    class State(models.TextChoices):
        WAITING = "waiting"
        WORKING = "working"
        DONE = "done"

    action = models.ForeignKey(BulkAction, on_delete=models.CASCADE, related_name="items")
    run_id = models.UUIDField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.WAITING)
    # Once done: what happened ("cancelled", "will retry now"), or why it was skipped.
    skipped = models.BooleanField(default=False)
    outcome = models.TextField(blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["action", "run_id"], name="bulkitem_one_per_run")
        ]
        indexes = [models.Index(fields=["action", "state"], name="bulkitem_action_state")]

    def __str__(self) -> str:
        return f"{self.run_id}: {self.state}"
