"""/api/v1/runs: list and start runs, read one with every step, cancel it, retry it now."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any
from uuid import UUID

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema, Status
from pydantic import ConfigDict

from accounts.models import ApiToken
from accounts.privacy import mask, mask_text, shown_error
from accounts.services import for_tenant
from agentruns.marks import MARKS
from agentruns.models import Run, RunStatus, StepKind, StepStatus
from agentruns.runtime import (
    AdmissionError,
    CancelRefused,
    DuplicateActiveRun,
    InvalidRunInput,
    RequestConflict,
)
from agentruns.selectors import run_owner, run_step_rows, runs_filtered
from agentruns.services import run_cancel, run_start, run_wake
from agentruns.states import state_of
from api.auth import actor, audit, operation
from api.errors import ApiError, ErrorOut
from api.pagination import Page, PageQuery, only_known_parameters, paginate

router = Router()


class StartRunIn(Schema):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=100, description="the agent's registered name")
    input: dict[str, Any] = Field(description="the agent's input, checked against its schema")
    request_id: str = Field(
        min_length=1,
        max_length=200,
        description="the caller's id for this request: the same again answers the same run",
    )
    dedupe_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="at most one active run per tenant, agent and key",
    )


class OwnerOut(Schema):
    host: str
    pid: int | None
    lease_expires_at: datetime | None = Field(
        description="in the past: the lease lapsed and any worker may take the run"
    )


class StepOut(Schema):
    step_id: str = Field(description="position, kind and name: `0004.tool.issue_refund`")
    kind: StepKind
    name: str
    status: StepStatus = Field(description="docs/architecture.md §2.2")
    attempts: int
    ambiguous_attempts: int = Field(description="attempts whose outcome was not known at once")
    is_effect: bool = Field(description="the step may change the outside world")
    effect_key: str | None = Field(description="an effect's idempotency key, given to the provider")
    provider_reference: str | None
    error_class: str | None
    error: str | None = Field(
        description="the provider's own words if the token's owner may read them "
        "(`view_provider_errors`), else a reference"
    )
    started_at: datetime | None
    completed_at: datetime | None
    sent_at: datetime | None = Field(description="the last send's time")
    in_flight: bool = Field(description="a send was cleared and no answer is recorded yet")
    may_land_until: datetime | None = Field(
        description="while in flight: until when the send may still reach the provider"
    )
    approval_id: int | None = Field(description="the step's latest approval")
    case_id: int | None = Field(description="the step's reconciliation case")
    waits_for: str | None = Field(
        description="`approval` (a pending approval) or `case` (an open case), else null"
    )


class RunOut(Schema):
    id: UUID
    agent: str
    version: int = Field(description="the agent version the run is pinned to")
    request_id: str
    dedupe_key: str | None
    status: RunStatus = Field(description="the run's state (docs/architecture.md §2.1)")
    terminal: bool
    outcome: str = Field(description="what happened, masked as on the pages")
    outcome_code: str = Field(description='what the ending means ("refund_refused"), or ""')
    output: Any
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    owner: OwnerOut | None = Field(description="the worker holding (or last holding) the run")
    archived_at: datetime | None = Field(
        description="when the tenant's retention moved the run's events and its steps' "
        "inputs and results to its archive; the run and its steps stay readable here"
    )


class RunDetailOut(RunOut):
    steps: list[StepOut]


class RunConflictOut(ErrorOut):
    run: RunOut


def run_out(run: Run) -> dict[str, Any]:
    """The run as the API answers it, masked by the one rule the pages follow."""
    owner = run_owner(run)
    return {
        "id": run.id,
        "agent": run.agent_name,
        "version": run.agent_version,
        "request_id": run.request_id,
        "dedupe_key": run.dedupe_key,
        "status": run.status,
        "terminal": run.is_terminal,
        "outcome": mask_text(run.outcome_detail),
        "outcome_code": run.outcome_code,
        "output": mask(run.output),
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "finished_at": run.finished_at,
        "owner": owner._asdict() if owner else None,
        "archived_at": run.archived_at,
    }


def run_detail_out(run: Run, *, error_detail: bool) -> dict[str, Any]:
    """The run with every step, as its page shows them (``run_step_rows``)."""
    steps = []
    for row in run_step_rows(run):
        step = row.step
        steps.append(
            {
                "step_id": step.step_id,
                "kind": step.kind,
                "name": step.name,
                "status": step.status,
                "attempts": step.attempts,
                "ambiguous_attempts": step.ambiguous_attempts,
                "is_effect": step.is_effect,
                "effect_key": step.effect_key,
                "provider_reference": step.provider_reference or None,
                "error_class": step.last_error_class or None,
                "error": shown_error(step.last_error_class, step.last_error, detail=error_detail)
                or None,
                "started_at": step.started_at,
                "completed_at": step.completed_at,
                "sent_at": step.last_sent_at,
                "in_flight": row.may_land_until is not None,
                "may_land_until": row.may_land_until,
                "approval_id": row.approval.pk if row.approval else None,
                "case_id": row.case.pk if row.case else None,
                "waits_for": "approval"
                if row.awaiting_approval
                else ("case" if row.open_case else None),
            }
        )
    return {**run_out(run), "steps": steps}


def tenant_run(token: ApiToken, run_id: UUID) -> Run:
    run = for_tenant(Run.objects.all(), token.tenant).filter(pk=run_id).first()
    if run is None:
        raise ApiError(404, f"no run {run_id}")
    return run


# The marks a run may carry (agentruns/marks.py), as the values ``mark`` takes.
MarkName = StrEnum("MarkName", {slug: slug for slug in MARKS})


class RunFilters(PageQuery):
    status: list[RunStatus] | None = Field(
        default=None, description="any of these states; repeat for several"
    )
    agent: str | None = Field(default=None, max_length=100)
    created_after: datetime | None = Field(default=None, description="at or after this time")
    created_before: datetime | None = Field(default=None, description="before this time")
    request_id: str | None = Field(default=None, max_length=200)
    order_id: str | None = Field(default=None, max_length=200, description="the input's order")
    effect_key: str | None = Field(default=None, max_length=200, description="a step's key")
    mark: list[MarkName] | None = Field(
        default=None, description="runs carrying every one of these marks; repeat for several"
    )
    outcome: str | None = Field(
        default=None, max_length=100, description='the outcome code ("refund_refused")'
    )


START_RESPONSE = {200: RunOut, 201: RunOut, 400: ErrorOut, 409: RunConflictOut, 413: ErrorOut}
READ_RESPONSE = {200: RunDetailOut, 404: ErrorOut}


@router.post(
    "",
    **operation(
        ApiToken.SCOPE_START,
        summary="Start a run",
        description=(
            "Admits a run of `agent` with `input`, requested by the token's owner (who "
            "therefore may not approve its actions). The same `request_id` with the same "
            "input answers the same run (200); with other input, 409 and the existing run."
        ),
        response=START_RESPONSE,
        url_name="runs",
    ),
)
def runs_start(request: HttpRequest, body: StartRunIn):
    token: ApiToken = request.auth
    try:
        run, created = run_start(
            tenant=token.tenant,
            agent_name=body.agent,
            input=body.input,
            request_id=body.request_id,
            dedupe_key=body.dedupe_key,
            # The owner asked for it: "the requester may not approve" binds a person.
            requested_by=actor(token),
        )
    except (RequestConflict, DuplicateActiveRun) as exc:
        raise ApiError(409, str(exc), run=_json(run_out(exc.existing))) from exc
    except InvalidRunInput as exc:
        errors = {f"input.{e['field']}": [e["message"]] for e in exc.errors} or {
            "input": [str(exc)]
        }
        raise ApiError(400, str(exc), errors=errors) from exc
    except AdmissionError as exc:
        raise ApiError(400, str(exc), errors={"agent": [str(exc)]}) from exc
    if created:
        audit(
            request,
            token,
            action="run.start",
            object_type="run",
            object_id=run.id,
            after={"agent": run.agent_name, "request_id": run.request_id, "status": run.status},
        )
    return Status(201 if created else 200, run_out(run))


@router.get(
    "",
    **operation(
        ApiToken.SCOPE_READ,
        summary="List runs",
        description=(
            "The tenant's runs, newest first, filtered as the run list page filters them: "
            "by state (one or several), agent, creation time, request id, order id, a "
            "step's effect key, marks (retried, recovered, reconciled, approved, "
            "compensated) and outcome. Steps are not included: read a run for them."
        ),
        response={200: Page[RunOut], 400: ErrorOut},
        url_name="runs",
    ),
)
def runs_list(request: HttpRequest, filters: Query[RunFilters]):
    only_known_parameters(request, filters)
    token: ApiToken = request.auth
    runs = runs_filtered(
        token.tenant,
        states=[status.value for status in filters.status or ()],
        agent=(filters.agent or "").strip(),
        created_after=filters.created_after,
        created_before=filters.created_before,
        request_id=(filters.request_id or "").strip(),
        order_id=(filters.order_id or "").strip(),
        effect_key=(filters.effect_key or "").strip(),
        marks=[mark.value for mark in filters.mark or ()],
        outcome=(filters.outcome or "").strip(),
    )
    page = paginate(runs, filters)
    return {**page, "items": [run_out(run) for run in page["items"]]}


@router.get(
    "/{uuid:run_id}",
    **operation(
        ApiToken.SCOPE_READ,
        summary="Read a run",
        description=(
            "The run and every step, as the run page shows them: attempts, effect key, "
            "whether a send is in flight and until when it may land, the step's approval "
            "and reconciliation case. Another tenant's run is 404."
        ),
        response=READ_RESPONSE,
        url_name="run",
    ),
)
def runs_read(request: HttpRequest, run_id: UUID):
    token: ApiToken = request.auth
    run = tenant_run(token, run_id)
    detail = token.owner.has_perm("accounts.view_provider_errors")
    return run_detail_out(run, error_detail=detail)


ACTION_RESPONSE = {200: RunOut, 404: ErrorOut, 409: ErrorOut}


@router.post(
    "/{uuid:run_id}/cancel",
    **operation(
        ApiToken.SCOPE_CANCEL,
        summary="Cancel a run",
        description=(
            "What the run page's Cancel button does, with the same guards: an idle run "
            "ends now (`cancelled_no_effect`, or `cancelled_after_irreversible_effect` "
            "when an effect already happened); a run whose effect may be in flight is "
            "handed to a worker that settles it first and then honours the cancel; a "
            "running run stops at its next step. Answers the run as it is now. 409 for "
            "a run that has ended, or whose effect's outcome is unknown (settle its "
            "reconciliation case first). Audited as `run.cancel`."
        ),
        response=ACTION_RESPONSE,
        url_name="run-cancel",
    ),
)
def runs_cancel(request: HttpRequest, run_id: UUID):
    token: ApiToken = request.auth
    run = tenant_run(token, run_id)
    before = {"status": run.status}
    try:
        run = run_cancel(run.id, by=actor(token))
    except CancelRefused as exc:
        raise ApiError(409, f"not cancelled: {exc}") from exc
    audit(
        request,
        token,
        action="run.cancel",
        object_type="run",
        object_id=run.id,
        before=before,
        after={"status": run.status},
    )
    return run_out(run)


@router.post(
    "/{uuid:run_id}/retry",
    **operation(
        ApiToken.SCOPE_RETRY,
        summary="Make a run retry now",
        description=(
            "What the run page's Retry now button does: a run that is `sleeping` or "
            "`waiting_for_retry` is due now and a worker is woken for it. 409 for a run in "
            "any other state, with that state. Audited as `run.retry_now`."
        ),
        response=ACTION_RESPONSE,
        url_name="run-retry",
    ),
)
def runs_retry(request: HttpRequest, run_id: UUID):
    token: ApiToken = request.auth
    run = tenant_run(token, run_id)
    before = {"status": run.status, "next_attempt_at": _iso(run.next_attempt_at)}
    if not run_wake(run.id, by=actor(token)):
        run.refresh_from_db()
        label = state_of(run.status).label.lower()
        raise ApiError(409, f"nothing to retry: the run is {run.status} ({label})")
    run.refresh_from_db()
    audit(
        request,
        token,
        action="run.retry_now",
        object_type="run",
        object_id=run.id,
        before=before,
        after={"status": run.status, "next_attempt_at": _iso(run.next_attempt_at)},
    )
    return run_out(run)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _json(data: dict[str, Any]) -> dict[str, Any]:
    """A schema's data as JSON values, for an error body built outside the schema."""
    return RunOut.model_validate(data).model_dump(mode="json")
