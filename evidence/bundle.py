"""A run's evidence bundle: everything that shows what happened to it, as one JSON value.

The run; every step in order with its input, exact request, result, attempts, recovery
log, effect key and provider reference; the event log; every approval with its
arguments, their hash, the resource's state then, the decision and what consumed it;
every reconciliation case with its provider lookups and resolution; and the audit
entries for the run, its approvals and its cases. An archived run's events and step
payloads are read from its archive, so its bundle is the one it had before.

What leaves the database is shown as on the pages: recorded JSON through ``mask``, free
text through ``mask_text``, a provider's own words (a step's error, an answer's message,
a failed lookup's error, the failure a retry waits out) through ``shown_error`` with the
reader's ``view_provider_errors``. Ids, hashes, effect keys and provider references are not personal
data and are given as recorded (the masking rule's card pattern would take a digit run
inside a hex digest for a card). Money is an amount with its currency. Audit entries
leave out the operator's network address and browser.

The body is a function of the facts and the reader's permission alone: it does not say
when it was read, and exports (``run.evidence_exported``) are audited but not listed in
it. So the printable page and the JSON taken a moment apart carry the same hash, and a
finished run's bundle hashes the same every time it is exported.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.core.files.storage import default_storage
from django.db.models import Q

from accounts.models import AuditEntry
from accounts.privacy import mask, mask_text, shown_error
from accounts.services import for_tenant
from agentruns.archives import run_archive
from agentruns.models import Blob, Run, RunEvent, Step, StepKind
from agentruns.money import format_amount
from approvals.models import Approval
from reconciliation.models import ProviderLookup, ReconciliationCase

FORMAT = "holdfast.evidence/1"
EXPORT_ACTION = "run.evidence_exported"


def run_bundle(run: Run, *, provider_error_detail: bool) -> dict[str, Any]:
    """The evidence of ``run`` as a reader may read it (``provider_error_detail``: they
    hold ``view_provider_errors``). The run is already the reader's tenant's."""
    detail = provider_error_detail
    steps = list(run.steps.order_by("seq"))
    events = list(run.events.order_by("id"))
    if run.archived_at:
        # Its events and step payloads are in its archive document (agentruns.archives),
        # read back as recorded: the bundle is the one it was before archiving.
        archive = run_archive(run)
        archive.fill(steps)
        events = archive.events
    approvals = list(for_tenant(Approval.objects.all(), run.tenant).filter(run=run).order_by("id"))
    cases = list(
        for_tenant(ReconciliationCase.objects.all(), run.tenant)
        .filter(run=run)
        .prefetch_related("lookups")
        .order_by("id")
    )
    step_ids = {step.pk: step.step_id for step in steps}
    by_effect_key = {step.effect_key: step.step_id for step in steps if step.effect_key}
    consumed_by = {a.consumed_by_effect_key: a.pk for a in approvals if a.consumed_at}
    return {
        "format": FORMAT,
        "reading": {
            "masked": (
                "email addresses keep only their domain, card numbers their last four "
                "digits; tokens, keys and fields named like secrets are replaced whole"
            ),
            "provider_errors": (
                "the provider's own words, masked, with a reference"
                if detail
                else "what kind of failure it was, with a reference"
            ),
        },
        "run": _run(run),
        "steps": [_step(step, step_ids, consumed_by, detail) for step in steps],
        "events": [_event(event, detail) for event in events],
        "approvals": [_approval(approval, by_effect_key) for approval in approvals],
        "reconciliation_cases": [_case(case, detail) for case in cases],
        "audit": [_audit(entry) for entry in _audit_entries(run, approvals, cases)],
    }


def _at(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value else None


def _money(amount: int | None, currency: str) -> dict[str, Any] | None:
    """An amount in minor units with its currency: 4500, "eur" → "45.00 EUR"."""
    if amount is None:
        return None
    return {
        "minor_units": amount,
        "currency": (currency or "").upper(),
        "display": format_amount(amount, currency),
    }


def _model_cost(micros: int | None) -> dict[str, Any] | None:
    # Model usage is counted in millionths of a US dollar.
    if micros is None:
        return None
    usd = Decimal(micros).scaleb(-6)
    return {"micros": micros, "currency": "USD", "display": f"{usd:.6f} USD"}


def _text(value: str | None) -> str | None:
    return mask_text(value) if value else None


def _run(run: Run) -> dict[str, Any]:
    return {
        "id": str(run.id),
        "agent": f"{run.agent_name}@{run.agent_version}",
        "tenant": run.tenant.slug,
        "request_id": run.request_id,
        "requested_by": _text(run.requested_by),
        "input": mask(run.input),
        "input_hash": run.input_hash,
        "status": run.status,
        "outcome": {"code": run.outcome_code or None, "detail": _text(run.outcome_detail)},
        "output": mask(run.output),
        "created_at": _at(run.created_at),
        "finished_at": _at(run.finished_at),
        "cancel_requested_at": _at(run.cancel_requested_at),
        "cancel_requested_by": _text(run.cancel_requested_by),
        "usage": {
            "steps": run.steps_used,
            "model_calls": run.model_calls_used,
            "tokens": run.tokens_used,
            "model_cost": _model_cost(run.cost_micros),
        },
    }


def _result(step: Step) -> Any:
    # A large result is a content-addressed blob (agentruns.runtime.results).
    if not step.result_blob_id:
        return step.result
    blob = Blob.objects.get(pk=step.result_blob_id)
    with default_storage.open(blob.storage_name) as stored:
        return json.loads(stored.read())


def _error(error_class: str, text: str, detail: bool) -> dict[str, Any] | None:
    if not text and not error_class:
        return None
    return {"class": error_class or None, "message": shown_error(error_class, text, detail=detail)}


def _recovery_entry(entry: Any, detail: bool) -> Any:
    """One line of a step's recovery log: an answer's message and a failed lookup's error
    are the provider's (or its client's) words."""
    if not isinstance(entry, dict):
        return mask(entry)
    shown = mask(entry)
    if isinstance(entry.get("message"), str) and entry["message"]:
        shown["message"] = shown_error(
            str(entry.get("error_class") or ""), entry["message"], detail=detail
        )
    if isinstance(entry.get("error"), str) and entry["error"]:
        shown["error"] = shown_error("", entry["error"], detail=detail)
    return shown


def _step(step: Step, step_ids: dict, consumed_by: dict, detail: bool) -> dict[str, Any]:
    shown: dict[str, Any] = {
        "seq": step.seq,
        "step_id": step.step_id,
        "kind": step.kind,
        "name": step.name,
        "status": step.status,
        "is_effect": step.is_effect,
        "attempts": step.attempts,
        "ambiguous_attempts": step.ambiguous_attempts,
        "resent_after_absence": step.resent_after_absence,
        "effect_key": step.effect_key,
        "provider_reference": step.provider_reference or None,
        "approval_consumed": consumed_by.get(step.effect_key) if step.effect_key else None,
        "compensates": step_ids.get(step.compensates_id),
        "recovery": mask(step.recovery),
        "input": mask(step.input),
        "input_hash": step.input_hash or None,
        "request": mask(step.request),
        "result": mask(_result(step)),
        "result_hash": step.result_hash or None,
        "last_error": _error(step.last_error_class, step.last_error, detail),
        "recovery_log": [_recovery_entry(e, detail) for e in step.recovery_log or []],
        "created_at": _at(step.created_at),
        "started_at": _at(step.started_at),
        "first_sent_at": _at(step.first_sent_at),
        "last_sent_at": _at(step.last_sent_at),
        "completed_at": _at(step.completed_at),
        "retry_deadline": _at(step.retry_deadline),
    }
    if step.kind == StepKind.MODEL:
        shown["model"] = {
            "provider": step.model_provider,
            "model_id": step.model_id,
            "prompt_version": step.prompt_version,
            "tool_schema_version": step.tool_schema_version,
            "input_tokens": step.input_tokens,
            "output_tokens": step.output_tokens,
            "cost": _model_cost(step.cost_micros),
            "validation": mask(step.validation),
        }
    return shown


def _event(event: RunEvent, detail: bool) -> dict[str, Any]:
    payload = mask(event.payload or {})
    reason = (event.payload or {}).get("reason")
    if event.type == "waiting_for_retry" and isinstance(reason, str):
        # The engine's wait for a retry quotes the failure that caused it, which is
        # often the provider's own words.
        payload["reason"] = shown_error("", reason, detail=detail)
    return {
        "id": event.pk,
        "type": event.type,
        "step_id": event.step_id or None,
        "state_version": event.state_version,
        "payload": payload,
        "at": _at(event.created_at),
    }


def _approval(approval: Approval, by_effect_key: dict) -> dict[str, Any]:
    decided = approval.decided_at or approval.decided_by_name
    consumed = approval.consumed_at or approval.consumed_by_effect_key
    return {
        "id": approval.pk,
        "step_id": approval.step_id,
        "tool": approval.tool,
        "status": approval.status,
        "args": mask(approval.args),
        "args_hash": approval.args_hash,
        "effect_key": approval.effect_key,
        "amount": _money(approval.amount, approval.currency),
        "preview": _text(approval.preview),
        "resource": _text(approval.resource),
        "resource_state_then": mask(approval.resource_state),
        "resource_fingerprint": approval.resource_fingerprint,
        "provider_refusal": _text(approval.provider_refusal),
        "requested_by": _text(approval.requested_by),
        "requested_at": _at(approval.created_at),
        "expires_at": _at(approval.expires_at),
        "decision": {
            "by": _text(approval.decided_by_name),
            "at": _at(approval.decided_at),
            "note": _text(approval.note),
        }
        if decided
        else None,
        "replaces": approval.replaces_id,
        "changes": mask(approval.changes),
        "rerequested_by": _text(approval.rerequested_by),
        "rerequested_at": _at(approval.rerequested_at),
        "invalidated_reason": _text(approval.invalidated_reason),
        "consumed": {
            "at": _at(approval.consumed_at),
            "by_effect_key": approval.consumed_by_effect_key,
            "by_step_id": by_effect_key.get(approval.consumed_by_effect_key),
        }
        if consumed
        else None,
    }


def _lookup_evidence(lookup: ProviderLookup, detail: bool) -> Any:
    evidence = lookup.evidence
    if not isinstance(evidence, dict):
        return mask(evidence)
    shown = mask(evidence)
    if isinstance(evidence.get("error"), str):
        # Why the lookup itself failed, in the provider's (or its library's) words.
        shown["error"] = shown_error("", evidence["error"], detail=detail)
    return shown


def _lookup(lookup: ProviderLookup, case: ReconciliationCase, detail: bool) -> dict[str, Any]:
    return {
        "id": lookup.pk,
        "method": lookup.method,
        "method_label": lookup.get_method_display(),
        "outcome": lookup.outcome,
        "outcome_label": lookup.get_outcome_display(),
        "conclusive": lookup.conclusive,
        "actor": _text(lookup.actor),
        "provider_reference": lookup.provider_reference or None,
        "observed_amount": _money(lookup.observed_amount, lookup.observed_currency),
        "evidence": _lookup_evidence(lookup, detail),
        "note": _text(lookup.note),
        # Observations up to evidence_after came before the case last reopened.
        "describes_an_earlier_send": lookup.pk <= case.evidence_after,
        "at": _at(lookup.created_at),
    }


def _case(case: ReconciliationCase, detail: bool) -> dict[str, Any]:
    lookups = sorted(case.lookups.all(), key=lambda lookup: lookup.pk)
    return {
        "id": case.pk,
        "step_id": case.step_id_label,
        "tool": case.tool,
        "provider": case.provider or None,
        "recovery": case.recovery or None,
        "can_look_up": case.can_look_up,
        "args": mask(case.args),
        "request": mask(case.request),
        "effect_key": case.effect_key,
        "approval_id": case.approval_id,
        "amount": _money(case.amount, case.currency),
        "reason": _text(case.reason),
        "status": case.status,
        "opened_at": _at(case.opened_at),
        "reopened": case.reopened,
        "retries": case.retries,
        "lookups": [_lookup(lookup, case, detail) for lookup in lookups],
        "resolution": {
            "code": case.resolution,
            "label": case.get_resolution_display(),
            "by": _text(case.resolved_by),
            "at": _at(case.resolved_at),
            "note": _text(case.resolution_note),
            "outcome_summary": _text(case.outcome_summary),
        }
        if case.resolution
        else None,
    }


def _audit_entries(run: Run, approvals: list, cases: list) -> list[AuditEntry]:
    # audit_object index, once per kind of object.
    concerns = Q(object_type="run", object_id=str(run.id))
    if approvals:
        concerns |= Q(object_type="approval", object_id__in=[str(a.pk) for a in approvals])
    if cases:
        concerns |= Q(object_type="case", object_id__in=[str(c.pk) for c in cases])
    entries = for_tenant(AuditEntry.objects.all(), run.tenant).filter(concerns)
    return list(entries.exclude(action=EXPORT_ACTION).order_by("created_at", "id"))


def _audit(entry: AuditEntry) -> dict[str, Any]:
    # Stored masked (audit_record); masked again in case a row came another way.
    return {
        "id": entry.pk,
        "at": _at(entry.created_at),
        "actor": _text(entry.actor),
        "action": entry.action,
        "object_type": entry.object_type,
        "object_id": entry.object_id,
        "before": mask(entry.before),
        "after": mask(entry.after),
    }
