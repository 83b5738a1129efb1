"""Deciding approvals, asking again (after an expiry, or on the current state), and
expiring them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from accounts.models import ApiToken
from accounts.privacy import error_reference, shown_error
from accounts.services import audit_record, through, user_actor_name
from agentruns.dbclock import DbNow
from agentruns.models import Run, RunStatus, Step
from agentruns.money import state_changes
from agentruns.runtime import CallInfo
from agentruns.services import credential_source, get_registry, run_resume
from agentruns.sweeper import SweepPass
from approvals.models import Approval, ApprovalStatus
from approvals.policy import approver_problem

log = logging.getLogger("holdfast.approvals")

APPROVE = "approve"
REJECT = "reject"
# How long the inbox waits for a provider when it shows a resource's state now.
RESOURCE_READ_TIMEOUT = 3.0
# How long pages reuse one reading of a resource (a decision always reads afresh).
RESOURCE_READ_CACHE_SECONDS = 10


# Called with each approval decided, inside the decision's own transaction, so what a
# hook writes commits with the decision or not at all. A hook never raises (it would
# undo the decision). The composition root installs webhooks' hook (config/wiring.py).
_decided_hooks: tuple[Callable[[Approval], None], ...] = ()


def install_decided_hooks(*hooks: Callable[[Approval], None]) -> None:
    global _decided_hooks
    _decided_hooks = hooks


class DecisionRefused(Exception):
    """The operator may not make this decision (the requester, no authority, no note)."""


class DecisionConflict(Exception):
    """What the operator saw is no longer what is there: decided, expired, or other arguments."""

    def __init__(self, message: str, approval: Approval):
        super().__init__(message)
        self.approval = approval


class ResourceChanged(DecisionConflict):
    """The resource changed since the approval was asked: approving it would only be
    invalidated at the send. ``now`` is the reading that showed it."""

    def __init__(self, message: str, approval: Approval, now: ResourceNow):
        super().__init__(message, approval)
        self.now = now


def _snapshot(approval: Approval) -> dict[str, Any]:
    return {
        "status": approval.status,
        "args_hash": approval.args_hash,
        "decided_by": approval.decided_by_name,
        "note": approval.note,
    }


def approval_decide(
    *,
    approval: Approval,
    user,
    decision: str,
    seen_args_hash: str,
    note: str = "",
    request=None,
    token: ApiToken | None = None,
) -> Approval:
    """Record one decision on a pending approval and wake its run.

    ``token``: the API token the decision came through, named in the audit entry.

    The decision is a compare-and-set on ``status = pending`` with the hash the
    operator saw and the database's clock for the expiry: two clicks, two tabs
    or two approvers at once yield exactly one decision; the others get a
    ``DecisionConflict`` carrying what happened.

    Approving first reads the resource from its provider (before the transaction:
    slow I/O never runs inside one). If it changed since the approval was asked, or
    cannot be read, nothing is decided: the engine would only invalidate it at the send.
    """
    if decision not in (APPROVE, REJECT):
        raise DecisionRefused("the decision must be approve or reject")
    note = note.strip()
    if decision == REJECT and not note:
        raise DecisionRefused("say why the action is rejected: the agent is told the reason")
    actor = user_actor_name(user)
    if seen_args_hash != approval.args_hash:
        raise DecisionConflict(
            "the arguments you saw are not the ones this approval is bound to; "
            "read the current version below",
            approval,
        )
    if approval.requested_by == actor:
        raise DecisionRefused("you asked for this action; another approver must decide it")
    problem = approver_problem(user, approval.tenant, approval.amount, approval.currency)
    if problem:
        raise DecisionRefused(f"you cannot decide this approval: {problem}")
    refusal = approval.provider_refusal
    if decision == APPROVE and refusal:
        raise DecisionRefused(
            f"the provider will refuse this action ({refusal}); reject it so the agent learns why"
        )
    if decision == APPROVE and approval.status == ApprovalStatus.PENDING:
        # Only a pending one: a used approval changed the resource itself (our own
        # refund); the compare-and-set below says what happened to it instead.
        _check_resource_unchanged(approval)
    status = ApprovalStatus.APPROVED if decision == APPROVE else ApprovalStatus.REJECTED
    with transaction.atomic():
        won = Approval.objects.filter(
            pk=approval.pk,
            status=ApprovalStatus.PENDING,
            args_hash=seen_args_hash,
            expires_at__gt=DbNow(),
        ).update(
            status=status,
            decided_by=user,
            decided_by_name=actor,
            decided_at=DbNow(),
            note=note,
        )
        if won and status == ApprovalStatus.APPROVED:
            # The run list's "approved by" mark, in the decision's own transaction.
            Run.objects.filter(pk=approval.run_id).update(approved_by=actor)
        current = Approval.objects.select_related("run").get(pk=approval.pk)
        if not won:
            raise DecisionConflict(_why_not_pending(current), current)
        audit_record(
            tenant=approval.tenant,
            actor=actor,
            action=f"approval.{decision}",
            object_type="approval",
            object_id=approval.pk,
            before={"status": ApprovalStatus.PENDING.value, "args_hash": approval.args_hash},
            after=through(token, _snapshot(current)),
            request=request,
        )
        for hook in _decided_hooks:
            hook(current)
    run_resume(current.run_id, by=actor)
    return current


def _check_resource_unchanged(approval: Approval) -> None:
    now = approval_resource_now(approval, fresh=True)
    if now.error:
        # Shown to whoever clicked, who may not read the provider's own words.
        error = shown_error(now.error_class, now.error, detail=False)
        raise DecisionRefused(
            f"could not read {approval.resource} now: {error}; "
            "an approval is given only on the state it was asked on, "
            "so try again when it can be read, or reject"
        )
    changes = now.changes_from(approval)
    if changes:
        raise ResourceChanged(
            f"{approval.resource} changed since this was asked: {'; '.join(changes)}; "
            "ask again with the current state",
            approval,
            now,
        )


def _why_not_pending(approval: Approval) -> str:
    """What happened to an approval that is no longer pending, in words for the operator."""
    status = approval.status
    if status == ApprovalStatus.PENDING:
        return "this approval expired before your decision arrived"
    if status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
        return f"{approval.decided_by_name} already {status} it"
    if status == ApprovalStatus.CONSUMED:
        key = approval.consumed_by_effect_key
        return (
            f"it was already used by {approval_used_by(approval)} (effect key {key}); "
            "nothing was changed"
        )
    if status == ApprovalStatus.EXPIRED:
        return "it expired undecided; nothing was changed"
    if status == ApprovalStatus.INVALIDATED:
        reason = approval.invalidated_reason or "no reason recorded"
        return f"it no longer holds ({reason}); nothing was changed"
    return f"this approval is {status}; nothing was changed"


def approval_used_by(approval: Approval) -> str:
    """The send that used a consumed approval, in words: "refund re_…".

    The noun is the last word of the tool's name (issue_refund → refund); the
    reference is the provider's, from the step with the effect key that consumed it.
    """
    noun = approval.tool.rsplit("_", 1)[-1] or approval.tool
    key = approval.consumed_by_effect_key
    reference = (
        Step.objects.filter(effect_key=key, run_id=approval.run_id)
        .values_list("provider_reference", flat=True)
        .first()
        if key
        else None
    )
    if reference:
        return f"{noun} {reference}"
    # Consumed in the commit before the send: the provider has not answered yet.
    return f"its {noun}, not answered yet"


def approval_ask_again(*, approval: Approval, user, request=None) -> Approval:
    """Drop a pending approval so the run asks again on the resource as it is now.

    A compare-and-set on ``pending`` (one who decided meanwhile wins; the caller
    gets a ``DecisionConflict``), audited in the same transaction. The woken run
    finds its latest approval invalidated and requests a new one whose ``changes``
    say what changed since.
    """
    actor = user_actor_name(user)
    reason = f"asked again with the current state by {actor}"
    with transaction.atomic():
        won = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
            status=ApprovalStatus.INVALIDATED, invalidated_reason=reason
        )
        current = Approval.objects.select_related("run").get(pk=approval.pk)
        if not won:
            raise DecisionConflict(_why_not_pending(current), current)
        audit_record(
            tenant=approval.tenant,
            actor=actor,
            action="approval.ask_again",
            object_type="approval",
            object_id=approval.pk,
            before={"status": ApprovalStatus.PENDING.value},
            after={"status": current.status, "invalidated_reason": reason},
            request=request,
        )
    run_resume(current.run_id, by=actor)
    return current


def approval_rerequest(*, approval: Approval, user, request=None) -> Approval:
    """Ask again for an expired approval: the run reads the resource afresh and asks."""
    actor = user_actor_name(user)
    with transaction.atomic():
        won = Approval.objects.filter(
            pk=approval.pk,
            status=ApprovalStatus.EXPIRED,
            rerequested_at__isnull=True,
            # Only while its run still waits on it: a finished run asks nothing.
            run__status=RunStatus.WAITING_FOR_APPROVAL,
        ).update(rerequested_by=actor, rerequested_at=DbNow())
        current = Approval.objects.get(pk=approval.pk)
        if not won:
            raise DecisionConflict(
                "only an expired approval of a run still waiting can be requested again, "
                "and only once",
                current,
            )
        audit_record(
            tenant=approval.tenant,
            actor=actor,
            action="approval.rerequest",
            object_type="approval",
            object_id=approval.pk,
            before={"status": approval.status},
            after={"status": current.status, "rerequested_by": actor},
            request=request,
        )
    run_resume(current.run_id, by=actor)
    return current


def approvals_expire() -> int:
    """Mark pending approvals past their expiry (database clock). Returns how many.

    The run stays visibly waiting with an expired approval until an operator
    requests it again or cancels the run. Each expiry is a RunEvent, so open
    pages learn of it.
    """
    expired = 0
    due = list(
        Approval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=DbNow()).values_list(
            "pk", "run_id", "step_id"
        )[:500]
    )
    for pk, run_id, step_id in due:
        with transaction.atomic():
            if not Approval.objects.filter(
                pk=pk, status=ApprovalStatus.PENDING, expires_at__lte=DbNow()
            ).update(status=ApprovalStatus.EXPIRED):
                continue
            run = Run.objects.filter(pk=run_id).only("state_version").first()
            if run is not None:
                run.events.create(
                    created_at=DbNow(),
                    type="approval_expired",
                    state_version=run.state_version,
                    step_id=step_id,
                    payload={"approval": pk},
                )
        expired += 1
    return expired


@dataclass(frozen=True)
class ResourceNow:
    state: dict[str, Any] | None
    # Why it could not be read: the provider's words, shown under the error rule
    # (accounts.privacy.shown_error) with ``error_class``.
    error: str = ""
    # What the resource allows now, in the tool's words (ApprovalPolicy.summary).
    summary: str = ""
    error_class: str = ""
    # When the provider was asked (a reading may come from the short cache).
    read_at: datetime | None = None

    def changes_from(self, approval: Approval) -> list[str]:
        if self.state is None:
            return []
        return state_changes(approval.resource_state or {}, self.state)


def approval_resource_now(approval: Approval, *, fresh: bool = False) -> ResourceNow:
    """Read the approval's resource from its provider now, for the operator deciding.

    Pages showing it take a reading up to ``RESOURCE_READ_CACHE_SECONDS`` old, shared
    by every approval of the tenant on the same resource: an inbox reloaded by several
    approvers asks the provider once. A decision asks afresh (``fresh``): it is bound
    to the state it reads.
    """
    run = approval.run
    tool = get_registry().tool_of(run, approval.tool)
    if tool is None or tool.approval is None:
        return ResourceNow(
            None,
            "this deployment cannot read the resource of this tool",
            error_class="refused_before_send",
        )
    key = f"approvals:resource-now:{approval.tenant_id}:{approval.tool}:{approval.resource}"
    reading = None if fresh else cache.get(key)
    if reading is not None and reading.read_at < approval.created_at:
        # Read before this approval was asked: older than the state it is bound to,
        # it would show a change backwards (another refund since, on the same payment).
        reading = None
    if reading is None:
        reading = _read_resource(approval, run, tool)
        cache.set(key, reading, RESOURCE_READ_CACHE_SECONDS)
    if reading.state is None:
        return reading
    return replace(reading, summary=tool.approval.summary_of(approval.args, reading.state))


def _read_resource(approval: Approval, run: Run, tool) -> ResourceNow:
    read_at = timezone.now()
    info = CallInfo.for_run(
        run,
        step_id=approval.step_id,
        effect_key=approval.effect_key,
        attempt=0,
        timeout=RESOURCE_READ_TIMEOUT,
        credential_source=credential_source(),
    )
    try:
        state = tool.approval.resource_state(approval.args, info)
        return ResourceNow(state, read_at=read_at)
    except Exception as exc:
        error = str(exc) or type(exc).__name__
        # The detail, findable by the reference a viewer is shown instead of it.
        log.info(
            "approval %s: could not read %s now: %s (reference %s)",
            approval.pk,
            approval.resource,
            error,
            error_reference(error),
        )
        error_class = getattr(exc, "error_class", "") or "unexpected"
        return ResourceNow(None, error, error_class=error_class, read_at=read_at)


def approvals_expire_duty(sweep_pass: SweepPass) -> None:
    """The sweeper's duty: expire pending approvals past their expiry."""
    sweep_pass.report.approvals_expired = approvals_expire()


def approvals_resume_duty(sweep_pass: SweepPass) -> None:
    """The sweeper's duty: resume runs whose approval was decided while the wake-up was lost."""
    for run_id in runs_with_decided_approvals(limit=sweep_pass.limit):
        if run_resume(run_id, by="sweeper", enqueue=lambda rid: sweep_pass.push(str(rid))):
            sweep_pass.report.resumed.append(str(run_id))


def runs_with_decided_approvals(*, limit: int = 500) -> list:
    """Runs still waiting for approval whose step's latest approval needs no more
    waiting: decided, expired and requested again, or invalidated (asked again on the
    current state) — a lost wake-up, repaired by the sweeper."""
    latest = Approval.objects.filter(
        run_id=OuterRef("pk"), step_id=OuterRef("current_step")
    ).order_by("-id")
    return list(
        Run.objects.filter(status=RunStatus.WAITING_FOR_APPROVAL)
        .annotate(
            approval_status=Subquery(latest.values("status")[:1]),
            rerequested=Subquery(latest.values("rerequested_at")[:1]),
        )
        .filter(
            Q(
                approval_status__in=[
                    ApprovalStatus.APPROVED,
                    ApprovalStatus.REJECTED,
                    ApprovalStatus.INVALIDATED,
                ]
            )
            | Q(approval_status=ApprovalStatus.EXPIRED, rerequested__isnull=False)
        )
        .values_list("id", flat=True)[:limit]
    )
