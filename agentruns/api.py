"""The runs API: client systems start runs and read them with a bearer token.

A token acts as the operator it was issued to: in their tenant, with their role's
permissions, and the runs it starts are requested by them.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from accounts.access import api_token_problem
from accounts.models import ApiToken
from accounts.privacy import mask, mask_text, shown_error
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


def _only(method: str):
    """The view answers ``method`` only; any other is a JSON 405 like every API error."""

    def decorate(view):
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs):
            if request.method != method:
                response = _error(405, f"{request.method} is not allowed here; use {method}")
                response["Allow"] = method
                return response
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


@csrf_exempt
def not_found(request: HttpRequest, path: str = "") -> JsonResponse:
    """Every other address under /api/: a JSON 404, never the site's HTML page."""
    return _error(404, f"no such API address: /api/{path}")


# Deeper than any run input needs; a deeper body is refused before it is walked.
MAX_NESTING = 32


def _json_body(request: HttpRequest) -> Any:
    """The body as JSON, or the JSON error that says why it is not acceptable."""
    try:
        raw = request.body
    except RequestDataTooBig:
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return _error(413, f"the body is larger than {limit} bytes", errors={"body": ["too large"]})
    if _nesting(raw) > MAX_NESTING:
        return _error(
            400,
            f"the body is nested deeper than {MAX_NESTING} levels",
            errors={"body": ["nested too deeply"]},
        )
    try:
        return json.loads(raw or b"")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        return _error(400, "the body is not valid JSON", errors={"body": [str(exc)[:200]]})


def _nesting(raw: bytes) -> int:
    """How deep brackets nest in a JSON text, outside strings (no parse, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


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


def run_json(run: Run, *, steps: bool = False, error_detail: bool = False) -> dict[str, Any]:
    """The run as the API answers it. A step's provider error is its category and
    reference unless the token's owner may read providers' own words (``error_detail``)."""
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
                "error": shown_error(step.last_error_class, step.last_error, detail=error_detail)
                or None,
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
@_only("POST")
def start_run(request: HttpRequest) -> JsonResponse:
    token = _authenticate(request, ApiToken.SCOPE_START, "start_runs")
    if isinstance(token, JsonResponse):
        return token
    payload = _json_body(request)
    if isinstance(payload, JsonResponse):
        return payload
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


@csrf_exempt  # bearer tokens, as start_run; a POST gets the JSON 405, not an HTML 403
@_only("GET")
def get_run(request: HttpRequest, run_id) -> JsonResponse:
    token = _authenticate(request, ApiToken.SCOPE_READ, "view_runs")
    if isinstance(token, JsonResponse):
        return token
    run = for_tenant(Run.objects.all(), token.tenant).filter(pk=run_id).first()
    if run is None:
        return _error(404, f"no run {run_id}")
    detail = token.owner.has_perm("accounts.view_provider_errors")
    return JsonResponse(run_json(run, steps=True, error_detail=detail))
