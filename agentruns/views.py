"""The runs pages: short views that check access, read through the tenant scope, render."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.access import operator_required, user_actor
from accounts.services import audit_record, for_tenant
from agentruns.models import Run
from agentruns.runtime import CancelRefused
from agentruns.selectors import run_detail_context, run_holder_context, run_list_context
from agentruns.services import run_cancel, run_wake
from agentruns.states import state_of


def _run_or_404(request: HttpRequest, run_id: uuid.UUID) -> Run:
    run = for_tenant(Run.objects.all(), request.tenant).filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run.")
    return run


@require_GET
@operator_required("view_runs")
def run_list(request: HttpRequest) -> HttpResponse:
    context = run_list_context(request.tenant, request.GET)
    template = "agentruns/run_list.html#run_table" if request.htmx else "agentruns/run_list.html"
    return render(request, template, context)


@require_GET
@operator_required("view_runs")
def run_detail(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = _run_or_404(request, run_id)
    if request.htmx and request.GET.get("part") == "holder":
        # The worker line re-reads itself while a lease or a send deadline counts:
        # heartbeats renew a lease without writing an event the live socket would see.
        context = {"run": run, **run_holder_context(run)}
        return render(request, "agentruns/run_detail.html#holder", context)
    context = run_detail_context(run, request.user)
    template = "agentruns/run_detail.html#summary" if request.htmx else "agentruns/run_detail.html"
    return render(request, template, context)


def _after_action(request: HttpRequest, run: Run, message: str, status: int = 200):
    if request.htmx:
        run.refresh_from_db()
        context = {**run_detail_context(run, request.user), "flash": message}
        return render(request, "agentruns/run_detail.html#summary", context, status=status)
    return redirect("run-detail", run_id=run.id)


@require_POST
@operator_required("cancel_runs")
def run_cancel_view(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = _run_or_404(request, run_id)
    before = {"status": run.status}
    try:
        run = run_cancel(run.id, by=user_actor(request))
    except CancelRefused as exc:
        return _after_action(request, run, f"Not cancelled: {exc}", status=409)
    audit_record(
        tenant=request.tenant,
        actor=user_actor(request),
        action="run.cancel",
        object_type="run",
        object_id=str(run.id),
        before=before,
        after={"status": run.status},
        request=request,
    )
    now = state_of(run.status).label.lower()
    return _after_action(request, run, f"Cancel requested; the run is now {now}.")


@require_POST
@operator_required("retry_runs")
def run_retry_view(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = _run_or_404(request, run_id)
    before = {"status": run.status, "next_attempt_at": _iso(run.next_attempt_at)}
    if not run_wake(run.id, by=user_actor(request)):
        now = state_of(run.status).label.lower()
        return _after_action(request, run, f"Nothing to retry: the run is {now}.", status=409)
    run.refresh_from_db()
    audit_record(
        tenant=request.tenant,
        actor=user_actor(request),
        action="run.retry_now",
        object_type="run",
        object_id=str(run.id),
        before=before,
        after={"status": run.status, "next_attempt_at": _iso(run.next_attempt_at)},
        request=request,
    )
    return _after_action(request, run, "The run will retry now.")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
