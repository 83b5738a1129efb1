"""Settling unknown effects: lookups append observations, a resolution settles the case.

Observations (automatic lookups, what an operator found, a worker's late answer)
only ever append. A resolution is one compare-and-set on the case's version,
committed by the engine together with the step's own ``status = unknown`` check
and the run's fence (``Engine.settle_unknown``): when newer evidence arrived or
someone settled first, nothing is written and the operator is told why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef

from accounts.models import ApiToken
from accounts.services import audit_record, through, user_actor_name
from agentruns.dbclock import DbNow, now_sql
from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.runtime import CallInfo, Guard, LookupResult
from agentruns.services import credential_source, get_registry, run_requeue_settled, step_settle
from agentruns.states import state_of
from agentruns.sweeper import SweepPass
from reconciliation.desk import case_open, lookup_backoff
from reconciliation.models import (
    CaseStatus,
    Outcome,
    ProviderLookup,
    ReconciliationCase,
    Resolution,
    money,
)

log = logging.getLogger("holdfast.reconciliation")

SYSTEM = "system"
LOOKUP_TIMEOUT = 5.0
# What an operator may record having found in the provider's own records.
OPERATOR_OUTCOMES = (Outcome.SUCCEEDED, Outcome.NOT_FOUND, Outcome.DIFFERENTLY)


class CaseRefused(Exception):
    """The action is not possible for this case as it stands (the message says why).

    ``field``: the form field the refusal is about, when it is one ("" otherwise), so
    the page can say it next to that field.
    """

    def __init__(self, message: str, *, field: str = ""):
        super().__init__(message)
        self.field = field


class CaseConflict(Exception):
    """What the operator saw is no longer the case: newer evidence, or settled already."""

    def __init__(self, message: str, case: ReconciliationCase):
        super().__init__(message)
        self.case = case


# Called with each case once it is resolved (by a person, a conclusive lookup or a
# worker's late answer), after the resolution committed; a hook never raises. The
# composition root installs webhooks' hook (config/wiring.py); the sweeper repairs
# what a process that died before the hook left undone.
_resolved_hooks: tuple[Callable[[ReconciliationCase], None], ...] = ()


def install_resolved_hooks(*hooks: Callable[[ReconciliationCase], None]) -> None:
    global _resolved_hooks
    _resolved_hooks = hooks


def _resolved(case: ReconciliationCase) -> None:
    for hook in _resolved_hooks:
        hook(case)


def newest_lookup(case: ReconciliationCase) -> ProviderLookup | None:
    """The newest observation that still counts: made since the case last opened."""
    return case.lookups.filter(id__gt=case.evidence_after).order_by("-id").first()


def _append(case: ReconciliationCase, **values: Any) -> ProviderLookup:
    """Append one observation and bump the case's version, in one transaction."""
    with transaction.atomic():
        lookup = ProviderLookup.objects.create(case=case, created_at=DbNow(), **values)
        ReconciliationCase.objects.filter(pk=case.pk).update(version=F("version") + 1)
    lookup.refresh_from_db(fields=["created_at"])
    return lookup


# --- lookups --------------------------------------------------------------------------


def case_lookup_now(
    *,
    case: ReconciliationCase,
    actor: str = SYSTEM,
    request=None,
    token: ApiToken | None = None,
) -> ProviderLookup:
    """Ask the provider what happened under the case's effect key; settle it if it can tell.

    A conclusive "found" with what was intended settles the case as happened; a
    conclusive "absent" settles it as did-not-happen-send-again (once). Anything
    else is recorded and leaves the case open; an unreachable provider is asked
    again by the sweeper with backoff. ``token``: the API token the request came
    through, named in the audit entry.
    """
    if not case.can_look_up:
        raise CaseRefused(
            f"{case.provider or case.tool} offers no lookup; record what you found "
            "in its own records instead"
        )
    run = case.run
    tool = get_registry().tool_of(run, case.tool)
    if tool is None or tool.find is None:
        raise CaseRefused(
            f"agent {run.agent_name} version {run.agent_version} is not deployed here; "
            "its lookup cannot run"
        )
    info = CallInfo.for_run(
        run,
        step_id=case.step_id_label,
        effect_key=case.effect_key,
        attempt=0,
        timeout=LOOKUP_TIMEOUT,
        credential_source=credential_source(),
    )
    try:
        found: LookupResult = tool.find(case.request or {}, info)
    except Exception as exc:
        lookup = _append(
            case,
            method=ProviderLookup.Method.AUTOMATIC,
            actor=actor,
            outcome=Outcome.INCONCLUSIVE,
            evidence={"error": f"{type(exc).__name__}: {exc}"[:2000]},
            note="the provider could not be asked",
        )
        # Unreachable: the sweeper asks again later, waiting longer each time.
        failures = case.lookup_failures + 1
        ReconciliationCase.objects.filter(pk=case.pk, status=CaseStatus.OPEN).update(
            lookup_failures=failures, next_lookup_at=DbNow() + lookup_backoff(failures)
        )
        _audit_lookup(case, actor, lookup, request, token)
        return lookup
    result = found.result or {}
    if found.outcome == "found":
        outcome = Outcome.SUCCEEDED
        if case.amount is not None and result.get("amount") not in (None, case.amount):
            outcome = Outcome.DIFFERENTLY
    elif found.outcome == "absent" and found.conclusive:
        outcome = Outcome.NOT_FOUND
    else:
        outcome = Outcome.INCONCLUSIVE
    lookup = _append(
        case,
        method=ProviderLookup.Method.AUTOMATIC,
        actor=actor,
        outcome=outcome,
        conclusive=found.conclusive and outcome != Outcome.INCONCLUSIVE,
        provider_reference=str(result.get("id", ""))[:200],
        observed_amount=result.get("amount") if isinstance(result.get("amount"), int) else None,
        observed_currency=str(result.get("currency", ""))[:3],
        evidence={"detail": found.detail, "result": result} if result else {"detail": found.detail},
        note=found.detail[:2000],
    )
    # An answer, even an inconclusive one: no more automatic asking.
    ReconciliationCase.objects.filter(pk=case.pk).update(next_lookup_at=None)
    _audit_lookup(case, actor, lookup, request, token)
    case.refresh_from_db()
    if lookup.conclusive and case.is_open:
        automatic = {Outcome.SUCCEEDED: Resolution.HAPPENED, Outcome.NOT_FOUND: Resolution.RETRY}
        resolution = automatic.get(lookup.outcome)
        if resolution == Resolution.RETRY and case.retries:
            resolution = None  # sent again once already: a person decides now
        if resolution is not None:
            try:
                case_resolve(
                    case=case,
                    actor=SYSTEM,
                    resolution=resolution,
                    seen_version=case.version,
                    seen_lookup_id=lookup.pk,
                    note=f"automatic lookup: {found.detail or lookup.outcome}",
                )
            except (CaseConflict, CaseRefused) as exc:
                log.info("case %s: the lookup's conclusion was not applied: %s", case.pk, exc)
    return lookup


def case_record_lookup(
    *,
    case: ReconciliationCase,
    user,
    outcome: str,
    note: str,
    provider_reference: str = "",
    observed_amount: int | None = None,
    observed_currency: str = "",
    request=None,
    token: ApiToken | None = None,
) -> ProviderLookup:
    """Record what an operator found in the provider's own dashboard or records."""
    note = (note or "").strip()
    if outcome not in OPERATOR_OUTCOMES:
        raise CaseRefused(
            "choose what you found: it happened, it did not happen, or it differs",
            field="outcome",
        )
    if not note:
        raise CaseRefused("describe your evidence: where you looked and what you saw", field="note")
    provider_reference = (provider_reference or "").strip()
    if outcome in (Outcome.SUCCEEDED, Outcome.DIFFERENTLY) and not provider_reference:
        raise CaseRefused(
            "give the provider's reference of what happened (a refund id, say)",
            field="provider_reference",
        )
    if outcome == Outcome.DIFFERENTLY and observed_amount is None:
        raise CaseRefused("give the amount that actually happened", field="observed_amount")
    if observed_amount is not None and observed_amount < 0:
        raise CaseRefused("the observed amount cannot be negative", field="observed_amount")
    if not case.is_open:
        raise CaseConflict("this case is already resolved; its trail is below", case)
    lookup = _append(
        case,
        method=ProviderLookup.Method.OPERATOR,
        actor=user_actor_name(user),
        outcome=outcome,
        conclusive=True,
        provider_reference=provider_reference[:200],
        observed_amount=observed_amount,
        observed_currency=(observed_currency or case.currency or "").lower()[:3],
        note=note[:5000],
    )
    _audit_lookup(case, user_actor_name(user), lookup, request, token)
    return lookup


def _audit_lookup(case, actor: str, lookup: ProviderLookup, request, token=None) -> None:
    audit_record(
        tenant=case.tenant,
        actor=actor,
        action=f"case.lookup.{lookup.method}",
        object_type="case",
        object_id=case.pk,
        after=through(
            token,
            {
                "lookup": lookup.pk,
                "outcome": lookup.outcome,
                "reference": lookup.provider_reference,
                "amount": lookup.observed_amount,
            },
        ),
        request=request,
    )


# --- resolutions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Choice:
    resolution: str
    label: str
    summary: str
    allowed: bool
    why_not: str = ""


def case_choices(case: ReconciliationCase) -> list[Choice]:
    """The resolutions open to an operator now, each with what it will do, in words."""
    newest = newest_lookup(case)
    seen = newest.outcome if newest is not None else None
    ref = newest.provider_reference if newest is not None else ""
    tool = get_registry().tool_of(case.run, case.tool)
    has_undo = tool is not None and tool.undo is not None
    needs_found = "record a lookup that found it first"
    choices = [
        Choice(
            Resolution.HAPPENED,
            "It happened",
            f"The step is marked succeeded with provider reference {ref or '…'}; the run "
            "continues from there as if the answer had arrived.",
            seen == Outcome.SUCCEEDED,
            "" if seen == Outcome.SUCCEEDED else needs_found,
        ),
        Choice(
            Resolution.RETRY,
            "It did not happen: send it again",
            f"The same stored request is sent once more under effect key {case.effect_key}"
            + (", after its approval is checked again" if case.approval_id else "")
            + ". If it had happened after all, a provider that still honours the key "
            "returns that instead; one that no longer does would make a second one.",
            case.retries == 0 and seen == Outcome.NOT_FOUND,
            "it was sent again once already; only cancel remains"
            if case.retries
            else "record a lookup showing it did not happen first",
        ),
        Choice(
            Resolution.CANCEL,
            "It did not happen: cancel the run",
            "The step is marked failed (no effect) and the run is cancelled. It ends "
            f"“{_ends(RunStatus.CANCELLED_NO_EFFECT)}”, or "
            f"“{_ends(RunStatus.CANCELLED_AFTER_EFFECT)}” when earlier effects happened.",
            seen == Outcome.NOT_FOUND,
            "" if seen == Outcome.NOT_FOUND else "record a lookup showing it did not happen first",
        ),
        Choice(
            Resolution.DIFFERENTLY,
            "It happened differently",
            f"The step is recorded as it actually happened{_difference(case, newest)} "
            + (
                f"and the run compensates: {tool.undo.tool} undoes the effects, newest first."
                if has_undo
                else f"and the run ends “{_ends(RunStatus.FAILED_AFTER_EFFECT)}”: nothing "
                "undoes it automatically."
            ),
            seen == Outcome.DIFFERENTLY,
            "" if seen == Outcome.DIFFERENTLY else "record what actually happened first",
        ),
    ]
    return choices


def _ends(status: RunStatus) -> str:
    return state_of(status).label


def _difference(case: ReconciliationCase, newest: ProviderLookup | None) -> str:
    if newest is None or newest.outcome != Outcome.DIFFERENTLY:
        return ""
    observed = money(newest.observed_amount, newest.observed_currency or case.currency)
    return f" ({observed} instead of {money(case.amount, case.currency)})"


def _summary(resolution: str, case: ReconciliationCase, lookup: ProviderLookup | None) -> str:
    ref = lookup.provider_reference if lookup is not None else ""
    if resolution == Resolution.HAPPENED:
        return f"The effect happened (provider reference {ref or 'not given'}); the run went on."
    if resolution == Resolution.RETRY:
        return f"It did not happen; the request was sent again under effect key {case.effect_key}."
    if resolution == Resolution.CANCEL:
        return "It did not happen; no effect remains from this step and the run was cancelled."
    amount = money(lookup.observed_amount, lookup.observed_currency) if lookup else "?"
    return (
        f"It happened differently: {amount} (reference {ref or 'not given'}) instead of "
        f"{money(case.amount, case.currency)}. That effect remains in the world."
    )


def _case_guard(
    case: ReconciliationCase,
    *,
    seen_version: int,
    resolution: str,
    by: str,
    note: str,
    summary: str,
) -> Guard:
    table = ReconciliationCase._meta.db_table
    now = now_sql(connection.vendor)
    sql = (
        f"UPDATE {table} SET status = %s, version = version + 1, resolution = %s, "
        f"resolved_by = %s, resolved_at = {now}, resolution_note = %s, outcome_summary = %s, "
        "retries = retries + %s, next_lookup_at = NULL "
        "WHERE id = %s AND version = %s AND status = %s RETURNING id"
    )
    params = [
        CaseStatus.RESOLVED.value,
        resolution,
        by,
        note,
        summary,
        1 if resolution == Resolution.RETRY else 0,
        case.pk,
        seen_version,
        CaseStatus.OPEN.value,
    ]
    return Guard(sql, params)


def case_resolve(
    *,
    case: ReconciliationCase,
    resolution: str,
    seen_version: int,
    seen_lookup_id: int | None,
    note: str = "",
    user=None,
    actor: str | None = None,
    request=None,
    token: ApiToken | None = None,
) -> ReconciliationCase:
    """Settle the case as ``resolution``; the engine acts on it in the same commit.

    ``seen_version`` and ``seen_lookup_id`` are what the operator was looking at;
    ``token``: the API token the resolution came through, named in the audit entry.
    """
    by = actor or user_actor_name(user)
    note = (note or "").strip()
    if resolution not in (r.value for r in Resolution if r != Resolution.SETTLED_BY_PROVIDER):
        raise CaseRefused("choose one of the resolutions offered")
    case.refresh_from_db()
    newest = newest_lookup(case)
    if not case.is_open:
        raise CaseConflict(f"{case.resolved_by} already resolved this case", case)
    if case.version != seen_version or (newest.pk if newest else None) != seen_lookup_id:
        raise CaseConflict(
            "newer evidence arrived since you loaded the case; read it below and decide again",
            case,
        )
    choice = next(c for c in case_choices(case) if c.resolution == resolution)
    if not choice.allowed:
        raise CaseRefused(f"“{choice.label}” is not possible now: {choice.why_not}")
    summary = _summary(resolution, case, newest)
    guard = _case_guard(
        case, seen_version=seen_version, resolution=resolution, by=by, note=note, summary=summary
    )
    observed = None
    reference = ""
    if newest is not None and resolution in (Resolution.HAPPENED, Resolution.DIFFERENTLY):
        reference = newest.provider_reference
        observed = ((newest.evidence or {}).get("result")) or {
            "id": newest.provider_reference,
            # "It happened" without an amount: it happened as it was asked.
            "amount": newest.observed_amount if newest.observed_amount is not None else case.amount,
            "currency": newest.observed_currency or case.currency,
            "recorded_by": newest.actor,
            "note": newest.note,
        }
        if resolution == Resolution.DIFFERENTLY:
            observed = {**observed, "differs_from_request": True}
    outcome = step_settle(
        case.run_id,
        case.step_id,
        resolution=resolution,
        by=by,
        guard=guard,
        observed=observed,
        reference=reference,
        note=note,
    )
    case.refresh_from_db()
    if outcome == "busy":
        raise CaseConflict("the run is being worked on this moment; try again shortly", case)
    if outcome in ("refused", "lease_lost") or case.is_open:
        step = Step.objects.get(pk=case.step_id)
        if step.status != StepStatus.UNKNOWN:
            case = case_settled_by_provider(case)
            raise CaseConflict(
                f"the provider's own answer arrived meanwhile and settled the step as "
                f"{step.status}; nothing else was changed",
                case,
            )
        raise CaseConflict("someone else acted on this case first; read it below", case)
    # Every resolution is on the audit trail, the system's own included.
    audit_record(
        tenant=case.tenant,
        actor=by,
        action=f"case.resolve.{resolution}",
        object_type="case",
        object_id=case.pk,
        before={"status": CaseStatus.OPEN.value, "version": seen_version},
        after=through(
            token,
            {
                "status": case.status,
                "resolution": resolution,
                "lookup": seen_lookup_id,
                "run_outcome": outcome,
            },
        ),
        request=request,
    )
    _resolved(case)
    return case


def case_settled_by_provider(case: ReconciliationCase, *, push=None) -> ReconciliationCase:
    """The step was settled by a worker's late answer: the case records it and closes,
    and the run goes back to the workers once nothing of it is unknown."""
    step = Step.objects.get(pk=case.step_id)
    if step.status not in (StepStatus.SUCCEEDED, StepStatus.FAILED) or not case.is_open:
        return case
    _append(
        case,
        method=ProviderLookup.Method.LATE_ANSWER,
        actor=SYSTEM,
        outcome=Outcome.SUCCEEDED if step.status == StepStatus.SUCCEEDED else Outcome.FAILED,
        conclusive=True,
        provider_reference=step.provider_reference,
        note=f"a worker recorded the provider's answer: the step is {step.status}",
    )
    ReconciliationCase.objects.filter(pk=case.pk, status=CaseStatus.OPEN).update(
        status=CaseStatus.RESOLVED,
        version=F("version") + 1,
        resolution=Resolution.SETTLED_BY_PROVIDER,
        resolved_by=SYSTEM,
        resolved_at=DbNow(),
        outcome_summary=f"The provider's own answer settled the step as {step.status}.",
        next_lookup_at=None,
    )
    run_requeue_settled(case.run_id, by=SYSTEM, enqueue=push)
    case.refresh_from_db()
    if not case.is_open:
        _resolved(case)
    return case


# --- the sweeper's part ---------------------------------------------------------------


def cases_sweep_duty(sweep_pass: SweepPass) -> None:
    """The sweeper's duty: everything ``cases_sweep`` does. Its automatic lookups are
    workers' tasks (``reconciliation.lookups.lookups_duty``), never made here."""
    sweep_pass.report.cases.update(
        cases_sweep(limit=sweep_pass.limit, push=lambda run_id: sweep_pass.push(str(run_id)))
    )


def cases_sweep(*, limit: int = 100, push=None) -> dict[str, int]:
    """Open missing cases, close cases a late answer settled, and free runs with
    nothing unknown left."""
    opened = settled = freed = 0
    # Unknown steps of waiting runs with no open case (a crash right after the suspend).
    missing = (
        Step.objects.filter(
            status=StepStatus.UNKNOWN,
            is_effect=True,
            run__status=RunStatus.EFFECT_UNKNOWN,
        )
        .exclude(case__status=CaseStatus.OPEN)
        .values_list("run_id", "pk")[:limit]
    )
    for run_id, step_pk in missing:
        if case_open(str(run_id), step_pk, "opened by the sweeper") is not None:
            opened += 1
    # Cases whose step a worker's late answer settled.
    for case in ReconciliationCase.objects.filter(
        status=CaseStatus.OPEN, step__status__in=[StepStatus.SUCCEEDED, StepStatus.FAILED]
    )[:limit]:
        case_settled_by_provider(case, push=push)
        settled += 1
    # Runs waiting for reconciliation with nothing unknown or in flight left (a crash
    # between a case closing and its run being freed).
    unsettled = Step.objects.filter(
        run_id=OuterRef("pk"),
        is_effect=True,
        status__in=[StepStatus.UNKNOWN, StepStatus.RUNNING],
    )
    waiting = Run.objects.filter(status=RunStatus.EFFECT_UNKNOWN).exclude(Exists(unsettled))
    for run_id in waiting.values_list("id", flat=True)[:limit]:
        freed += run_requeue_settled(run_id, by=SYSTEM, enqueue=push)
    return {"opened": opened, "settled": settled, "freed": freed}
