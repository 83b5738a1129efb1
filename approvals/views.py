"""The approvals inbox: what is waiting for a person, and the one decision each takes.

Short views: access is checked by ``operator_required`` (which sets the tenant),
rows are read through ``for_tenant``, decisions go through ``approvals.services``
(which audits them and wakes the run). An htmx request gets the card back; a
plain POST redirects to the inbox with a message.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from accounts.access import operator_required, user_actor
from accounts.models import AuditEntry
from accounts.services import for_tenant
from agentruns.runtime import canonical_json
from agentruns.services import get_registry
from approvals.models import Approval, ApprovalStatus
from approvals.policy import approver_problem, authority_for, format_amount
from approvals.services import (
    APPROVE,
    REJECT,
    DecisionConflict,
    DecisionRefused,
    ResourceNow,
    approval_decide,
    approval_rerequest,
    approval_resource_now,
)

PAGE_SIZE = 100
PENDING = "pending"
DECIDED = "decided"


@dataclass(frozen=True)
class Viewer:
    """What the person looking may do, worked out once per request."""

    actor: str
    # Why they can decide no approval at all (account, tenant, role), or None.
    problem: str | None
    has_authority: bool
    limit: int | None
    may_rerequest: bool

    @classmethod
    def of(cls, request: HttpRequest) -> Viewer:
        user, tenant = request.user, request.tenant
        has_authority, limit = authority_for(user, tenant)
        return cls(
            actor=user_actor(request),
            problem=approver_problem(user, tenant, None),
            has_authority=has_authority,
            limit=limit,
            may_rerequest=user.has_perm("accounts.retry_runs"),
        )

    @property
    def limit_text(self) -> str:
        return format_amount(self.limit)

    def why_not(self, request: HttpRequest, approval: Approval) -> str:
        """Why this viewer gets no decision buttons on ``approval``; "" when they may decide."""
        if approval.requested_by == self.actor:
            return "You asked for this action; another approver must decide it."
        if self.problem:
            return f"You cannot decide approvals: {self.problem}."
        if approval.amount is None or (
            self.has_authority and (self.limit is None or approval.amount <= self.limit)
        ):
            return ""
        # Refused: in the policy's own words (the same the decision would give).
        problem = approver_problem(request.user, request.tenant, approval.amount, approval.currency)
        return f"You cannot decide this one: {problem}." if problem else ""


@dataclass
class Reading:
    """The resource's state read from its provider now, against the state when asked."""

    rows: list[tuple[str, str]]
    changes: list[str]
    error: str

    @classmethod
    def of(cls, approval: Approval, now: ResourceNow) -> Reading:
        return cls(_rows(now.state or {}), now.changes_from(approval), now.error)


@dataclass
class Card:
    """One approval as the inbox shows it to one viewer."""

    approval: Approval
    why_not: str = ""
    can_rerequest: bool = False
    expired: bool = False
    error: str = ""
    flash: str = ""
    note: str = ""
    reading: Reading | None = None
    args: list[tuple[str, str]] = field(default_factory=list)
    state_then: list[tuple[str, str]] = field(default_factory=list)

    @property
    def amount(self) -> str:
        return format_amount(self.approval.amount, self.approval.currency)

    @property
    def canonical_args(self) -> str:
        # The text args_hash is taken over.
        return canonical_json(self.approval.args)


def _rows(values: Any) -> list[tuple[str, str]]:
    """Key/value rows for a table; nested values shown as JSON. Escaped by the template."""
    if not isinstance(values, dict):
        return [("value", json.dumps(values, ensure_ascii=False))]
    return [
        (str(key), value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        for key, value in values.items()
    ]


def _card(request: HttpRequest, viewer: Viewer, approval: Approval, **extra) -> Card:
    pending = approval.status == ApprovalStatus.PENDING
    return Card(
        approval=approval,
        why_not=viewer.why_not(request, approval) if pending else "",
        can_rerequest=viewer.may_rerequest
        and approval.status == ApprovalStatus.EXPIRED
        and approval.rerequested_at is None,
        expired=pending and approval.expires_at <= timezone.now(),
        args=_rows(approval.args),
        state_then=_rows(approval.resource_state),
        **extra,
    )


def _approvals(request: HttpRequest):
    return for_tenant(Approval.objects.select_related("run"), request.tenant)


def _approval_or_404(request: HttpRequest, approval_id: int) -> Approval:
    approval = _approvals(request).filter(pk=approval_id).first()
    if approval is None:
        raise Http404("No such approval.")
    return approval


def inbox_context(request: HttpRequest) -> dict:
    show = DECIDED if request.GET.get("show") == DECIDED else PENDING
    tool = request.GET.get("tool", "").strip()
    agent = request.GET.get("agent", "").strip()
    approvals = _approvals(request)
    if tool:
        approvals = approvals.filter(tool=tool)
    if agent:
        approvals = approvals.filter(run__agent_name=agent)
    pending_count = approvals.pending().count()
    if show == PENDING:
        # Oldest first: whoever has waited longest is on top.
        page = list(approvals.pending().order_by("created_at", "id")[: PAGE_SIZE + 1])
    else:
        page = list(approvals.decided().order_by("-created_at", "-id")[: PAGE_SIZE + 1])
    viewer = Viewer.of(request)
    return {
        "show": show,
        "tool": tool,
        "agent": agent,
        "tools": list(
            for_tenant(Approval.objects.all(), request.tenant)
            .order_by("tool")
            .values_list("tool", flat=True)
            .distinct()
        ),
        "agents": get_registry().names(),
        "viewer": viewer,
        "pending_count": pending_count,
        "cards": [_card(request, viewer, approval) for approval in page[:PAGE_SIZE]],
        "more": len(page) > PAGE_SIZE,
        "page_size": PAGE_SIZE,
    }


@require_GET
@operator_required("view_runs")
def approval_inbox(request: HttpRequest) -> HttpResponse:
    return render(request, "approvals/inbox.html", inbox_context(request))


def _detail(request: HttpRequest, viewer: Viewer, card: Card, status: int = 200) -> HttpResponse:
    approval = card.approval
    context = {
        "card": card,
        "viewer": viewer,
        "replaced_by": list(for_tenant(approval.replaced_by.all(), request.tenant)),
        "audit": list(
            for_tenant(AuditEntry.objects.all(), request.tenant).filter(
                object_type="approval", object_id=str(approval.pk)
            )[:50]
        ),
    }
    return render(request, "approvals/detail.html", context, status=status)


@require_GET
@operator_required("view_runs")
def approval_detail(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = _approval_or_404(request, approval_id)
    viewer = Viewer.of(request)
    return _detail(request, viewer, _card(request, viewer, approval))


@require_GET
@operator_required("view_runs")
def approval_resource(request: HttpRequest, approval_id: int) -> HttpResponse:
    """The resource's state now, read from its provider: a fragment each card loads
    after the page; without JavaScript, the approval's page with it filled in."""
    approval = _approval_or_404(request, approval_id)
    reading = Reading.of(approval, approval_resource_now(approval))
    if request.htmx:
        context = {"approval": approval, "reading": reading}
        return render(request, "approvals/inbox.html#resource_now", context)
    viewer = Viewer.of(request)
    return _detail(request, viewer, _card(request, viewer, approval, reading=reading))


def _answer(
    request: HttpRequest, approval: Approval, *, status: int = 200, **extra
) -> HttpResponse:
    """The card after an action: the fragment for htmx, the approval's page otherwise."""
    viewer = Viewer.of(request)
    card = _card(request, viewer, approval, **extra)
    if request.htmx:
        return render(request, "approvals/inbox.html#card", {"card": card}, status=status)
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
