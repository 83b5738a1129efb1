"""The reconciliation queue and the case page: short views over reconciliation.services."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.access import operator_required
from accounts.models import AuditEntry
from accounts.services import for_tenant
from agentruns.money import parse_amount
from reconciliation.models import CaseStatus, ReconciliationCase
from reconciliation.services import (
    OPERATOR_OUTCOMES,
    CaseConflict,
    CaseRefused,
    case_choices,
    case_lookup_now,
    case_record_lookup,
    case_resolve,
    newest_lookup,
)

PAGE_SIZE = 100


def _cases(request: HttpRequest):
    return for_tenant(ReconciliationCase.objects.all(), request.tenant)


def _case_or_404(request: HttpRequest, case_id: int) -> ReconciliationCase:
    case = _cases(request).select_related("run", "step", "tenant").filter(pk=case_id).first()
    if case is None:
        raise Http404("No such case.")
    return case


@require_GET
@operator_required("view_runs")
def case_queue(request: HttpRequest) -> HttpResponse:
    show = "resolved" if request.GET.get("show") == "resolved" else "open"
    cases = _cases(request).select_related("run")
    tool = request.GET.get("tool", "").strip()
    provider = request.GET.get("provider", "").strip()
    if tool:
        cases = cases.filter(tool=tool)
    if provider:
        cases = cases.filter(provider=provider)
    if show == "open":
        cases = cases.filter(status=CaseStatus.OPEN).order_by("opened_at", "id")
    else:
        cases = cases.filter(status=CaseStatus.RESOLVED).order_by("-resolved_at", "-id")
    scoped = _cases(request)
    context = {
        "cases": list(cases[:PAGE_SIZE]),
        "show": show,
        "tool": tool,
        "provider": provider,
        "tools": sorted(set(scoped.values_list("tool", flat=True).distinct()[:50])),
        "providers": sorted(set(scoped.values_list("provider", flat=True).distinct()[:50]) - {""}),
        "open_count": scoped.filter(status=CaseStatus.OPEN).count(),
    }
    template = (
        "reconciliation/queue.html#case_table" if request.htmx else "reconciliation/queue.html"
    )
    return render(request, template, context)


def case_context(case: ReconciliationCase, user) -> dict:
    step = case.step
    newest = newest_lookup(case)
    return {
        "case": case,
        "step": step,
        "newest": newest,
        "lookups": list(case.lookups.order_by("id")),
        "attempt_events": list(
            case.run.events.filter(step_id=case.step_id_label).order_by("id")[:200]
        ),
        "choices": case_choices(case) if case.is_open else [],
        "outcomes": [(o.value, o.label) for o in OPERATOR_OUTCOMES],
        "can_settle": user.has_perm("accounts.settle_effects"),
        "audit": list(
            for_tenant(AuditEntry.objects.all(), case.tenant).filter(
                object_type="case", object_id=str(case.pk)
            )[:100]
        ),
    }


@require_GET
@operator_required("view_runs")
def case_detail(request: HttpRequest, case_id: int) -> HttpResponse:
    case = _case_or_404(request, case_id)
    return render(request, "reconciliation/case.html", case_context(case, request.user))


def _respond(request, case, *, flash: str = "", error: str = "", status: int = 200):
    """htmx gets the case body; a plain form post is redirected back to the case page."""
    if request.htmx:
        case.refresh_from_db()
        context = {**case_context(case, request.user), "flash": flash, "error": error}
        return render(request, "reconciliation/case.html#case_body", context, status=status)
    if error:
        # Refused or conflicting: show the case as it is now, with why.
        case.refresh_from_db()
        context = {**case_context(case, request.user), "error": error}
        return render(request, "reconciliation/case.html", context, status=status)
    if flash:
        messages.success(request, flash)
    return redirect("case-detail", case_id=case.pk)


def _actor(request) -> str:
    return f"user:{request.user.get_username()}"


@require_POST
@operator_required("settle_effects")
def case_lookup_view(request: HttpRequest, case_id: int) -> HttpResponse:
    case = _case_or_404(request, case_id)
    if not case.is_open:
        return _respond(request, case, error="This case is already resolved.", status=409)
    try:
        lookup = case_lookup_now(case=case, actor=_actor(request), request=request)
    except CaseRefused as exc:
        return _respond(request, case, error=str(exc), status=400)
    case.refresh_from_db()
    if not case.is_open:
        flash = f"The provider answered {lookup.get_outcome_display()}: the case settled itself."
    else:
        flash = f"The provider answered: {lookup.get_outcome_display()}. The case stays open."
    return _respond(request, case, flash=flash)


def _minor_units(raw: str, currency: str) -> int | None:
    try:
        return parse_amount(raw, currency)
    except ValueError as exc:
        raise CaseRefused(str(exc)) from None


@require_POST
@operator_required("settle_effects")
def case_record_view(request: HttpRequest, case_id: int) -> HttpResponse:
    case = _case_or_404(request, case_id)
    try:
        case_record_lookup(
            case=case,
            user=request.user,
            outcome=request.POST.get("outcome", ""),
            note=request.POST.get("note", ""),
            provider_reference=request.POST.get("provider_reference", ""),
            observed_amount=_minor_units(
                request.POST.get("observed_amount", ""),
                request.POST.get("observed_currency", "") or case.currency,
            ),
            observed_currency=request.POST.get("observed_currency", ""),
            request=request,
        )
    except CaseRefused as exc:
        return _respond(request, case, error=str(exc), status=400)
    except CaseConflict as exc:
        return _respond(request, exc.case, error=str(exc), status=409)
    return _respond(request, case, flash="Your observation is recorded.")


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return -1  # matches nothing: the form was tampered with


@require_POST
@operator_required("settle_effects")
def case_resolve_view(request: HttpRequest, case_id: int) -> HttpResponse:
    case = _case_or_404(request, case_id)
    seen_version = _int_or_none(request.POST.get("seen_version"))
    if seen_version is None:
        return _respond(request, case, error="The form is missing what you saw.", status=400)
    try:
        case = case_resolve(
            case=case,
            user=request.user,
            resolution=request.POST.get("resolution", ""),
            seen_version=seen_version,
            seen_lookup_id=_int_or_none(request.POST.get("seen_lookup_id")),
            note=request.POST.get("note", ""),
            request=request,
        )
    except CaseRefused as exc:
        return _respond(request, case, error=str(exc), status=400)
    except CaseConflict as exc:
        return _respond(request, exc.case, error=str(exc), status=409)
    return _respond(request, case, flash="Resolved.")


def cases_of_run(run) -> list[ReconciliationCase]:
    """The run's cases for its page (the run is already scoped to the viewer's tenant)."""
    return list(ReconciliationCase.objects.filter(run=run).order_by("id"))
