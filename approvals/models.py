"""Approvals bound to exact arguments, and how much each role may approve."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from accounts.models import Tenant
from agentruns.money import format_amount


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    INVALIDATED = "invalidated"
    CONSUMED = "consumed"


LIVE_STATUSES = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)


class ApprovalQuerySet(models.QuerySet):
    def pending(self) -> ApprovalQuerySet:
        return self.filter(status=ApprovalStatus.PENDING)

    def decided(self) -> ApprovalQuerySet:
        return self.exclude(status=ApprovalStatus.PENDING)


class Approval(models.Model):
    """One person's permission for one call: this tool, these exact arguments, this
    resource state, until this time. It authorises nothing wider."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="approvals")
    run = models.ForeignKey(
        "agentruns.Run", on_delete=models.CASCADE, related_name="approvals", db_index=False
    )
    step_id = models.CharField(max_length=200)
    tool = models.CharField(max_length=100)
    # The canonical arguments (the step's recorded input) and content_hash of them.
    args = models.JSONField()
    args_hash = models.CharField(max_length=64)
    effect_key = models.CharField(max_length=100)
    requested_by = models.CharField(max_length=200, blank=True)
    resource = models.CharField(max_length=200)
    resource_state = models.JSONField(default=dict)
    resource_fingerprint = models.CharField(max_length=64)
    preview = models.TextField()
    amount = models.BigIntegerField(null=True, blank=True)  # minor units
    currency = models.CharField(max_length=3, blank=True)
    status = models.CharField(
        max_length=20, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="approval_decisions",
    )
    decided_by_name = models.CharField(max_length=200, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    note = models.TextField(blank=True)
    # The approval this one replaces (expired or invalidated) and what changed since.
    replaces = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="replaced_by"
    )
    changes = models.JSONField(default=list, blank=True)
    # Why the provider will refuse the action, judged by the engine on the resource's
    # state when it asked (the tool's policy); such an approval is never approved.
    provider_refusal = models.TextField(blank=True)
    invalidated_reason = models.TextField(blank=True)
    rerequested_by = models.CharField(max_length=200, blank=True)
    rerequested_at = models.DateTimeField(null=True, blank=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by_effect_key = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        constraints = [
            # At most one approval of a step is waiting or usable at a time.
            models.UniqueConstraint(
                fields=["run", "step_id"],
                condition=Q(status__in=["pending", "approved"]),
                name="approval_one_live_per_step",
            ),
            # An effect is authorised by one standing approval at a time. (An
            # invalidated one keeps the key it was consumed by, for the record.)
            models.UniqueConstraint(
                fields=["consumed_by_effect_key"],
                condition=Q(status="consumed"),
                name="approval_unique_consumer",
            ),
        ]
        indexes = [
            # the inbox: a tenant's approvals by status, oldest first
            models.Index(fields=["tenant", "status", "created_at"], name="approval_inbox"),
            # the engine's "latest approval of this step"
            models.Index(fields=["run", "step_id", "-id"], name="approval_step_latest"),
            # the sweeper: pending approvals past their expiry
            models.Index(
                fields=["expires_at"],
                condition=Q(status="pending"),
                name="approval_pending_expiry",
            ),
        ]

    def __str__(self) -> str:
        return f"approval {self.pk} of {self.tool} ({self.status})"

    @property
    def is_pending(self) -> bool:
        return self.status == ApprovalStatus.PENDING


class ApprovalAuthority(models.Model):
    """The largest amount (minor units of ``currency``) a role may approve in a tenant.

    Authority is per currency: a limit of 500.00 EUR says nothing about JPY, so an
    amount is covered only by a row in its own currency, and a role without a row
    for that currency may not approve it (only actions that move no money). An
    approver's limit in a currency is the largest of their roles'; no limit when
    ``max_amount`` is empty.
    """

    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="approval_authorities"
    )
    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="+")
    # Lower case, as providers and the approvals' own ``currency`` write it: the
    # decision and the engine's guard compare the two as they are.
    currency = models.CharField(
        max_length=3,
        validators=[
            RegexValidator(r"^[a-z]{3}$", "A lower-case ISO 4217 code, such as eur or jpy.")
        ],
    )
    max_amount = models.BigIntegerField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "approval authorities"
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "group", "currency"], name="authority_one_per_role_currency"
            )
        ]

    def __str__(self) -> str:
        limit = (
            "no limit"
            if self.max_amount is None
            else f"up to {format_amount(self.max_amount, self.currency)}"
        )
        return f"{self.group} in {self.tenant.slug}, {self.currency.upper()}: {limit}"
