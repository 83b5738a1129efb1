"""The audit page (every action on the tenant's objects, filterable) and an operator's own
preferences."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods

from accounts.access import operator_required
from accounts.selectors import audit_context
from accounts.services import (
    TimeZoneRefused,
    operator_time_zone_set,
    time_zone_names,
)


@require_GET
@operator_required("view_audit")
def audit_list(request: HttpRequest) -> HttpResponse:
    context = audit_context(request.tenant, request.GET)
    return render(request, "accounts/audit_list.html", context)


@require_http_methods(["GET", "POST"])
@operator_required("")
def preferences(request: HttpRequest) -> HttpResponse:
    """The operator's own preferences (their time zone); nobody else's can be reached here."""
    operator = request.operator
    error = ""
    typed = operator.time_zone
    if request.method == "POST":
        typed = request.POST.get("time_zone", "")
        from_browser = request.POST.get("source") == "browser"
        try:
            changed = operator_time_zone_set(
                operator=operator, time_zone=typed, from_browser=from_browser, request=request
            )
        except TimeZoneRefused as exc:
            error = str(exc)
        else:
            if from_browser:
                # The page that asked reloads itself when the zone was taken.
                return HttpResponse(status=204 if changed else 200)
            if changed:
                messages.success(request, f"Times are now shown in {operator.time_zone}.")
            return redirect("preferences")
    context = {"zones": time_zone_names(), "typed": typed, "error": error}
    return render(request, "accounts/preferences.html", context, status=400 if error else 200)
