"""Effects whose outcome is unknown: one case per step, the observations, the resolution."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone

from accounts.models import Tenant
from agentruns.money import format_amount

money = format_amount


class CaseStatus(models.TextChoices):
    OPEN = "open"
    RESOLVED = "resolved"


class Resolution(models.TextChoices):
    HAPPENED = "happened", "it happened"
    RETRY = "retry", "it did not happen: send it again under the same key"
    CANCEL = "cancel", "it did not happen: cancel the run"
    DIFFERENTLY = "differently", "it happened differently"
    # Not an operator's choice: the step was settled by the provider's own answer
    # (a late reply recorded by a worker) before anyone resolved the case.
    SETTLED_BY_PROVIDER = "settled_by_provider", "settled by the provider's answer"


class Outcome(models.TextChoices):
    SUCCEEDED = "succeeded", "it happened"
    NOT_FOUND = "not_found", "it did not happen"
    DIFFERENTLY = "differently", "it happened differently"
    FAILED = "failed", "the provider refused it"
    PENDING = "pending", "still being processed"
    INCONCLUSIVE = "inconclusive", "could not tell"


class ReconciliationCase(models.Model):
    """The question "did it happen?" for one effect step, and its answer.

    Everything an operator needs to find the effect in the provider's own records
    is copied here when the case opens: the tool, the exact request, the effect
    key, the approval that authorised it, and the attempts.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="cases")
    run = models.ForeignKey(
        "agentruns.Run", on_delete=models.CASCADE, related_name="cases", db_index=False
    )
    step = models.OneToOneField(
        "agentruns.Step", on_delete=models.CASCADE, related_name="case", db_constraint=False
    )
    step_id_label = models.CharField(max_length=200)  # "0004.tool.issue_refund"
    tool = models.CharField(max_length=100)
    provider = models.CharField(max_length=100, blank=True)
    recovery = models.CharField(max_length=100, blank=True)  # "idempotent(86400s)+lookup"
    can_look_up = models.BooleanField(default=False)
    args = models.JSONField(null=True, blank=True)
    request = models.JSONField(null=True, blank=True)
    effect_key = models.CharField(max_length=100)
    approval_id = models.BigIntegerField(null=True, blank=True)
    amount = models.BigIntegerField(null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    reason = models.TextField(blank=True)  # why the engine could not settle it
    status = models.CharField(max_length=20, choices=CaseStatus.choices, default=CaseStatus.OPEN)
    # Compare-and-set counter: every observation and resolution bumps it.
    version = models.IntegerField(default=0)
    opened_at = models.DateTimeField(default=timezone.now)
    reopened = models.IntegerField(default=0)
    # Observations up to this lookup id came before the case last (re)opened: they
    # describe an earlier send and no longer count toward a resolution.
    evidence_after = models.BigIntegerField(default=0)
    resolution = models.CharField(max_length=30, choices=Resolution.choices, blank=True)
    resolved_by = models.CharField(max_length=200, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution_note = models.TextField(blank=True)
    # What remains true in the world, in words, once resolved.
    outcome_summary = models.TextField(blank=True)
    retries = models.IntegerField(default=0)
    # Automatic lookups while the provider is unreachable (the sweeper's queue).
    next_lookup_at = models.DateTimeField(null=True, blank=True)
    lookup_failures = models.IntegerField(default=0)
    # The automatic lookup a worker's task is making now, claimed by lease
    # (reconciliation/lookups.py): the claim's token, and when it lapses, so a lost
    # task's lookup is claimed again. The unexpired leases are the lookups in
    # flight, which HOLDFAST_LOOKUP_CONCURRENCY bounds for the whole deployment.
    lookup_claim = models.CharField(max_length=100, blank=True)
    lookup_lease_expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # the queue: a tenant's open cases, oldest first
            models.Index(fields=["tenant", "status", "opened_at"], name="case_queue"),
            # the sweeper: open cases due for an automatic lookup
            models.Index(
                fields=["next_lookup_at"],
                condition=Q(status="open", next_lookup_at__isnull=False),
                name="case_lookup_due",
            ),
            # a run's cases, on its page
            models.Index(fields=["run"], name="case_run"),
            # lookups_claim: the automatic lookups in flight (unexpired leases)
            models.Index(
                fields=["lookup_lease_expires_at"],
                condition=Q(lookup_lease_expires_at__isnull=False),
                name="case_lookup_leased",
            ),
        ]

    def __str__(self) -> str:
        return f"case {self.pk}: {self.tool} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status == CaseStatus.OPEN

    @property
    def amount_display(self) -> str:
        return money(self.amount, self.currency)


class ProviderLookup(models.Model):
    """One observation of what the provider says happened: appended, never changed."""

    class Method(models.TextChoices):
        AUTOMATIC = "automatic", "automatic lookup"
        OPERATOR = "operator", "recorded"
        LATE_ANSWER = "late_answer", "late answer recorded"

    case = models.ForeignKey(ReconciliationCase, on_delete=models.CASCADE, related_name="lookups")
    method = models.CharField(max_length=20, choices=Method.choices)
    actor = models.CharField(max_length=200)
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    conclusive = models.BooleanField(default=False)
    provider_reference = models.CharField(max_length=200, blank=True)
    observed_amount = models.BigIntegerField(null=True, blank=True)
    observed_currency = models.CharField(max_length=3, blank=True)
    evidence = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"lookup {self.pk} of case {self.case_id}: {self.outcome}"

    @property
    def amount_display(self) -> str:
        return money(self.observed_amount, self.observed_currency)
