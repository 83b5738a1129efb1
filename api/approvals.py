"""/api/v1/approvals: list and read approvals as the inbox shows them, and decide one.

A decision goes through ``approvals.services.approval_decide``, the inbox form's own
function, with the hash the caller saw: every guard the form has (the requester may
not approve, the approver's authority in the amount's currency, the provider's
refusal, the resource unchanged since it was asked) and the same compare-and-set, so a
decision here racing one in the inbox yields exactly one decision.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, Query, Router, Schema
from pydantic import ConfigDict

from accounts.models import ApiToken
from accounts.privacy import mask, mask_text
from accounts.services import for_tenant
from api.auth import actor, operation
from api.errors import ApiError, ErrorOut
from api.money import MoneyOut, money_out
from api.pagination import Page, PageQuery, only_known_parameters, paginate
from approvals.models import Approval, ApprovalStatus
from approvals.selectors import Viewer, approval_card
from approvals.services import (
    REJECT,
    DecisionConflict,
    DecisionRefused,
    ResourceChanged,
    approval_decide,
)

router = Router()


class ApprovalState(StrEnum):
    """What the list's ``status`` filter names."""

    PENDING = "pending"  # waiting for a decision, not past its expiry
    DECIDED = "decided"  # approved or rejected by a person (an approved one may be used)
    EXPIRED = "expired"  # past its expiry undecided, marked expired or not yet
    INVALIDATED = "invalidated"  # no longer holds: asked again, or the resource changed


# The approval statuses a person's decision leaves behind.
DECIDED_STATUSES = (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.CONSUMED)


class ApprovalFilters(PageQuery):
    status: list[ApprovalState] | None = Field(
        default=None, description="any of these; repeat for several"
    )
    agent: str | None = Field(default=None, max_length=100, description="the run's agent")
    tool: str | None = Field(default=None, max_length=100, description="e.g. `issue_refund`")
    run: UUID | None = Field(default=None, description="the run's id")


class ApprovalRunOut(Schema):
    id: UUID
    agent: str
    version: int = Field(description="the agent version the run is pinned to")
    status: str = Field(description="the run's state now")


class DecisionOut(Schema):
    decision: Literal["approved", "rejected"]
    by: str = Field(description='who decided: "user:ann"')
    at: datetime | None
    note: str = Field(description="the approver's note (the agent is told a rejection's)")


class ApprovalOut(Schema):
    id: int
    status: str = Field(
        description="pending, approved, rejected, expired, invalidated, or consumed (an "
        "approved action that was sent)"
    )
    expired: bool = Field(
        description="past `expires_at`: no decision is possible, even while `status` is "
        "still pending (the sweeper marks it expired shortly)"
    )
    run: ApprovalRunOut
    step_id: str
    tool: str
    args: Any = Field(
        description="the exact arguments the approval is bound to, masked as the inbox "
        "shows them (a card number or an address reads ••••)"
    )
    canonical_args: str = Field(
        description="the canonical JSON `args_hash` is taken over, masked the same way"
    )
    args_masked: bool = Field(
        description="`canonical_args` has masked values: the hash is of the text in full"
    )
    args_hash: str = Field(description="sha256 of the canonical arguments: send it to decide")
    effect_key: str
    money: MoneyOut | None = Field(description="what the action moves; null when no money")
    preview: str = Field(description="the tool's policy: what the action does, in words")
    provider_refusal: str | None = Field(
        description="why the provider will refuse the action as the resource stood when "
        "asked: such an approval can only be rejected"
    )
    resource: str = Field(description="what the action acts on: `payment_intent:pi_…`")
    resource_state: Any = Field(description="the resource when asked (masked)")
    requested_by: str | None = Field(description='who asked: "user:…"; null for the agent')
    created_at: datetime
    expires_at: datetime
    decision: DecisionOut | None
    replaces: int | None = Field(description="the approval this one replaces")
    changes: list[str] = Field(description="what changed since the approval it replaces")
    invalidated_reason: str | None
    used_by: str | None = Field(description='the send that used it: "refund re_…"')
    consumed_at: datetime | None
    may_decide: bool = Field(
        description="the token's owner may approve or reject it now (the inbox's buttons)"
    )
    why_not: str | None = Field(
        description="why the token's owner may not decide it, in the inbox's words"
    )


class DecideIn(Schema):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    args_hash: str = Field(
        min_length=1,
        max_length=64,
        description="the `args_hash` of the approval as the caller read it: the decision "
        "holds only for those exact arguments",
    )
    note: str = Field(
        default="",
        max_length=2000,
        description="why; required to reject (the agent is told the reason)",
    )


class DecisionConflictOut(ErrorOut):
    approval: ApprovalOut = Field(description="the approval as it is now")
    args_hash: str = Field(description="the hash the approval is bound to now")
    changes: list[str] | None = Field(
        default=None, description="what changed in the resource since it was asked"
    )
    resource_now: Any = Field(default=None, description="the resource as read now (masked)")


def _filtered(approvals: QuerySet, states: list[ApprovalState]) -> QuerySet:
    now = timezone.now()
    wanted = Q()
    for state in states:
        if state == ApprovalState.PENDING:
            wanted |= Q(status=ApprovalStatus.PENDING, expires_at__gt=now)
        elif state == ApprovalState.DECIDED:
            wanted |= Q(status__in=DECIDED_STATUSES)
        elif state == ApprovalState.EXPIRED:
            wanted |= Q(status=ApprovalStatus.EXPIRED)
            wanted |= Q(status=ApprovalStatus.PENDING, expires_at__lte=now)
        else:
            wanted |= Q(status=ApprovalStatus.INVALIDATED)
    return approvals.filter(wanted)


def _viewer(token: ApiToken) -> Viewer:
    return Viewer.of(token.owner, token.tenant, actor=actor(token))


def approval_out(viewer: Viewer, approval: Approval) -> dict[str, Any]:
    """The approval as the inbox's card shows it to the token's owner."""
    card = approval_card(viewer, approval)
    run = approval.run
    pending = approval.status == ApprovalStatus.PENDING
    # Approved, rejected, or approved and then used or invalidated at the send.
    decided = bool(approval.decided_by_name)
    why_not = ""
    if pending:
        # A provider's refusal leaves Reject offered: still a decision to make.
        why_not = card.why_not or ("this approval has expired" if card.expired else "")
    return {
        "id": approval.pk,
        "status": approval.status,
        "expired": card.expired or approval.status == ApprovalStatus.EXPIRED,
        "run": {
            "id": run.id,
            "agent": run.agent_name,
            "version": run.agent_version,
            "status": run.status,
        },
        "step_id": approval.step_id,
        "tool": approval.tool,
        "args": mask(approval.args),
        "canonical_args": card.canonical_args,
        "args_masked": card.canonical_masked,
        "args_hash": approval.args_hash,
        "effect_key": approval.effect_key,
        "money": money_out(approval.amount, approval.currency),
        "preview": mask_text(approval.preview),
        "provider_refusal": mask_text(approval.provider_refusal) or None,
        "resource": approval.resource,
        "resource_state": mask(approval.resource_state),
        "requested_by": approval.requested_by or None,
        "created_at": approval.created_at,
        "expires_at": approval.expires_at,
        "decision": {
            # A consumed approval was approved, then used.
            "decision": "rejected" if approval.status == ApprovalStatus.REJECTED else "approved",
            "by": approval.decided_by_name,
            "at": approval.decided_at,
            "note": mask_text(approval.note),
        }
        if decided
        else None,
        "replaces": approval.replaces_id,
        "changes": list(approval.changes or []),
        "invalidated_reason": mask_text(approval.invalidated_reason) or None,
        "used_by": card.used_by or None,
        "consumed_at": approval.consumed_at,
        "may_decide": pending and not why_not,
        "why_not": why_not or None,
    }


def tenant_approval(token: ApiToken, approval_id: int) -> Approval:
    approvals = for_tenant(Approval.objects.select_related("run", "tenant"), token.tenant)
    approval = approvals.filter(pk=approval_id).first()
    if approval is None:
        raise ApiError(404, f"no approval {approval_id}")
    return approval


@router.get(
    "",
    **operation(
        ApiToken.SCOPE_APPROVALS_READ,
        summary="List approvals",
        description=(
            "The tenant's approvals, newest first, each as the inbox's card shows it, "
            "filtered by status (`pending`: waiting and not expired; `decided`: approved "
            "or rejected, an approved one possibly used since; `expired`; `invalidated`), "
            "the run's agent, the tool and the run. `?status=pending` is what waits for "
            "a person now."
        ),
        response={200: Page[ApprovalOut], 400: ErrorOut},
        url_name="approvals",
    ),
)
def approvals_list(request: HttpRequest, filters: Query[ApprovalFilters]):
    only_known_parameters(request, filters)
    token: ApiToken = request.auth
    approvals = for_tenant(Approval.objects.select_related("run"), token.tenant)
    if filters.status:
        approvals = _filtered(approvals, filters.status)
    if filters.agent:
        approvals = approvals.filter(run__agent_name=filters.agent.strip())
    if filters.tool:
        approvals = approvals.filter(tool=filters.tool.strip())
    if filters.run:
        approvals = approvals.filter(run_id=filters.run)
    page = paginate(approvals, filters)
    viewer = _viewer(token)
    return {**page, "items": [approval_out(viewer, a) for a in page["items"]]}


@router.get(
    "/{int:approval_id}",
    **operation(
        ApiToken.SCOPE_APPROVALS_READ,
        summary="Read an approval",
        description=(
            "Everything the approval's card shows: the run and step, the tool, the exact "
            "arguments (masked as the inbox masks them) with their canonical JSON and "
            "`args_hash`, the amount with its currency, the policy's words, who asked, "
            "the expiry, the decision if any, and whether the token's owner may decide "
            "it (`may_decide`, else `why_not`). Another tenant's approval is 404."
        ),
        response={200: ApprovalOut, 404: ErrorOut},
        url_name="approval",
    ),
)
def approvals_read(request: HttpRequest, approval_id: int):
    token: ApiToken = request.auth
    return approval_out(_viewer(token), tenant_approval(token, approval_id))


@router.post(
    "/{int:approval_id}/decision",
    **operation(
        ApiToken.SCOPE_APPROVALS_DECIDE,
        summary="Approve or reject an approval",
        description=(
            "Decides a pending approval as the inbox's form does, as the token's owner: "
            "`decision` (`approve` or `reject`), the `args_hash` the caller read (the "
            "decision holds for those exact arguments only) and a `note` (required to "
            "reject: the agent is told it). Approving reads the resource from its "
            "provider first.\n\n"
            "- **409** nothing was decided, the body says why with the approval as it "
            "is now and its current `args_hash`: the hash is not the current one; "
            "someone already decided it (the message names who); it expired; it no "
            "longer holds; or the resource changed since it was asked (`changes`, "
            "`resource_now`: ask again in the inbox).\n"
            "- **403** the owner may not decide it: they asked for the action "
            "themselves, the amount is beyond their authority in its currency, the "
            "provider will refuse it (reject instead), or the resource cannot be read "
            "now.\n"
            "- **400** a field is wrong, or a rejection without a note.\n\n"
            "Audited as `approval.approve` / `approval.reject` with the owner as actor "
            "and the token in `after.token`; the run wakes at once."
        ),
        response={
            200: ApprovalOut,
            400: ErrorOut,
            404: ErrorOut,
            409: DecisionConflictOut,
            413: ErrorOut,
        },
        url_name="approval-decision",
    ),
)
def approvals_decide(request: HttpRequest, approval_id: int, body: DecideIn):
    token: ApiToken = request.auth
    approval = tenant_approval(token, approval_id)
    viewer = _viewer(token)
    if body.decision == REJECT and not body.note.strip():
        message = "say why the action is rejected: the agent is told the reason"
        raise ApiError(400, message, errors={"note": [message]})
    try:
        decided = approval_decide(
            approval=approval,
            user=token.owner,
            decision=body.decision,
            seen_args_hash=body.args_hash,
            note=body.note,
            request=request,
            token=token,
        )
    except DecisionRefused as exc:
        raise ApiError(403, f"not decided: {exc}") from exc
    except ResourceChanged as exc:
        raise _conflict(
            viewer,
            exc,
            str(exc),
            changes=exc.now.changes_from(exc.approval),
            resource_now=mask(exc.now.state),
        ) from exc
    except DecisionConflict as exc:
        why = str(exc)
        if body.args_hash != exc.approval.args_hash:
            # The service's words point at the page's card; the answer carries the hash.
            why = (
                "the arguments you saw are not the ones this approval is bound to; "
                "read them again under its current args_hash"
            )
        raise _conflict(viewer, exc, why) from exc
    return approval_out(viewer, tenant_approval(token, decided.pk))


def _conflict(viewer: Viewer, exc: DecisionConflict, why: str, **extra: Any) -> ApiError:
    """The 409 of a decision that did not happen: why, and the approval as it is now."""
    current = Approval.objects.select_related("run").get(pk=exc.approval.pk)
    message = f"not decided: {why}"
    body = DecisionConflictOut.model_validate(
        {
            "error": message,
            "approval": approval_out(viewer, current),
            "args_hash": current.args_hash,
            **extra,
        }
    ).model_dump(mode="json", exclude={"error", "errors"})
    # Only a changed resource has changes to show.
    body = {key: value for key, value in body.items() if value is not None}
    return ApiError(409, message, **body)
