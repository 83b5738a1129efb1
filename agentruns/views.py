"""The runs pages: short views that check access, read through the tenant scope, render."""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime, timedelta

from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from accounts.access import operator_required, user_actor
from accounts.models import AuditEntry
from accounts.services import audit_record, for_tenant
from agentruns.models import TERMINAL_STATUSES, Run, RunStatus, Step
from agentruns.runtime import CancelRefused
from agentruns.services import get_registry, run_cancel, run_wake
from approvals.policy import format_amount

PAGE_SIZE = 50
# Tab counts stop at this many: "1000+" says as much as an exact 213,419 and costs
# a bounded index range per state instead of a scan of the tenant's whole history.
COUNT_CAP = 1000
WORKING = [s for s in RunStatus if s not in TERMINAL_STATUSES]
TERMINAL = [s for s in RunStatus if s in TERMINAL_STATUSES]
SINCE = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}


def _runs(request: HttpRequest):
    return for_tenant(Run.objects.all(), request.tenant)


def _run_or_404(request: HttpRequest, run_id: uuid.UUID) -> Run:
    run = _runs(request).filter(pk=run_id).first()
    if run is None:
        raise Http404("No such run.")
    return run


def _cursor(value: str | None) -> tuple[datetime, uuid.UUID] | None:
    if not value:
        return None
    created, _, run_id = value.partition("|")
    try:
        return datetime.fromisoformat(created), uuid.UUID(run_id)
    except ValueError:
        return None


def _param(params, name: str) -> str:
    value = params.get(name, "")
    return ((value[0] if isinstance(value, list) else value) or "").strip()


def _filtered(tenant, params):
    """The tenant's runs under the page's filters, before the state tab; and the tab."""
    agent, since, query = _param(params, "agent"), _param(params, "since"), _param(params, "q")
    runs = for_tenant(Run.objects.all(), tenant)
    if agent:
        runs = runs.filter(agent_name=agent)
    if since in SINCE:
        runs = runs.filter(created_at__gte=timezone.now() - SINCE[since])
    if query:
        # No join to steps: the effect key's runs are looked up first (a unique
        # index), so the search stays one indexed OR over runs (run_tenant_order_id,
        # run_unique_request_id_per_tenant, the primary key).
        by_effect = list(
            Step.objects.filter(effect_key=query).values_list("run_id", flat=True)[:100]
        )
        match = Q(request_id=query) | Q(input__order_id=query) | Q(pk__in=by_effect)
        with contextlib.suppress(ValueError):  # not every query is a run id
            match |= Q(pk=uuid.UUID(query))
        runs = runs.filter(match)
    state = _param(params, "state")
    return runs, state if state in RunStatus.values else ""


def capped_count(runs) -> int:
    """How many ``runs`` there are, counting no further than ``COUNT_CAP + 1``.

    One ``SELECT count(*) FROM (... LIMIT cap+1)`` walking the run_tenant_status
    index range, so a state with 200,000 runs costs what one with 1,001 does.
    """
    return runs.order_by()[: COUNT_CAP + 1].count()


def list_context(tenant, params) -> dict:
    """Everything the run list shows for ``params`` (a QueryDict or a dict of lists)."""
    runs, state = _filtered(tenant, params)
    counts = {s.value: capped_count(runs.filter(status=s.value)) for s in RunStatus}
    total = capped_count(runs)
    if state:
        runs = runs.filter(status=state)
    # Keyset pagination: the page after (created_at, id), never OFFSET. The extra
    # created_at bound turns the OR into an index range (run_tenant_recent).
    after = _cursor(_param(params, "after"))
    if after is not None:
        runs = runs.filter(created_at__lte=after[0]).filter(
            Q(created_at__lt=after[0]) | Q(created_at=after[0], id__lt=after[1])
        )
    page = list(runs.order_by("-created_at", "-id")[: PAGE_SIZE + 1])
    next_cursor = None
    if len(page) > PAGE_SIZE:
        page = page[:PAGE_SIZE]
        last = page[-1]
        next_cursor = f"{last.created_at.isoformat()}|{last.id}"
    return {
        "runs": page,
        "state": state,
        "agent": _param(params, "agent"),
        "since": _param(params, "since"),
        "q": _param(params, "q"),
        "tabs": [(s, s.label, counts[s.value]) for s in WORKING + TERMINAL],
        "total": total,
        "count_cap": COUNT_CAP,
        # The deployment's agents, not a scan of every run for its agent name.
        "agents": get_registry().names(),
        "next_cursor": next_cursor,
    }


def run_matches(run: Run, params) -> bool:
    """Whether a run belongs on a list page opened with ``params`` (for live rows)."""
    runs, state = _filtered(run.tenant, params)
    if state:
        runs = runs.filter(status=state)
    return runs.filter(pk=run.id).exists()


@require_GET
@operator_required("view_runs")
def run_list(request: HttpRequest) -> HttpResponse:
    context = list_context(request.tenant, request.GET)
    template = "agentruns/run_list.html#run_table" if request.htmx else "agentruns/run_list.html"
    return render(request, template, context)


def _approvals_of(run: Run) -> list[tuple]:
    """The run's approvals, newest first, each with its amount as a person reads it.
    (The run is already the viewer's tenant's; so are its approvals.)"""
    return [
        (approval, format_amount(approval.amount, approval.currency))
        for approval in run.approvals.order_by("-id")
    ]


def _audit_of(run: Run) -> list[AuditEntry]:
    """What people did to the run, its approvals and its cases (audit_object index)."""
    approvals = [str(pk) for pk in run.approvals.values_list("pk", flat=True)]
    cases = [str(pk) for pk in run.cases.values_list("pk", flat=True)]
    concerns = Q(object_type="run", object_id=str(run.id))
    if approvals:
        concerns |= Q(object_type="approval", object_id__in=approvals)
    if cases:
        concerns |= Q(object_type="case", object_id__in=cases)
    return list(for_tenant(AuditEntry.objects.all(), run.tenant).filter(concerns)[:100])


def detail_context(run: Run, user) -> dict:
    return {
        "run": run,
        "approvals": _approvals_of(run),
        "cases": list(run.cases.order_by("id")),
        "steps": list(run.steps.order_by("seq")),
        "events": list(run.events.order_by("-id")[:200]),
        "audit": _audit_of(run),
        "can_cancel": user.has_perm("accounts.cancel_runs")
        and not run.is_terminal
        and run.status != RunStatus.EFFECT_UNKNOWN,
        "can_retry": user.has_perm("accounts.retry_runs")
        and run.status in (RunStatus.WAITING_FOR_RETRY, RunStatus.SLEEPING),
    }


@require_GET
@operator_required("view_runs")
def run_detail(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = _run_or_404(request, run_id)
    context = detail_context(run, request.user)
    template = "agentruns/run_detail.html#summary" if request.htmx else "agentruns/run_detail.html"
    return render(request, template, context)


def _after_action(request: HttpRequest, run: Run, message: str, status: int = 200):
    if request.htmx:
        run.refresh_from_db()
        context = {
            "run": run,
            "approvals": _approvals_of(run),
            "cases": list(run.cases.order_by("id")),
            "flash": message,
            "can_cancel": False,
            "can_retry": run.status in (RunStatus.WAITING_FOR_RETRY, RunStatus.SLEEPING),
        }
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
    return _after_action(request, run, f"Cancel requested; the run is now {run.status}.")


@require_POST
@operator_required("retry_runs")
def run_retry_view(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    run = _run_or_404(request, run_id)
    before = {"status": run.status, "next_attempt_at": _iso(run.next_attempt_at)}
    if not run_wake(run.id, by=user_actor(request)):
        return _after_action(
            request, run, f"Nothing to retry: the run is {run.status}.", status=409
        )
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
