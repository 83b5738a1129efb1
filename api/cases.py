"""/api/v1/cases: reconciliation cases as their page shows them, and settling them.

Each action goes through the case page's own service (``reconciliation.services``)
and carries what the caller saw, the case's ``version`` and its newest observation:
an action on a case that changed since is refused with 409 and the current ones.
Resolving is the page's compare-and-set on the version, committed with the engine's
own checks; a lookup or an observation only adds evidence, checked against what the
caller saw just before it is added.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from django.db import transaction
from django.db.models import F
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from accounts.models import ApiToken
from accounts.privacy import mask, mask_text, shown_error
from accounts.services import for_tenant
from agentruns.selectors import step_events
from api.auth import actor, operation
from api.errors import ApiError, ErrorOut
from api.money import MoneyOut, money_out
from api.pagination import Page, PageQuery, only_known_parameters, paginate
from reconciliation.models import CaseStatus, Outcome, ProviderLookup, ReconciliationCase
from reconciliation.services import (
    CaseConflict,
    CaseRefused,
    case_choices,
    case_lookup_now,
    case_record_lookup,
    case_resolve,
    newest_lookup,
)

router = Router()

ERROR_DETAIL = "accounts.view_provider_errors"


class CaseFilters(PageQuery):
    status: CaseStatus | None = Field(default=None, description="`open` or `resolved`")
    run: UUID | None = Field(default=None, description="the run's id")
    tool: str | None = Field(default=None, max_length=100, description="e.g. `issue_refund`")
    provider: str | None = Field(default=None, max_length=100)


class CaseRunOut(Schema):
    id: UUID
    agent: str
    version: int
    status: str = Field(description="the run's state now")


class CaseStepOut(Schema):
    step_id: str = Field(description="`0004.tool.issue_refund`")
    status: str = Field(description="`unknown` while nobody knows whether it happened")
    attempts: int = Field(description="how many times the request was sent")
    first_sent_at: datetime | None
    last_sent_at: datetime | None
    error_class: str | None
    error: str | None = Field(
        description="the last error: the provider's own words if the token's owner may "
        "read them (`view_provider_errors`), else its category and a reference"
    )


class AttemptOut(Schema):
    """One entry of what recovery did with the step, as the case page lists it."""

    action: str
    attempt: int | None = None
    verdict: str | None = None
    error_class: str | None = None
    message: str | None = Field(default=None, description="an error, shown by the error rule")
    outcome: str | None = None
    detail: str | None = None
    error: str | None = Field(default=None, description="shown by the error rule")
    reason: str | None = None
    by: str | None = None


class StepEventOut(Schema):
    type: str = Field(description="what happened to the step: `effect_sent`, say")
    at: datetime


class ObservationOut(Schema):
    id: int
    method: Literal["automatic", "operator", "late_answer"] = Field(
        description="`automatic` (a lookup), `operator` (what a person recorded), "
        "`late_answer` (a worker recorded the provider's answer)"
    )
    actor: str
    outcome: Outcome
    conclusive: bool
    counts: bool = Field(
        description="made since the case last opened; earlier ones describe an earlier send"
    )
    provider_reference: str | None
    observed: MoneyOut | None = Field(description="the amount the provider shows")
    note: str
    error: str | None = Field(
        description="why the provider could not be asked, shown by the error rule"
    )
    evidence: Any = Field(
        description="what the provider answered (masked); withheld when it is an error "
        "the token's owner may not read"
    )
    created_at: datetime


class ChoiceOut(Schema):
    resolution: Literal["happened", "retry", "cancel", "differently"]
    label: str
    summary: str = Field(description="what the resolution will do, in words")
    allowed: bool = Field(description="possible now, on the newest observation")
    why_not: str | None


class CaseOut(Schema):
    id: int
    status: CaseStatus
    version: int = Field(
        description="bumped by every observation and resolution: send it with each action"
    )
    newest_observation_id: int | None = Field(
        description="the newest observation that counts: send it with each action"
    )
    run: CaseRunOut
    step: CaseStepOut
    tool: str
    provider: str | None
    recovery: str | None = Field(description='how the tool recovers: "idempotent(86400s)+lookup"')
    can_look_up: bool = Field(description="the provider can be asked by effect key")
    effect_key: str = Field(description="sent as the idempotency key; the provider keeps it")
    approval_id: int | None = Field(description="the approval the send used")
    money: MoneyOut | None
    reason: str = Field(description="why the engine could not settle it")
    args: Any = Field(description="the tool's arguments (masked)")
    request: Any = Field(description="exactly what was sent (masked)")
    attempts: list[AttemptOut]
    events: list[StepEventOut] = Field(description="the run's events of this step, oldest first")
    observations: list[ObservationOut] = Field(description="oldest first")
    choices: list[ChoiceOut] = Field(description="while open: the resolutions and what they do")
    opened_at: datetime
    reopened: int = Field(description="times a retry ended unknown again")
    retries: int = Field(description="times it was sent again by a resolution")
    next_lookup_at: datetime | None = Field(description="the next automatic lookup")
    resolution: str | None
    resolved_by: str | None
    resolved_at: datetime | None
    resolution_note: str | None
    outcome_summary: str | None = Field(description="what remains true in the world")


class CaseSummaryOut(Schema):
    id: int
    status: CaseStatus
    version: int
    run: CaseRunOut
    step_id: str
    tool: str
    provider: str | None
    effect_key: str
    money: MoneyOut | None
    can_look_up: bool
    opened_at: datetime
    resolution: str | None
    resolved_by: str | None
    resolved_at: datetime | None


class SeenIn(Schema):
    """What the caller saw: the case as it read it."""

    model_config = ConfigDict(extra="forbid")

    seen_version: int = Field(ge=0, description="the case's `version` as read")
    seen_observation_id: int | None = Field(
        description="the case's `newest_observation_id` as read (null when it had none)"
    )


class RecordIn(SeenIn):
    outcome: Literal["succeeded", "not_found", "differently"] = Field(
        description="in the provider's own records: it happened, it did not, it differs"
    )
    note: str = Field(
        min_length=1, max_length=5000, description="the evidence: where you looked, what you saw"
    )
    provider_reference: str = Field(
        default="",
        max_length=200,
        description="the provider's reference (a refund id); required unless `not_found`",
    )
    observed_amount: int | None = Field(
        default=None,
        ge=0,
        description="minor units of what actually happened; required for `differently`",
    )
    observed_currency: str = Field(
        default="",
        pattern=r"^([A-Za-z]{3})?$",
        description="ISO 4217; the case's currency when empty",
    )


class ResolveIn(SeenIn):
    resolution: Literal["happened", "retry", "cancel", "differently"] = Field(
        description="one of the case's `choices` that is `allowed`"
    )
    note: str = Field(default="", max_length=2000)


class ObservedOut(Schema):
    observation: ObservationOut
    case: CaseOut


class CaseConflictOut(ErrorOut):
    version: int = Field(description="the case's version now")
    newest_observation_id: int | None = Field(description="its newest observation now")
    case: CaseOut = Field(description="the case as it is now")


def _run(case: ReconciliationCase) -> dict[str, Any]:
    run = case.run
    return {
        "id": run.id,
        "agent": run.agent_name,
        "version": run.agent_version,
        "status": run.status,
    }


def _attempt(entry: dict[str, Any], detail: bool) -> dict[str, Any]:
    error_class = entry.get("error_class") or ""
    return {
        "action": str(entry.get("action", "")),
        "attempt": entry.get("attempt") if isinstance(entry.get("attempt"), int) else None,
        "verdict": mask_text(str(entry["verdict"])) if entry.get("verdict") else None,
        "error_class": error_class or None,
        "message": shown_error(error_class, str(entry["message"]), detail=detail)
        if entry.get("message")
        else None,
        "outcome": str(entry["outcome"]) if entry.get("outcome") else None,
        "detail": mask_text(str(entry["detail"])) if entry.get("detail") else None,
        "error": shown_error("", str(entry["error"]), detail=detail)
        if entry.get("error")
        else None,
        "reason": mask_text(str(entry["reason"])) if entry.get("reason") else None,
        "by": str(entry["by"]) if entry.get("by") else None,
    }


def observation_out(
    case: ReconciliationCase, lookup: ProviderLookup, *, detail: bool
) -> dict[str, Any]:
    evidence = lookup.evidence if isinstance(lookup.evidence, dict) else None
    error = (evidence or {}).get("error")
    return {
        "id": lookup.pk,
        "method": lookup.method,
        "actor": lookup.actor,
        "outcome": lookup.outcome,
        "conclusive": lookup.conclusive,
        "counts": lookup.pk > case.evidence_after,
        "provider_reference": lookup.provider_reference or None,
        "observed": money_out(lookup.observed_amount, lookup.observed_currency or case.currency),
        "note": mask_text(lookup.note),
        "error": shown_error("", str(error), detail=detail) if error else None,
        # As the page: the evidence of an error only to who may read providers' words.
        "evidence": mask(lookup.evidence) if lookup.evidence and (detail or not error) else None,
        "created_at": lookup.created_at,
    }


def case_out(case: ReconciliationCase, *, detail: bool) -> dict[str, Any]:
    """The case as its page shows it to a reader (``detail``: may read providers' words)."""
    step = case.step
    newest = newest_lookup(case)
    return {
        "id": case.pk,
        "status": case.status,
        "version": case.version,
        "newest_observation_id": newest.pk if newest else None,
        "run": _run(case),
        "step": {
            "step_id": step.step_id,
            "status": step.status,
            "attempts": step.attempts,
            "first_sent_at": step.first_sent_at,
            "last_sent_at": step.last_sent_at,
            "error_class": step.last_error_class or None,
            "error": shown_error(step.last_error_class, step.last_error, detail=detail) or None,
        },
        "tool": case.tool,
        "provider": case.provider or None,
        "recovery": case.recovery or None,
        "can_look_up": case.can_look_up,
        "effect_key": case.effect_key,
        "approval_id": case.approval_id,
        "money": money_out(case.amount, case.currency),
        "reason": mask_text(case.reason),
        "args": mask(case.args),
        "request": mask(case.request),
        "attempts": [
            _attempt(entry, detail)
            for entry in (step.recovery_log or [])
            if isinstance(entry, dict)
        ],
        "events": [
            {"type": event.type, "at": event.created_at}
            for event in step_events(case.run, case.step_id_label)
        ],
        "observations": [
            observation_out(case, lookup, detail=detail) for lookup in case.lookups.order_by("id")
        ],
        "choices": [
            {
                "resolution": choice.resolution,
                "label": choice.label,
                "summary": mask_text(choice.summary),
                "allowed": choice.allowed,
                "why_not": choice.why_not or None,
            }
            for choice in (case_choices(case) if case.is_open else [])
        ],
        "opened_at": case.opened_at,
        "reopened": case.reopened,
        "retries": case.retries,
        "next_lookup_at": case.next_lookup_at,
        "resolution": case.resolution or None,
        "resolved_by": case.resolved_by or None,
        "resolved_at": case.resolved_at,
        "resolution_note": mask_text(case.resolution_note) or None,
        "outcome_summary": case.outcome_summary or None,
    }


def case_summary_out(case: ReconciliationCase) -> dict[str, Any]:
    return {
        "id": case.pk,
        "status": case.status,
        "version": case.version,
        "run": _run(case),
        "step_id": case.step_id_label,
        "tool": case.tool,
        "provider": case.provider or None,
        "effect_key": case.effect_key,
        "money": money_out(case.amount, case.currency),
        "can_look_up": case.can_look_up,
        "opened_at": case.opened_at,
        "resolution": case.resolution or None,
        "resolved_by": case.resolved_by or None,
        "resolved_at": case.resolved_at,
    }


def tenant_case(token: ApiToken, case_id: int, *, lock: bool = False) -> ReconciliationCase:
    cases = for_tenant(ReconciliationCase.objects.all(), token.tenant)
    if lock:
        # Held until the caller's transaction ends: an observation waits for another.
        cases = cases.select_for_update(of=("self",))
    case = cases.select_related("run", "step", "tenant").filter(pk=case_id).first()
    if case is None:
        raise ApiError(404, f"no case {case_id}")
    return case


def _detail(token: ApiToken) -> bool:
    return token.owner.has_perm(ERROR_DETAIL)


def _conflict(token: ApiToken, case: ReconciliationCase, message: str) -> ApiError:
    """The 409 of an action on a case that is not as the caller saw it: why, and the
    case as it is now (its version and newest observation to send next time)."""
    current = case_out(tenant_case(token, case.pk), detail=_detail(token))
    body = CaseConflictOut.model_validate(
        {
            "error": message,
            "version": current["version"],
            "newest_observation_id": current["newest_observation_id"],
            "case": current,
        }
    ).model_dump(mode="json", exclude={"error", "errors"})
    return ApiError(409, message, **body)


def _check_seen(token: ApiToken, case: ReconciliationCase, seen: SeenIn) -> None:
    """Nothing if the case is open and as the caller saw it; else the 409 saying how."""
    if not case.is_open:
        raise _conflict(token, case, f"{case.resolved_by or 'someone'} already resolved this case")
    newest = newest_lookup(case)
    if case.version != seen.seen_version or (newest.pk if newest else None) != (
        seen.seen_observation_id
    ):
        raise _conflict(
            token,
            case,
            "the case changed since you read it (newer evidence, or a resolution); "
            "read it again and decide on what it shows now",
        )


CASE_CONFLICT = (
    "**409** the case is not as the caller saw it: resolved already (by whom), or a "
    "newer observation or resolution changed its `version`; nothing was done, and the "
    "body carries the current `version` and `newest_observation_id`."
)


@router.get(
    "",
    **operation(
        ApiToken.SCOPE_CASES_READ,
        summary="List reconciliation cases",
        description=(
            "The tenant's cases (effects whose outcome is unknown), newest first, "
            "filtered by status (`open`, `resolved`), run, tool and provider, as the "
            "reconciliation queue lists them. Read one for its evidence."
        ),
        response={200: Page[CaseSummaryOut], 400: ErrorOut},
        url_name="cases",
    ),
)
def cases_list(request: HttpRequest, filters: Query[CaseFilters]):
    only_known_parameters(request, filters)
    token: ApiToken = request.auth
    # Cases are paged by when they opened (a reopened case keeps its place).
    cases = for_tenant(ReconciliationCase.objects.select_related("run"), token.tenant).annotate(
        created_at=F("opened_at")
    )
    if filters.status:
        cases = cases.filter(status=filters.status)
    if filters.run:
        cases = cases.filter(run_id=filters.run)
    if filters.tool:
        cases = cases.filter(tool=filters.tool.strip())
    if filters.provider:
        cases = cases.filter(provider=filters.provider.strip())
    page = paginate(cases, filters)
    return {**page, "items": [case_summary_out(case) for case in page["items"]]}


@router.get(
    "/{int:case_id}",
    **operation(
        ApiToken.SCOPE_CASES_READ,
        summary="Read a reconciliation case",
        description=(
            "Everything the case page shows: the run and the step (attempts, when sent, "
            "the last error), the tool and provider, the effect key, the arguments and "
            "exactly what was sent (masked), the amount with its currency, what recovery "
            "did, every observation so far, the resolutions open now with what each "
            "will do, and the case's `version` and `newest_observation_id`, which every "
            "action carries back. Providers' own error words only for an owner with "
            "`view_provider_errors`. Another tenant's case is 404."
        ),
        response={200: CaseOut, 404: ErrorOut},
        url_name="case",
    ),
)
def cases_read(request: HttpRequest, case_id: int):
    token: ApiToken = request.auth
    return case_out(tenant_case(token, case_id), detail=_detail(token))


@router.post(
    "/{int:case_id}/lookup",
    **operation(
        ApiToken.SCOPE_CASES_SETTLE,
        summary="Look the effect up now",
        description=(
            "Asks the provider now what happened under the case's effect key, as the "
            "page's *Look up now* does, and records the answer as an observation (201). "
            "A conclusive answer settles the case by itself: found as intended, it "
            "happened; conclusively absent, the request is sent again once. An "
            "unreachable provider is recorded too and asked again later.\n\n"
            f"- {CASE_CONFLICT}\n"
            "- **400** the provider offers no lookup (record an observation instead).\n\n"
            "Audited as `case.lookup.automatic` with the owner as actor and the token."
        ),
        response={
            201: ObservedOut,
            400: ErrorOut,
            404: ErrorOut,
            409: CaseConflictOut,
            413: ErrorOut,
        },
        url_name="case-lookup",
    ),
)
def cases_lookup(request: HttpRequest, case_id: int, body: SeenIn):
    token: ApiToken = request.auth
    case = tenant_case(token, case_id)
    _check_seen(token, case, body)
    try:
        # The provider is asked outside any transaction (slow I/O never runs in one).
        lookup = case_lookup_now(case=case, actor=actor(token), request=request, token=token)
    except CaseRefused as exc:
        raise ApiError(400, str(exc)) from exc
    return _observed(token, case_id, lookup)


@router.post(
    "/{int:case_id}/observations",
    **operation(
        ApiToken.SCOPE_CASES_SETTLE,
        summary="Record an observation",
        description=(
            "Records what the caller found in the provider's own records, as the page's "
            "*Record what you found* form does (201): `succeeded` (with the provider's "
            "reference), `not_found`, or `differently` (with the reference and the "
            "`observed_amount` in minor units). The note says where you looked and what "
            "you saw. It is evidence only: resolve the case next.\n\n"
            f"- {CASE_CONFLICT}\n"
            "- **400** a field is missing or wrong (`errors` names it).\n\n"
            "Audited as `case.lookup.operator` with the owner as actor and the token."
        ),
        response={
            201: ObservedOut,
            400: ErrorOut,
            404: ErrorOut,
            409: CaseConflictOut,
            413: ErrorOut,
        },
        url_name="case-observations",
    ),
)
def cases_record(request: HttpRequest, case_id: int, body: RecordIn):
    token: ApiToken = request.auth
    with transaction.atomic():
        # Locked: two observations on the same version are one after the other, and
        # the second is refused as stale.
        case = tenant_case(token, case_id, lock=True)
        _check_seen(token, case, body)
        try:
            lookup = case_record_lookup(
                case=case,
                user=token.owner,
                outcome=body.outcome,
                note=body.note,
                provider_reference=body.provider_reference,
                observed_amount=body.observed_amount,
                observed_currency=body.observed_currency,
                request=request,
                token=token,
            )
        except CaseRefused as exc:
            raise ApiError(400, str(exc), errors={exc.field or "body": [str(exc)]}) from exc
        except CaseConflict as exc:
            raise _conflict(token, exc.case, str(exc)) from exc
    return _observed(token, case_id, lookup)


@router.post(
    "/{int:case_id}/resolution",
    **operation(
        ApiToken.SCOPE_CASES_SETTLE,
        summary="Resolve a reconciliation case",
        description=(
            "Settles the case as the page does, with one of its `choices` that is "
            "`allowed`: `happened` (the step succeeded with the observed reference; the "
            "run goes on), `retry` (send the same request again under the same key, "
            "once), `cancel` (it did not happen; the run is cancelled) or `differently` "
            "(recorded as it happened; the run compensates or fails). The engine acts on "
            "it in the same commit.\n\n"
            f"- {CASE_CONFLICT} Also when the provider's own answer settled the step "
            "meanwhile, or the run is being worked on this moment.\n"
            "- **400** the resolution is not possible on the evidence (its `why_not`).\n\n"
            "Audited as `case.resolve.<resolution>` with the owner as actor and the token."
        ),
        response={200: CaseOut, 400: ErrorOut, 404: ErrorOut, 409: CaseConflictOut, 413: ErrorOut},
        url_name="case-resolution",
    ),
)
def cases_resolve(request: HttpRequest, case_id: int, body: ResolveIn):
    token: ApiToken = request.auth
    case = tenant_case(token, case_id)
    _check_seen(token, case, body)
    try:
        # The service's compare-and-set on the version is the check that counts (a
        # resolution racing this one); the one above words the common case.
        case = case_resolve(
            case=case,
            user=token.owner,
            resolution=body.resolution,
            seen_version=body.seen_version,
            seen_lookup_id=body.seen_observation_id,
            note=body.note,
            request=request,
            token=token,
        )
    except CaseRefused as exc:
        raise ApiError(400, str(exc), errors={"resolution": [str(exc)]}) from exc
    except CaseConflict as exc:
        raise _conflict(token, exc.case, str(exc)) from exc
    return case_out(tenant_case(token, case.pk), detail=_detail(token))


def _observed(token: ApiToken, case_id: int, lookup: ProviderLookup):
    case = tenant_case(token, case_id)
    detail = _detail(token)
    return Status(
        201,
        {
            "observation": observation_out(case, lookup, detail=detail),
            "case": case_out(case, detail=detail),
        },
    )
