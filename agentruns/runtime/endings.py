"""How a run ends: finishing, cancelling, compensating, and being blocked (DESIGN §5, §7).

A run's terminal state is derived from its effect steps (``outcomes``), never
chosen: none succeeded, some succeeded, some were undone. A run with an effect
still ``running`` or ``unknown`` never ends; it waits for reconciliation. A run
that fails after effects with an undo first runs those undo steps, newest
first, durably and under their own effect keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import suppress
from typing import TYPE_CHECKING

from agentruns.models import RunStatus, Step, StepKind, StepStatus
from agentruns.runtime.control import Blocked, Finish, LeaseLost, Suspend
from agentruns.runtime.effects import content_hash
from agentruns.runtime.outcomes import EffectFact, Ending, NotSettled, derive_terminal_state
from agentruns.runtime.results import json_safe, load_result
from agentruns.runtime.tool_steps import perform
from agentruns.runtime.tools import Tool
from agentruns.runtime.writes import NOW, Event, Json, StepUpdate

if TYPE_CHECKING:
    from agentruns.runtime.claim import Claim

UNSETTLED = (StepStatus.RUNNING, StepStatus.UNKNOWN)


def finish(claim: Claim, ending: Finish) -> str:
    """End the forward work: compensate first if a failure left effects to undo."""
    try:
        if ending.ending is Ending.FAILED and _needs_compensation(claim):
            claim.decide(
                {"status": RunStatus.COMPENSATING, "outcome_detail": ending.reason},
                event=Event("compensation_started", payload={"reason": ending.reason}),
            )
            compensate(claim, reason=ending.reason)
        return write_end(claim, ending)
    except Finish as inner:
        # Compensation always ends here (it raises Finish when its undos are done).
        try:
            return write_end(claim, inner)
        except LeaseLost:
            return "lease_lost"
    except Suspend as suspend:
        return claim.suspended(suspend)
    except LeaseLost:
        return "lease_lost"


def write_end(claim: Claim, ending: Finish) -> str:
    """Write the run's terminal state, or wait for an operator while an effect is unsettled."""
    if ending.ending is Ending.CANCELLED:
        # Effects planned and never sent (waiting for approval) end with the run.
        for step in Step.objects.filter(
            run_id=claim.run_id, is_effect=True, status=StepStatus.PLANNED
        ):
            close_cancelled(claim, step, "cancelled before it was sent")
    facts = _effect_facts(claim)
    try:
        status = derive_terminal_state(ending.ending, facts)
    except NotSettled as exc:
        # Never end with an effect unsettled (DESIGN §5): wait for an operator.
        claim.decide(
            claim.waiting(
                RunStatus.EFFECT_UNKNOWN, None, new_step=False, step_id=claim.run.current_step
            ),
            event=Event("effect_unknown", payload={"reason": str(exc)}),
        )
        for pk in Step.objects.filter(
            run_id=claim.run_id, is_effect=True, status__in=UNSETTLED
        ).values_list("pk", flat=True):
            claim.engine.desk.open_case(str(claim.run_id), pk, str(exc))
        return f"suspended:{RunStatus.EFFECT_UNKNOWN}"
    code, detail = _outcome(claim, ending, facts)
    # Marked when an effect of it was undone, whether or not every one was.
    undone = {"compensated": True} if any(fact.compensated for fact in facts) else {}
    claim.decide(
        {
            **undone,
            "status": status,
            "outcome_detail": ending.reason or detail,
            "outcome_code": code,
            "output": Json(ending.output) if ending.output is not None else None,
            "lease_owner": "",
            "lease_expires_at": None,
            "next_attempt_at": None,
            "finished_at": NOW,
            "claim_count": 0,
        },
        event=Event("finished", payload={"status": str(status), "reason": ending.reason}),
    )
    if facts:
        # An approval is only ever asked for a recorded effect step (gating.plan writes
        # it first), so a run without effect steps has none to withdraw.
        claim.engine.approvals.withdraw(str(claim.run_id), f"the run ended as {status}")
    claim.engine.ended(claim.run_id)
    return f"finished:{status}"


def _outcome(claim: Claim, ending: Finish, facts: list[EffectFact]) -> tuple[str, str]:
    """What a completed run's end means: what its agent declared, or that an effect of
    it was definitely refused (it completed, but that effect did not happen)."""
    if ending.ending is not Ending.COMPLETED:
        return "", ""
    if claim.declared_outcome is not None:
        return claim.declared_outcome
    if not any(fact.status == StepStatus.FAILED for fact in facts):
        # facts are the run's effect tool steps: none failed, none was refused.
        return "", ""
    refused = (
        Step.objects.filter(run_id=claim.run_id, kind=StepKind.TOOL, status=StepStatus.FAILED)
        .filter(is_effect=True)
        .order_by("-seq")
        .values_list("name", "last_error")
        .first()
    )
    if refused is None:
        return "", ""
    name, error = refused
    return f"{name}_refused"[:64], error


def _effect_facts(claim: Claim) -> list[EffectFact]:
    if not claim.may_have_effects():
        # Most runs only read: their end needs no look at the step table.
        return []
    effects = list(
        Step.objects.filter(run_id=claim.run_id, is_effect=True).values_list(
            "pk", "kind", "status", "compensates_id"
        )
    )
    undone = {
        compensates
        for _, kind, status, compensates in effects
        if kind == StepKind.COMPENSATION and status == StepStatus.SUCCEEDED
    }
    return [
        EffectFact(status, compensated=pk in undone)
        for pk, kind, status, _ in effects
        if kind == StepKind.TOOL
    ]


# --- cancellation ---------------------------------------------------------------------


def finish_cancelled(claim: Claim) -> str:
    """Finish a run the canceller claimed while it was idle."""
    for step in Step.objects.filter(run_id=claim.run_id):
        if step.is_effect and step.status == StepStatus.PLANNED:
            continue  # never sent: closed with the run's end (write_end)
        if step.status not in UNSETTLED:
            continue
        never_executed = (
            step.status == StepStatus.RUNNING
            and not step.in_flight
            and step.ambiguous_attempts == 0
        )
        if never_executed:
            # Its only answers were 429s: the provider never acted. Close it.
            close_cancelled(claim, step, "cancelled before the provider accepted it")
            continue
        # An effect may be in flight or unknown: the worker settles it and then
        # honours the cancel at its next step boundary. Hand the run back, due now.
        claim.decide(
            {
                "status": RunStatus.QUEUED,
                "lease_owner": "",
                "lease_expires_at": None,
                "next_attempt_at": None,
                "enqueued_at": NOW,
            }
        )
        claim.engine.enqueue(claim.run_id)
        return "handed_back"
    by = claim.run.cancel_requested_by or "request"
    return write_end(claim, Finish(Ending.CANCELLED, f"cancelled by {by}"))


def close_cancelled(claim: Claim, step: Step, why: str) -> None:
    """Mark a step the provider never acted on as failed: the run was cancelled."""
    claim.decide(
        {},
        step=StepUpdate(
            step.pk,
            {
                "status": StepStatus.FAILED,
                "completed_at": NOW,
                "last_error_class": "cancelled",
                "last_error": why,
            },
            only_if_status=(step.status,),
        ),
        event=Event("step_failed", step.step_id, {"reason": "cancelled"}),
    )


# --- compensation -----------------------------------------------------------------------


def _needs_compensation(claim: Claim) -> bool:
    return any(True for _ in _pending_undos(claim))


def _pending_undos(claim: Claim) -> Iterator[tuple[Step, Tool, Step | None]]:
    """Succeeded effects with an undo not yet settled, newest first, with the undo step
    already recorded for each (or None)."""
    steps = list(Step.objects.filter(run_id=claim.run_id, is_effect=True).order_by("-seq"))
    compensations = {s.compensates_id: s for s in steps if s.kind == StepKind.COMPENSATION}
    for step in steps:
        if step.kind != StepKind.TOOL or step.status != StepStatus.SUCCEEDED:
            continue
        tool = claim.agent.tool(step.name) if claim.agent else None
        if tool is None or tool.undo is None:
            continue
        done = compensations.get(step.pk)
        if done is not None and done.status in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            continue
        yield step, tool, done


def compensate(claim: Claim, reason: str | None = None) -> None:
    """Run the undo of every succeeded effect that has one, newest first; then fail."""
    reason = reason or claim.run.outcome_detail
    for step, tool, existing in list(_pending_undos(claim)):
        undo_tool = claim.agent.tool(tool.undo.tool)
        undo_args = undo_tool.args_model.model_validate(
            tool.undo.args(step.input, load_result(step))
        ).model_dump(mode="json")
        input_hash = content_hash(
            {"tool": undo_tool.name, "args": undo_args, "compensates": step.step_id}
        )
        if existing is None:
            seq = (
                max(
                    Step.objects.filter(run_id=claim.run_id).values_list("seq", flat=True),
                    default=-1,
                )
                + 1
            )
            step_id = f"{seq:04d}.{StepKind.COMPENSATION}.{undo_tool.name}"
        else:
            seq, step_id = existing.seq, existing.step_id
        perform(
            claim,
            seq,
            step_id,
            StepKind.COMPENSATION,
            undo_tool,
            undo_args,
            input_hash,
            existing,
            compensates=step.pk,
        )
    raise Finish(Ending.FAILED, reason)


# --- blocked ----------------------------------------------------------------------------


def write_blocked(claim: Claim, blocked: Blocked) -> None:
    # A worker that lost its lease leaves the decision to the new owner.
    with suppress(LeaseLost):
        claim.decide(
            {
                "status": RunStatus.BLOCKED,
                "outcome_detail": blocked.reason,
                "lease_owner": "",
                "lease_expires_at": None,
                "next_attempt_at": None,
            },
            event=Event(
                "blocked",
                payload={"reason": blocked.reason, "detail": json_safe(blocked.detail)},
            ),
        )
