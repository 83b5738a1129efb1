"""The runs API: client systems start runs and read them with a bearer token.

A token acts as the operator it was issued to: in their tenant, with their role's
permissions, and the runs it starts are requested by them.
"""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accounts.access import api_token_problem
from accounts.models import ApiToken
from accounts.privacy import mask, mask_text
from accounts.services import (
    audit_record,
    bearer_token,
    for_tenant,
    token_actor,
    user_actor_name,
)
from agentruns.models import Run
from agentruns.runtime import (
    AdmissionError,
    DuplicateActiveRun,
    InvalidRunInput,
    RequestConflict,
    validation_errors,
)
from agentruns.selectors import run_owner, send_may_land_until
from agentruns.services import run_start


class StartRunBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1, max_length=100)
    input: dict[str, Any]
    request_id: str = Field(min_length=1, max_length=200)
    dedupe_key: str | None = Field(default=None, min_length=1, max_length=200)


def _error(status: int, message: str, **extra) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=status)


def _authenticate(request: HttpRequest, scope: str, permission: str) -> ApiToken | JsonResponse:
    token = bearer_token(request)
    if token is None:
        response = _error(401, "a valid bearer token is required")
        response["WWW-Authenticate"] = 'Bearer realm="holdfast"'
        return response
    problem = api_token_problem(token, permission)
    if problem:
        return _error(403, problem)
    if not token.allows(scope):
        return _error(403, f"this token may not do {scope}")
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def owner_json(run: Run) -> dict[str, Any] | None:
    """The worker holding the run (or last holding it: a ``lease_expires_at`` in the
    past means its lease lapsed and any worker may take the run), or None."""
    owner = run_owner(run)
    if owner is None:
        return None
    return {"host": owner.host, "pid": owner.pid, "lease_expires_at": _iso(owner.lease_expires_at)}


def run_json(run: Run, *, steps: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": str(run.id),
        "agent": run.agent_name,
        "version": run.agent_version,
        "request_id": run.request_id,
        "dedupe_key": run.dedupe_key,
        "status": run.status,
        "terminal": run.is_terminal,
        # Shown to a client system: the one masking rule, as on the pages.
        "outcome": mask_text(run.outcome_detail),
        # What the ending means at a glance ("refund_refused"), or "" when its status says it.
        "outcome_code": run.outcome_code,
        "output": mask(run.output),
        "created_at": run.created_at.isoformat(),
        "updated_at": run.updated_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "owner": owner_json(run),
    }
    if steps:
        data["steps"] = [
            {
                "step_id": step.step_id,
                "kind": step.kind,
                "name": step.name,
                "status": step.status,
                "attempts": step.attempts,
                "effect_key": step.effect_key,
                "provider_reference": step.provider_reference or None,
                "error_class": step.last_error_class or None,
                "error": mask_text(step.last_error) or None,
                "started_at": step.started_at.isoformat() if step.started_at else None,
                "completed_at": step.completed_at.isoformat() if step.completed_at else None,
                # The last send's time, and while it is in flight (cleared, no answer
                # recorded) until when it may still land at the provider; else None.
                "sent_at": _iso(step.last_sent_at),
                "may_land_until": _iso(send_may_land_until(run, step)),
            }
            for step in run.steps.order_by("seq")
        ]
    return data


@csrf_exempt  # bearer tokens, never cookies: there is no ambient credential to forge
@require_POST
def start_run(request: HttpRequest) -> JsonResponse:
    token = _authenticate(request, ApiToken.SCOPE_START, "start_runs")
    if isinstance(token, JsonResponse):
        return token
    try:
        payload = json.loads(request.body or b"")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, "the body is not valid JSON", errors={"body": [str(exc)]})
    try:
        body = StartRunBody.model_validate(payload)
    except ValidationError as exc:
        errors: dict[str, list[str]] = {}
        for problem in validation_errors(exc, root="body"):
            errors.setdefault(problem["field"], []).append(problem["message"])
        return _error(400, "the request has invalid fields", errors=errors)
    try:
        run, created = run_start(
            tenant=token.tenant,
            agent_name=body.agent,
            input=body.input,
            request_id=body.request_id,
            dedupe_key=body.dedupe_key,
            # The owner asked for it: "the requester may not approve" binds a person.
            requested_by=user_actor_name(token.owner),
        )
    except RequestConflict as exc:
        return _error(409, str(exc), run=run_json(exc.existing))
    except DuplicateActiveRun as exc:
        return _error(409, str(exc), run=run_json(exc.existing))
    except InvalidRunInput as exc:
        errors = {f"input.{e['field']}": [e["message"]] for e in exc.errors} or {
            "input": [str(exc)]
        }
        return _error(400, str(exc), errors=errors)
    except AdmissionError as exc:
        return _error(400, str(exc), errors={"agent": [str(exc)]})
    if created:
        audit_record(
            tenant=token.tenant,
            actor=user_actor_name(token.owner),
            action="run.start",
            object_type="run",
            object_id=str(run.id),
            after={
                "agent": run.agent_name,
                "request_id": run.request_id,
                "status": run.status,
                "token": token_actor(token),
            },
            request=request,
        )
    return JsonResponse(run_json(run), status=201 if created else 200)


@require_GET
def get_run(request: HttpRequest, run_id) -> JsonResponse:
    token = _authenticate(request, ApiToken.SCOPE_READ, "view_runs")
    if isinstance(token, JsonResponse):
        return token
    run = for_tenant(Run.objects.all(), token.tenant).filter(pk=run_id).first()
    if run is None:
        return _error(404, f"no run {run_id}")
    return JsonResponse(run_json(run, steps=True))
