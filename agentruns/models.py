"""Runs, their steps, the event log and large payloads.

The Run and Step tables are a durability contract: a worker that dies is
replaced by another that reads these rows and continues. A schema change comes
with a test that replays a run recorded before it.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KeyTransform
from django.utils import timezone


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SLEEPING = "sleeping"
    WAITING_FOR_APPROVAL = "waiting_for_approval"
    WAITING_FOR_RETRY = "waiting_for_retry"
    EFFECT_UNKNOWN = "effect_unknown_reconciliation_required"
    COMPENSATING = "partially_completed_compensation_running"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED_BEFORE_EFFECT = "failed_before_effect"
    FAILED_AFTER_EFFECT = "failed_after_effect"
    COMPENSATED = "compensated"
    CANCELLED_NO_EFFECT = "cancelled_no_effect"
    CANCELLED_AFTER_EFFECT = "cancelled_after_irreversible_effect"


TERMINAL_STATUSES = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.FAILED_BEFORE_EFFECT,
        RunStatus.FAILED_AFTER_EFFECT,
        RunStatus.COMPENSATED,
        RunStatus.CANCELLED_NO_EFFECT,
        RunStatus.CANCELLED_AFTER_EFFECT,
    }
)
# States a worker may claim: the run has work to do and no person is needed.
RUNNABLE_STATUSES = frozenset(
    {
        RunStatus.QUEUED,
        RunStatus.RUNNING,
        RunStatus.SLEEPING,
        RunStatus.WAITING_FOR_RETRY,
        RunStatus.COMPENSATING,
    }
)
# States that wake by the clock alone.
TIMED_STATUSES = frozenset({RunStatus.SLEEPING, RunStatus.WAITING_FOR_RETRY})


class StepKind(models.TextChoices):
    MODEL = "model"
    TOOL = "tool"
    WAIT = "wait"
    COMPENSATION = "compensation"
    CLOCK = "clock"
    RANDOM = "random"
    OUTCOME = "outcome"


class StepStatus(models.TextChoices):
    PLANNED = "planned"  # recorded, not yet sent
    RUNNING = "running"  # cleared to send; effect key committed
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # definitely no effect
    UNKNOWN = "unknown"  # may have taken effect; must be settled


class QuerySetRun(models.QuerySet):
    def for_tenant(self, tenant) -> QuerySetRun:
        return self.filter(tenant=tenant)

    def active(self) -> QuerySetRun:
        return self.exclude(status__in=TERMINAL_STATUSES)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by run_tenant_status, which leads with tenant.
    tenant = models.ForeignKey(
        "accounts.Tenant", on_delete=models.PROTECT, related_name="runs", db_index=False
    )
    requested_by = models.CharField(max_length=200, blank=True)
    agent_name = models.CharField(max_length=100)
    agent_version = models.PositiveIntegerField()
    # Tool schemas, configuration, budget and model settings pinned at start;
    # agent code reads configuration only through the run context.
    agent_snapshot = models.JSONField(default=dict)
    input = models.JSONField(default=dict)
    input_hash = models.CharField(max_length=64)
    request_id = models.CharField(max_length=200)
    # NULL, not "", for "no key": the conditional unique constraint ignores NULLs.
    dedupe_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001

    status = models.CharField(max_length=48, choices=RunStatus.choices, default=RunStatus.QUEUED)
    outcome_detail = models.TextField(blank=True)
    # What the run's end means, at a glance: declared by the agent (ctx.outcome, e.g.
    # "refund_refused"), or "<tool>_refused" when it completed with a definitely
    # refused effect. "" for an ending that needs no word beside its status.
    outcome_code = models.CharField(max_length=64, blank=True)
    output = models.JSONField(null=True, blank=True)
    current_step = models.CharField(max_length=200, blank=True)

    # Compare-and-set counter and fencing token: every decision about the run
    # names the version it saw.
    state_version = models.BigIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    enqueued_at = models.DateTimeField(null=True, blank=True)
    claim_count = models.IntegerField(default=0)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=200, blank=True)

    steps_used = models.IntegerField(default=0)
    model_calls_used = models.IntegerField(default=0)
    tokens_used = models.BigIntegerField(default=0)
    cost_micros = models.BigIntegerField(default=0)

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    # What happened on the way (agentruns.marks), each written in the commit that
    # records its fact, never cleared: a step took another attempt or an operator
    # pressed "retry now"; a claim took the run over from a holder whose lease had
    # expired; an unknown effect was settled; a person approved an effect (by whom,
    # the latest); the run ended with an effect undone.
    retried = models.BooleanField(default=False, db_default=False)
    recovered = models.BooleanField(default=False, db_default=False)
    reconciled = models.BooleanField(default=False, db_default=False)
    approved_by = models.CharField(max_length=200, blank=True, db_default="")
    compensated = models.BooleanField(default=False, db_default=False)

    # Retention (retention/services.py, docs/architecture.md §3.14): when the run's events
    # and its steps' inputs, requests and results moved to its archive document
    # (agentruns.archives), the document's name in storage and the SHA-256 of its
    # canonical JSON. The row itself, its outcome and its step rows stay.
    archived_at = models.DateTimeField(null=True, blank=True)
    archive_name = models.CharField(max_length=300, blank=True, db_default="")
    archive_sha256 = models.CharField(max_length=64, blank=True, db_default="")
    # When the payloads of its steps that carry personal data were replaced by a
    # redaction marker; also set for a run that had none, so each ended run is looked
    # at once.
    personal_data_redacted_at = models.DateTimeField(null=True, blank=True)

    objects = QuerySetRun.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "request_id"], name="run_unique_request_id_per_tenant"
            ),
            # At most one active run per (tenant, agent, dedupe_key); blocked counts
            # as active (DESIGN §12.11).
            models.UniqueConstraint(
                fields=["tenant", "agent_name", "dedupe_key"],
                condition=Q(dedupe_key__isnull=False)
                & ~Q(status__in=sorted(s.value for s in TERMINAL_STATUSES)),
                name="run_one_active_per_dedupe_key",
            ),
        ]
        indexes = [
            # sweeper: runs whose retry or timer is due
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status__in=sorted(s.value for s in TIMED_STATUSES)),
                name="run_due_wakeups",
            ),
            # sweeper: runs whose lease may have expired
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status__in=[RunStatus.RUNNING, RunStatus.COMPENSATING]),
                name="run_leases",
            ),
            # sweeper: queued runs nobody picked up
            models.Index(
                fields=["enqueued_at"], condition=Q(status=RunStatus.QUEUED), name="run_queued"
            ),
            # run lists: a tenant's runs in a state, newest first; and the state counts
            models.Index(fields=["tenant", "status", "-created_at"], name="run_tenant_status"),
            # run lists: all of a tenant's runs, newest first, keyset pages
            models.Index(fields=["tenant", "-created_at", "-id"], name="run_tenant_recent"),
            # run lists filtered by outcome: a tenant's runs with one, newest first
            models.Index(
                fields=["tenant", "outcome_code", "-created_at"],
                condition=~Q(outcome_code=""),
                name="run_tenant_outcome",
            ),
            # run search by order id
            models.Index(
                F("tenant"), KeyTransform("order_id", "input"), name="run_tenant_order_id"
            ),
            # the overview: a tenant's runs started in a range, counted by agent and state
            # and their cost summed from the index alone (an index-only scan)
            models.Index(
                fields=["tenant", "created_at", "agent_name", "status", "cost_micros"],
                name="run_tenant_started",
            ),
            # the overview: a tenant's runs that ended in a range; only ended runs have
            # an entry
            models.Index(
                fields=["tenant", "finished_at"],
                condition=Q(finished_at__isnull=False),
                name="run_tenant_ended",
            ),
            # retention: a tenant's ended runs not yet archived, the candidates of an
            # archive pass (retention.services.archive_candidates); an archived run
            # leaves the index, so a pass with nothing to do reads no entry
            models.Index(
                fields=["tenant", "finished_at"],
                condition=Q(finished_at__isnull=False, archived_at__isnull=True),
                name="run_to_archive",
            ),
            # retention: a tenant's ended runs whose personal data was not yet redacted
            # (retention.services.redaction_candidates)
            models.Index(
                fields=["tenant", "finished_at"],
                condition=Q(
                    finished_at__isnull=False,
                    archived_at__isnull=True,
                    personal_data_redacted_at__isnull=True,
                ),
                name="run_to_redact",
            ),
            # run lists filtered by a mark (?mark=retried): a tenant's marked runs in a
            # state, newest first, and the state counts under the filter; only marked
            # runs have an entry
            *(
                models.Index(
                    fields=["tenant", "status", "-created_at"],
                    condition=condition,
                    name=f"run_tenant_{mark}",
                )
                for mark, condition in [
                    ("retried", Q(retried=True)),
                    ("recovered", Q(recovered=True)),
                    ("reconciled", Q(reconciled=True)),
                    ("approved", ~Q(approved_by="")),
                    ("compensated", Q(compensated=True)),
                ]
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name}@{self.agent_version} {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def cost_usd(self) -> Decimal:
        return Decimal(self.cost_micros) / 1_000_000

    @property
    def is_archived(self) -> bool:
        return self.archived_at is not None

    @property
    def outcome_label(self) -> str:
        """The outcome in words: "refund_refused" → "refund refused"."""
        return self.outcome_code.replace("_", " ")


class Blob(models.Model):
    """A payload too large to keep inline, stored through Django's storage API."""

    sha256 = models.CharField(max_length=64, primary_key=True)
    size = models.BigIntegerField()
    storage_name = models.CharField(max_length=300)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"blob {self.sha256[:12]} ({self.size} bytes)"


class Step(models.Model):
    # Indexed by the unique (run, seq) constraint. No database-level foreign key:
    # on PostgreSQL its check locks the run row that the same statement has just
    # updated, which costs a multixact per step (a third of an effect step's
    # time, benchmarks/step_overhead.py). Steps are only ever inserted by a
    # statement that selects their run row (store.py), and deleting a run
    # cascades in Django.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="steps", db_index=False, db_constraint=False
    )
    seq = models.IntegerField()
    # Deterministic identity: sequence number, kind and name, e.g. 0004.tool.issue_refund
    step_id = models.CharField(max_length=200)
    kind = models.CharField(max_length=20, choices=StepKind.choices)
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=StepStatus.choices)
    # A call that may change the world (a tool that is not read-only, or an undo):
    # what the run's end state is derived from.
    is_effect = models.BooleanField(default=False, db_default=False)
    # The tool's recovery declaration at the time the step was recorded.
    recovery = models.JSONField(null=True, blank=True)

    input = models.JSONField(null=True, blank=True)
    input_hash = models.CharField(max_length=64, db_default="")
    # NULL for steps without an effect; unique where set (step_unique_effect_key).
    effect_key = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
    # The exact outbound request; every resend sends this, never a rebuilt one.
    request = models.JSONField(null=True, blank=True)
    first_sent_at = models.DateTimeField(null=True, blank=True)
    last_sent_at = models.DateTimeField(null=True, blank=True)
    # True from the commit that clears a send until its answer is recorded: a
    # step found running and in flight was interrupted mid-call.
    in_flight = models.BooleanField(default=False, db_default=False)

    attempts = models.IntegerField(default=0, db_default=0)
    # Attempts that may have reached the provider without an answer (crash,
    # timeout, 5xx, 409): they decide whether a give-up is "failed" or "unknown".
    ambiguous_attempts = models.IntegerField(default=0, db_default=0)
    # A conclusive "absent" from a lookup allows exactly one more send (DESIGN §7).
    resent_after_absence = models.BooleanField(default=False, db_default=False)
    # What recovery did with this step, in order: attempts, answers, lookups.
    recovery_log = models.JSONField(null=True, blank=True)
    retry_deadline = models.DateTimeField(null=True, blank=True)
    last_error_class = models.CharField(max_length=100, blank=True, db_default="")
    last_error = models.TextField(blank=True, db_default="")
    provider_retry_after = models.FloatField(null=True, blank=True)

    result = models.JSONField(null=True, blank=True)
    result_blob = models.ForeignKey(
        Blob, on_delete=models.PROTECT, null=True, blank=True, db_index=False
    )
    result_hash = models.CharField(max_length=64, blank=True, db_default="")
    provider_reference = models.CharField(max_length=200, blank=True, db_default="")
    compensates = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="compensations",
        db_index=False,
    )

    # Model evidence.
    model_provider = models.CharField(max_length=50, blank=True, db_default="")
    model_id = models.CharField(max_length=100, blank=True, db_default="")
    prompt_version = models.CharField(max_length=50, blank=True, db_default="")
    tool_schema_version = models.CharField(max_length=64, blank=True, db_default="")
    input_tokens = models.IntegerField(null=True, blank=True)
    output_tokens = models.IntegerField(null=True, blank=True)
    cost_micros = models.BigIntegerField(null=True, blank=True)
    validation = models.JSONField(null=True, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step_id"], name="step_unique_step_id_per_run"),
            models.UniqueConstraint(fields=["run", "seq"], name="step_unique_seq_per_run"),
            # Partial: steps without an effect add no index entry.
            models.UniqueConstraint(
                fields=["effect_key"],
                condition=Q(effect_key__isnull=False),
                name="step_unique_effect_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.step_id} ({self.status})"


class RunEvent(models.Model):
    """Append-only log of what happened to a run, written in the same commit as the change."""

    # Indexed by runevent_run_id (run, id). No database-level foreign key, for
    # the reason given on Step.run.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False
    )
    type = models.CharField(max_length=50)
    state_version = models.BigIntegerField()
    step_id = models.CharField(max_length=200, blank=True)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]
        indexes = [
            # timeline: a run's events in order
            models.Index(fields=["run", "id"], name="runevent_run_id"),
        ]

    def __str__(self) -> str:
        return f"{self.type} v{self.state_version}"


class SweeperLease(models.Model):
    """One row per named singleton job; the holder of the lease is the only active sweeper."""

    name = models.CharField(max_length=50, primary_key=True)
    owner = models.CharField(max_length=200, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} held by {self.owner or 'nobody'}"
