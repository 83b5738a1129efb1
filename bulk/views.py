"""Bulk actions from the run list: a confirmation that says what will happen, then a
progress page while a worker carries it out."""

from __future__ import annotations

import uuid

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.access import forbidden, operator_required
from accounts.services import for_tenant
from agentruns.selectors import matching_runs
from bulk.models import BulkAction
from bulk.services import MAX_RUNS, PERMISSION, BulkRefused, bulk_plan, bulk_start, progress

# The run list's filters a "select all matching" carries.
FILTERS = ("state", "group", "agent", "since", "q", "outcome", "mark")


def _kind(request: HttpRequest) -> str | None:
    kind = request.POST.get("kind", "")
    return kind if kind in PERMISSION else None


def _selected(request: HttpRequest) -> tuple[list[uuid.UUID], dict]:
    """The runs the operator chose, and the choice as the audit log records it."""
    if request.POST.get("all") == "1":
        params = {name: [request.POST.get(name, "")] for name in FILTERS}
        filters = {name: values[0] for name, values in params.items() if values[0]}
        ids = list(
            matching_runs(request.tenant, params).values_list("pk", flat=True)[: MAX_RUNS + 1]
        )
        return ids, {"all_matching": filters}
    ids = []
    for raw in request.POST.getlist("run"):
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            continue  # not a run id: never one of this tenant's runs
    return ids, {"runs": len(ids)}


@require_POST
@operator_required("view_runs")
def bulk_confirm(request: HttpRequest) -> HttpResponse:
    """What the chosen action would do, to be confirmed: nothing is changed yet."""
    kind = _kind(request)
    if kind is None:
        return render(
            request, "bulk/confirm.html", {"error": "Choose cancel or retry now."}, status=400
        )
    if not request.user.has_perm(f"accounts.{PERMISSION[kind]}"):
        return forbidden(request, f"Your role may not {BulkAction.Kind(kind).label} runs.")
    ids, selection = _selected(request)
    plan = bulk_plan(request.tenant, kind, ids)
    context = {
        "plan": plan,
        "kind": kind,
        "label": BulkAction.Kind(kind).label,
        "selection": selection,
        "max_runs": MAX_RUNS,
    }
    status = 200 if plan.run_ids and not plan.too_many else 400
    return render(request, "bulk/confirm.html", context, status=status)


@require_POST
@operator_required("view_runs")
def bulk_start_view(request: HttpRequest) -> HttpResponse:
    kind = _kind(request)
    ids, selection = _selected(request)
    try:
        if kind is None:
            raise BulkRefused("choose cancel or retry now")
        action = bulk_start(
            tenant=request.tenant,
            user=request.user,
            kind=kind,
            run_ids=ids,
            selection=selection,
            request=request,
        )
    except BulkRefused as exc:
        return render(
            request, "bulk/confirm.html", {"error": f"Nothing was done: {exc}."}, status=400
        )
    return redirect("bulk-progress", action_id=action.pk)


@require_GET
@operator_required("view_runs")
def bulk_progress(request: HttpRequest, action_id: int) -> HttpResponse:
    action = for_tenant(BulkAction.objects.all(), request.tenant).filter(pk=action_id).first()
    if action is None:
        raise Http404("No such bulk action.")
    context = {"action": action, **progress(action)}
    if request.htmx:
        return render(request, "bulk/progress.html#progress", context)
    return render(request, "bulk/progress.html", context)
