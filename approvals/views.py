"""The approvals inbox: what is waiting for a person, and the one decision each takes.

Short views: access is checked by ``operator_required`` (which sets the tenant),
pages are read through ``approvals.selectors``, decisions go through
``approvals.services`` (which audits them and wakes the run). An htmx request
gets the card back; a plain POST redirects to the inbox with a message.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.access import operator_required, user_actor
from accounts.services import for_tenant
from approvals.models import Approval
from approvals.selectors import (
    Card,
    Reading,
    Viewer,
    approval_card,
    approval_detail_context,
    inbox_context,
)
from approvals.services import (
    APPROVE,
    REJECT,
    DecisionConflict,
    DecisionRefused,
    ResourceChanged,
    approval_ask_again,
    approval_decide,
    approval_rerequest,
    approval_resource_now,
)


def _viewer(request: HttpRequest) -> Viewer:
    return Viewer.of(request.user, request.tenant, actor=user_actor(request))


def _approval_or_404(request: HttpRequest, approval_id: int) -> Approval:
    approvals = for_tenant(Approval.objects.select_related("run"), request.tenant)
    approval = approvals.filter(pk=approval_id).first()
    if approval is None:
        raise Http404("No such approval.")
    return approval


@require_GET
@operator_required("view_runs")
def approval_inbox(request: HttpRequest) -> HttpResponse:
    return render(request, "approvals/inbox.html", inbox_context(_viewer(request), request.GET))


def _detail(request: HttpRequest, viewer: Viewer, card: Card, status: int = 200) -> HttpResponse:
    context = approval_detail_context(viewer, card)
    return render(request, "approvals/detail.html", context, status=status)


@require_GET
@operator_required("view_runs")
def approval_detail(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = _approval_or_404(request, approval_id)
    viewer = _viewer(request)
    return _detail(request, viewer, approval_card(viewer, approval))


@require_GET
@operator_required("view_runs")
def approval_resource(request: HttpRequest, approval_id: int) -> HttpResponse:
    """The resource's state now, read from its provider: a fragment each card loads
    after the page; without JavaScript, the approval's page with it filled in."""
    approval = _approval_or_404(request, approval_id)
    # "Read again" asks the provider now; a page loading takes a reading seconds old.
    fresh = request.GET.get("fresh") == "1"
    reading = Reading.of(approval, approval_resource_now(approval, fresh=fresh))
    if request.htmx:
        # oob: a reading that shows changes also swaps the card's Approve for
        # "Ask again with the current state" (approve_slot, by its id).
        context = {
            "approval": approval,
            "reading": reading,
            "oob": True,
            "error_detail": _viewer(request).error_detail,
        }
        return render(request, "approvals/inbox.html#resource_now", context)
    viewer = _viewer(request)
    return _detail(request, viewer, approval_card(viewer, approval, reading=reading))


def _answer(
    request: HttpRequest, approval: Approval, *, status: int = 200, **extra
) -> HttpResponse:
    """The card after an action: the fragment for htmx, the approval's page otherwise."""
    viewer = _viewer(request)
    card = approval_card(viewer, approval, **extra)
    if request.htmx:
        context = {"card": card, "error_detail": viewer.error_detail}
        return render(request, "approvals/inbox.html#card", context, status=status)
    return _detail(request, viewer, card, status=status)


@require_POST
@operator_required("decide_approvals")
def approval_decide_view(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = _approval_or_404(request, approval_id)
    decision = request.POST.get("decision", "")
    note = request.POST.get("note", "")
    if decision not in (APPROVE, REJECT):
        return _answer(request, approval, status=400, note=note, error="Choose Approve or Reject.")
    try:
        approval = approval_decide(
            approval=approval,
            user=request.user,
            decision=decision,
            seen_args_hash=request.POST.get("args_hash", ""),
            note=note,
            request=request,
        )
    except DecisionRefused as exc:
        return _answer(request, approval, status=403, note=note, error=f"Not decided: {exc}.")
    except ResourceChanged as exc:
        reading = Reading.of(exc.approval, exc.now)
        error = f"Not decided: {exc}."
        return _answer(request, exc.approval, status=409, note=note, error=error, reading=reading)
    except DecisionConflict as exc:
        return _answer(request, exc.approval, status=409, error=f"Not decided: {exc}.")
    approval.run.refresh_from_db(fields=["status"])  # woken by the decision
    if decision == APPROVE:
        message = f"Approval {approval.pk} approved: the run goes on with exactly these arguments."
    else:
        message = f"Approval {approval.pk} rejected: the agent is told your note."
    if request.htmx:
        return _answer(request, approval, flash=message)
    messages.success(request, message)
    return redirect("approval-inbox")


@require_POST
@operator_required("retry_runs")
def approval_rerequest_view(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = _approval_or_404(request, approval_id)
    try:
        approval = approval_rerequest(approval=approval, user=request.user, request=request)
    except DecisionConflict as exc:
        return _answer(request, exc.approval, status=409, error=f"Not asked again: {exc}.")
    message = (
        f"Asked again for approval {approval.pk}: the run reads the resource afresh "
        "and a new approval appears in the inbox."
    )
    if request.htmx:
        return _answer(request, approval, flash=message)
    messages.success(request, message)
    return redirect("approval-inbox")


@require_POST
@operator_required("decide_approvals")
def approval_ask_again_view(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = _approval_or_404(request, approval_id)
    try:
        approval = approval_ask_again(approval=approval, user=request.user, request=request)
    except DecisionConflict as exc:
        return _answer(request, exc.approval, status=409, error=f"Not asked again: {exc}.")
    message = (
        f"Asked again for approval {approval.pk} with the current state: the run reads "
        f"{approval.resource} and a new approval listing what changed appears in the inbox."
    )
    if request.htmx:
        return _answer(request, approval, flash=message)
    messages.success(request, message)
    return redirect("approval-inbox")
