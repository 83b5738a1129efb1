"""The approval gate's part of an effect (DESIGN §8).

Whether a call needs a person is decided once, when its step is first
recorded, from the configuration pinned to the run: such a step is recorded
``planned`` (effect key and request fixed, not sent). Before its first send the
latest approval bound to it must still hold; the guard that re-checks it in SQL
is part of the clearing commit, so the step becomes ``running`` and the
approval ``consumed`` together or not at all. Any mismatch invalidates the
approval and asks again with what changed. The runtime sees approvals only
through the ``ApprovalGate`` it was built with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from agentruns.models import RunStatus, Step, StepStatus
from agentruns.money import state_changes
from agentruns.runtime.approval import ApprovalRequest, ApprovalState
from agentruns.runtime.control import Suspend
from agentruns.runtime.effects import content_hash
from agentruns.runtime.results import json_safe, known
from agentruns.runtime.sending import ApprovalRefused, send
from agentruns.runtime.tools import Tool, ToolRefused
from agentruns.runtime.writes import NOW, Event, StepInsert, StepUpdate

if TYPE_CHECKING:
    from agentruns.runtime.claim import Claim

WAITING_FOR_DECISION = "waiting for an operator's decision"


def needs_approval(claim: Claim, tool: Tool, args: dict[str, Any]) -> bool:
    # Decided from the run's pinned configuration, so a deploy that changes the
    # threshold never changes what an already-started run needs.
    return tool.approval is not None and bool(
        tool.approval.required(args, claim.snapshot.get("config", {}))
    )


def plan(claim: Claim, tool: Tool, step_id: str, insert: dict[str, Any]) -> Step:
    """Record a new gated effect as ``planned``: effect key and request fixed, not sent."""
    committed = claim.decide(
        claim.progress(step_id),
        step=StepInsert({**insert, "status": StepStatus.PLANNED}),
        event=Event("step_planned", step_id, {"tool": tool.name, "needs": "approval"}),
        unless_cancelled=True,
    )
    claim.counters["steps"] += 1
    return claim.reload_pk(committed.step_pk)


def approval_consumed(claim: Claim, tool: Tool, step: Step) -> bool:
    """Whether this effect's send consumed an approval (a new send needs one again)."""
    return (
        tool.approval is not None
        and claim.engine.approvals.approval_for_effect(step.effect_key) is not None
    )


class ResourceRefused(Exception):
    """The provider definitely refused to show the resource (not found, not this
    tenant's, no account): no decision can be bound to it, and nothing is sent."""

    def __init__(self, reason: str, error_class: str, approval_id: int | None):
        super().__init__(reason)
        self.error_class = error_class
        self.approval_id = approval_id


def gated_send(claim: Claim, tool: Tool, step: Step) -> Step:
    """Send a planned effect once an approval bound to it still holds, or wait for one.

    Only ``planned`` steps come here: a step that is ``running`` or ``unknown``
    is settled first and never gated again (our own refund changes the
    resource fingerprint, so a check then would be wrong).
    """
    try:
        return _gated_send(claim, tool, step)
    except ResourceRefused as refused:
        return _refused_before_send(
            claim, step, refused.approval_id, str(refused), error_class=refused.error_class
        )


def _gated_send(claim: Claim, tool: Tool, step: Step) -> Step:
    gate = claim.engine.approvals
    latest = gate.latest(str(claim.run_id), step.step_id)
    # Decided when the step was recorded: once an approval exists for it, the
    # gate holds whatever a later deploy's policy would say.
    if latest is None and not needs_approval(claim, tool, step.input):
        return send(claim, tool, step.step_id, step=step)
    if latest is None:
        request_approval(claim, tool, step)
    if latest.status == "pending":
        await_approval(claim, step, latest.id, WAITING_FOR_DECISION)
    if latest.status == "expired":
        if latest.rerequested:
            request_approval(
                claim, tool, step, previous=latest, changes=["the earlier request expired"]
            )
        await_approval(
            claim,
            step,
            latest.id,
            "the approval request expired; an operator may request it again or cancel",
        )
    if latest.status == "rejected":
        return _rejected(claim, step, latest)
    reusable = latest.status == "approved" or (
        latest.status == "consumed" and latest.consumed_by_effect_key == step.effect_key
    )
    if not reusable:
        # invalidated (the new request did not get written), or consumed by
        # another send: ask again.
        request_approval(claim, tool, step, previous=latest)
    return _consume_and_send(claim, tool, step, latest)


def _rejected(claim: Claim, step: Step, latest: ApprovalState) -> Step:
    reason = f"rejected by {latest.decided_by}" + (f": {latest.note}" if latest.note else "")
    values = {
        "status": StepStatus.FAILED,
        "completed_at": NOW,
        "last_error_class": "approval_rejected",
        "last_error": reason,
    }
    claim.decide(
        claim.progress(step.step_id, new_step=False),
        step=StepUpdate(step.pk, values, only_if_status=(StepStatus.PLANNED,)),
        event=Event("step_failed", step.step_id, {"reason": "approval_rejected"}),
    )
    return known(step, values)


def _consume_and_send(claim: Claim, tool: Tool, step: Step, latest: ApprovalState) -> Step:
    """Send under the approval, consumed in the clearing commit; if any check fails,
    invalidate it and ask again with the reason."""
    gate = claim.engine.approvals
    state = resource_state(claim, tool, step, approval_id=latest.id)
    refusal = tool.approval.refusal_for(step.input, state)
    if refusal:
        return _refused_before_send(claim, step, latest.id, refusal)
    fingerprint = content_hash(state)
    args_hash = content_hash(step.input)
    guard = gate.consume_guard(
        latest.id,
        vendor=claim.store.vendor,
        tenant_id=claim.run.tenant_id,
        args_hash=args_hash,
        resource_fingerprint=fingerprint,
        effect_key=step.effect_key,
    )
    try:
        return send(claim, tool, step.step_id, step=step, guard=guard, approval_id=latest.id)
    except ApprovalRefused:
        pass
    reason = gate.explain(
        latest.id,
        tenant_id=claim.run.tenant_id,
        args_hash=args_hash,
        resource_fingerprint=fingerprint,
    )
    gate.invalidate(latest.id, reason)
    request_approval(claim, tool, step, previous=latest, changes=[reason], state=state)


def _refused_before_send(
    claim: Claim,
    step: Step,
    approval_id: int | None,
    reason: str,
    *,
    error_class: str = "refused_before_send",
) -> Step:
    """The resource as it is now makes the provider refuse the call: fail the step as a
    definite refusal, nothing sent, and close the approval that can no longer apply."""
    reason = reason.removeprefix("not sent: ")
    values = {
        "status": StepStatus.FAILED,
        "completed_at": NOW,
        "last_error_class": error_class,
        "last_error": f"not sent: {reason}",
    }
    claim.decide(
        claim.progress(step.step_id, new_step=False),
        step=StepUpdate(step.pk, values, only_if_status=(StepStatus.PLANNED,)),
        event=Event("step_failed", step.step_id, {"reason": "refused_before_send"}),
    )
    if approval_id is not None:
        claim.engine.approvals.invalidate(approval_id, f"not sent: {reason}")
    return known(step, values)


def resource_state(
    claim: Claim, tool: Tool, step: Step, *, approval_id: int | None = None
) -> dict[str, Any]:
    """Read the resource the decision depends on, from its provider.

    A definite refusal (no such resource in this tenant's account, no account) ends
    the step before anything is sent; any other failure is waited out and read again.
    """
    info = claim.call_info(step.step_id, step.effect_key, step.attempts, tool.timeout)
    try:
        with claim.heartbeat(tool.timeout):
            return json_safe(tool.approval.resource_state(step.input, info))
    except ToolRefused as refused:
        resource = tool.approval.resource(step.input)
        raise ResourceRefused(
            f"could not read {resource}: {refused}",
            refused.error_class,
            approval_id,
        ) from None
    except Exception as exc:
        # A read changes nothing: wait and read again.
        delay = tool.retry.delay(max(1, claim.run.claim_count))
        reason = f"could not read {tool.approval.resource(step.input)}: {exc}"
        claim.decide(
            claim.waiting(RunStatus.WAITING_FOR_RETRY, delay, new_step=False, step_id=step.step_id),
            event=Event("waiting_for_retry", step.step_id, {"reason": reason, "delay": delay}),
        )
        raise Suspend(RunStatus.WAITING_FOR_RETRY, reason) from None


def request_approval(
    claim: Claim,
    tool: Tool,
    step: Step,
    *,
    previous: ApprovalState | None = None,
    changes: list[str] | None = None,
    state: dict[str, Any] | None = None,
) -> NoReturn:
    """Ask for an approval bound to the step's exact arguments, then wait for it."""
    policy = tool.approval
    args = step.input
    if state is None:
        state = resource_state(claim, tool, step)
    changes = list(changes or [])
    if previous is not None:
        changes.extend(state_changes(previous.resource_state, state))
    money = policy.amount(args) if policy.amount is not None else None
    approval_id = claim.engine.approvals.request(
        ApprovalRequest(
            run_id=str(claim.run_id),
            tenant_id=claim.run.tenant_id,
            step_id=step.step_id,
            tool=tool.name,
            args=args,
            args_hash=content_hash(args),
            requested_by=claim.run.requested_by,
            resource=policy.resource(args),
            resource_state=state,
            resource_fingerprint=content_hash(state),
            preview=policy.preview(args),
            amount=money[0] if money else None,
            currency=money[1] if money else "",
            expires_after=policy.expires_after,
            effect_key=step.effect_key,
            replaces=previous.id if previous is not None else None,
            changes=changes,
            refusal=policy.refusal_for(args, state) or "",
        )
    )
    await_approval(claim, step, approval_id, WAITING_FOR_DECISION)


def await_approval(claim: Claim, step: Step, approval_id: int, reason: str) -> NoReturn:
    """Release the run until a decision; nothing is held but a row."""
    claim.decide(
        claim.waiting(RunStatus.WAITING_FOR_APPROVAL, None, new_step=False, step_id=step.step_id),
        event=Event(
            "waiting_for_approval", step.step_id, {"approval": approval_id, "reason": reason}
        ),
    )
    # A decision recorded while this worker was still suspending found the run
    # not yet waiting and could not resume it; look once more, after our write.
    latest = claim.engine.approvals.latest(str(claim.run_id), step.step_id)
    if latest is not None and (
        latest.status in ("approved", "rejected")
        or (latest.status == "expired" and latest.rerequested)
    ):
        claim.engine.resume_after_approval(claim.run_id, by="engine")
    raise Suspend(RunStatus.WAITING_FOR_APPROVAL, reason)
