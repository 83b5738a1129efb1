"""The reconciliation queue and the case page: short views over its selectors and services."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.access import operator_required, user_actor
from accounts.services import for_tenant
from agentruns.money import parse_amount
from reconciliation.models import ReconciliationCase
from reconciliation.selectors import case_context, case_queue_context
from reconciliation.services import (
    CaseConflict,
    CaseRefused,
    case_lookup_now,
    case_record_lookup,
    case_resolve,
)


def _case_or_404(request: HttpRequest, case_id: int) -> ReconciliationCase:
    cases = for_tenant(ReconciliationCase.objects.all(), request.tenant)
    case = cases.select_related("run", "step", "tenant").filter(pk=case_id).first()
    if case is None:
        raise Http404("No such case.")
    return case


@require_GET
@operator_required("view_runs")
def case_queue(request: HttpRequest) -> HttpResponse:
    context = case_queue_context(request.tenant, request.GET)
    template = (
        "reconciliation/queue.html#case_table" if request.htmx else "reconciliation/queue.html"
    )
    return render(request, template, context)


@require_GET
@operator_required("view_runs")
def case_detail(request: HttpRequest, case_id: int) -> HttpResponse:
    case = _case_or_404(request, case_id)
    return render(request, "reconciliation/case.html", case_context(case, request.user))


def _respond(
    request,
    case,
    *,
    flash: str = "",
    error: str = "",
    status: int = 200,
    typed: dict[str, str] | None = None,
):
    """htmx gets the case body; a plain form post is redirected back to the case page.

    ``typed``: on a refusal, the form that was posted (which one, every value it held and
    the field the refusal is about), drawn again open and filled in, the reason beside
    the field.
    """
    refused = {**(typed or {}), "error": error} if error else {}
    if request.htmx:
        case.refresh_from_db()
        context = {**case_context(case, request.user), "flash": flash, "error": error}
        context["typed"] = refused
        return render(request, "reconciliation/case.html#case_body", context, status=status)
    if error:
        # Refused or conflicting: show the case as it is now, with why.
        case.refresh_from_db()
        context = {**case_context(case, request.user), "error": error, "typed": refused}
        return render(request, "reconciliation/case.html", context, status=status)
    if flash:
        messages.success(request, flash)
    return redirect("case-detail", case_id=case.pk)


@require_POST
@operator_required("settle_effects")
def case_lookup_view(request: HttpRequest, case_id: int) -> HttpResponse:
    case = _case_or_404(request, case_id)
    if not case.is_open:
        return _respond(request, case, error="This case is already resolved.", status=409)
    try:
        lookup = case_lookup_now(case=case, actor=user_actor(request), request=request)
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
        raise CaseRefused(str(exc), field="observed_amount") from None


RECORD_FIELDS = ("outcome", "provider_reference", "observed_amount", "observed_currency", "note")


@require_POST
@operator_required("settle_effects")
def case_record_view(request: HttpRequest, case_id: int) -> HttpResponse:
    case = _case_or_404(request, case_id)
    typed = {"form": "record", **{name: request.POST.get(name, "") for name in RECORD_FIELDS}}
    try:
        case_record_lookup(
            case=case,
            user=request.user,
            outcome=typed["outcome"],
            note=typed["note"],
            provider_reference=typed["provider_reference"],
            observed_amount=_minor_units(
                typed["observed_amount"], typed["observed_currency"] or case.currency
            ),
            observed_currency=typed["observed_currency"],
            request=request,
        )
    except CaseRefused as exc:
        typed["field"] = exc.field
        return _respond(request, case, error=str(exc), status=400, typed=typed)
    except CaseConflict as exc:
        return _respond(request, exc.case, error=str(exc), status=409, typed=typed)
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
    typed = {
        "form": "resolve",
        "resolution": request.POST.get("resolution", ""),
        "note": request.POST.get("note", ""),
    }
    seen_version = _int_or_none(request.POST.get("seen_version"))
    if seen_version is None:
        return _respond(
            request, case, error="The form is missing what you saw.", status=400, typed=typed
        )
    try:
        case = case_resolve(
            case=case,
            user=request.user,
            resolution=typed["resolution"],
            seen_version=seen_version,
            seen_lookup_id=_int_or_none(request.POST.get("seen_lookup_id")),
            note=typed["note"],
            request=request,
        )
    except CaseRefused as exc:
        return _respond(request, case, error=str(exc), status=400, typed=typed)
    except CaseConflict as exc:
        return _respond(request, exc.case, error=str(exc), status=409, typed=typed)
    return _respond(request, case, flash="Resolved.")
