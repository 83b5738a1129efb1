"""Sending an effect: clear the send, make it, and record what came back (DESIGN §7).

The clearing commit marks the step ``running`` (in flight, effect key and
request already on record) and extends the lease past the tool's send budget,
so no other worker can claim the run while this send may still be out. The
answer is classified by one table (``outcomes.classify``) and recorded as a
fact: written even if the lease was lost meanwhile.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NoReturn

from agentruns.models import RunStatus, Step, StepStatus
from agentruns.runtime import faults as fault_points
from agentruns.runtime import observe
from agentruns.runtime.control import LeaseLost, Suspend
from agentruns.runtime.outcomes import Verdict, classify
from agentruns.runtime.results import json_safe, known, new_step_view, provider_reference
from agentruns.runtime.tools import Recovery, Tool
from agentruns.runtime.writes import (
    NOW,
    Committed,
    Event,
    Json,
    NowPlus,
    Sql,
    StepInsert,
    StepUpdate,
)

if TYPE_CHECKING:
    from agentruns.runtime.approval import Guard
    from agentruns.runtime.claim import Claim

log = logging.getLogger("holdfast.engine")

# A step that may still receive an answer: a fact never overwrites a settled step.
UNSETTLED_OR_PLANNED = (StepStatus.PLANNED, StepStatus.RUNNING, StepStatus.UNKNOWN)


class ApprovalRefused(Exception):
    """The approval's guard matched no row: some check failed; nothing was written."""


def send_budget(claim: Claim, tool: Tool) -> float:
    """The longest a send of ``tool`` may be in flight (DESIGN §12.1)."""
    return min(
        tool.timeout + claim.settings.send_margin_seconds, claim.settings.max_send_budget_seconds
    )


def send(
    claim: Claim,
    tool: Tool,
    step_id: str,
    *,
    insert: dict | None = None,
    step: Step | None = None,
    new_step: bool = False,
    interrupted: bool = False,
    guard: Guard | None = None,
    approval_id: int | None = None,
) -> Step:
    """Clear one send, make it, and record what came back.

    ``insert`` is a new step's columns; otherwise ``step`` is sent again. With
    ``guard`` (an approval to consume), the clearing commit writes nothing unless
    the guard matches; ``ApprovalRefused`` then says so.
    """
    budget = send_budget(claim, tool)
    committed, write = _clear(
        claim, tool, step_id, budget, insert, step, new_step, interrupted, guard, approval_id
    )
    armed_at = claim.engine.monotonic()
    claim.lease_valid_until = armed_at + budget + claim.settings.lease_seconds
    if insert is None:
        step = claim.reload(step.seq)
    else:
        if new_step:
            claim.counters["steps"] += 1
        # What was just written, without reading it back: only the database's
        # timestamps are missing, and nothing on the way to an answer needs them.
        step = known(new_step_view(committed.step_pk), write.values)
    claim.reach(fault_points.AFTER_STEP_RUNNING, tool.name)
    # Send only while the cleared budget still covers the whole call: a worker
    # that stalled here (paused, swapped) past its budget must not send.
    elapsed = claim.engine.monotonic() - armed_at
    if elapsed + tool.timeout > budget:
        log.warning(
            "run %s: %s not sent; %.1fs passed since it was cleared",
            claim.run_id,
            step_id,
            elapsed,
        )
        raise LeaseLost()
    if approval_id is None and tool.approval is not None:
        # A resend carries the approval its first send consumed, unchanged.
        approval_id = claim.engine.approvals.approval_for_effect(step.effect_key)
    info = claim.call_info(step_id, step.effect_key, step.attempts, tool.timeout, approval_id)
    error: BaseException | None = None
    value = None
    observe.call_started(claim.run.agent_name, step.kind, tool.name, step_id, step.effect_key)
    try:
        value = tool.call(step.request, info)
    except Exception as exc:
        error = exc
    observe.call_returned(error)
    claim.reach(fault_points.AFTER_CALL_RETURNED, tool.name)
    return _answered(claim, tool, step, value, error)


def _clear(
    claim: Claim, tool, step_id, budget, insert, step, new_step, interrupted, guard, approval_id
) -> tuple[Committed, StepInsert | StepUpdate]:
    """The clearing commit: the step ``running`` and in flight, the lease past the budget."""
    arm = {"status": StepStatus.RUNNING, "in_flight": True, "last_sent_at": NOW}
    # The clearing commit extends the lease past the send budget, so no other
    # worker can claim the run while this send may still be in flight.
    run_set: dict[str, Any] = {
        "lease_expires_at": NowPlus(budget + claim.settings.lease_seconds),
        "current_step": step_id,
    }
    if insert is not None:
        write: StepInsert | StepUpdate = StepInsert(
            {
                **insert,
                **arm,
                "first_sent_at": NOW,
                "attempts": 1,
                "recovery_log": Json([{"action": "send", "attempt": 1}]),
            }
        )
        if new_step:
            run_set["steps_used"] = Sql("steps_used + 1")
    else:
        entry = {
            "action": "resend" if step.first_sent_at else "send",
            "attempt": step.attempts + 1,
            "after": "interrupted" if interrupted else step.last_error_class or "planned",
        }
        values = {
            **arm,
            "attempts": Sql("attempts + 1"),
            "recovery_log": Json([*(step.recovery_log or []), entry]),
        }
        if step.first_sent_at is None:
            values["first_sent_at"] = NOW
        if interrupted:
            values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
        # A planned step's first send is its first attempt (it was recorded with none).
        write = StepUpdate(step.pk, values, another_attempt=step.attempts >= 1)
    # A new effect is never sent once a cancel was requested; a resend of an
    # unsettled one is, because its outcome must be settled first.
    # A planned step is never in flight (not sent yet, or proven absent).
    first_send = insert is not None or step.status == StepStatus.PLANNED
    payload: dict[str, Any] = {"tool": tool.name}
    if approval_id is not None:
        payload["approval"] = approval_id
    event = Event("effect_sent", step_id, payload)
    if guard is not None:
        committed = claim.decide_guarded(
            run_set, guards=[guard], step=write, event=event, unless_cancelled=first_send
        )
        if committed.guard_failed:
            raise ApprovalRefused()
    else:
        committed = claim.decide(run_set, step=write, event=event, unless_cancelled=first_send)
    return committed, write


def _answered(claim: Claim, tool: Tool, step: Step, value: Any, error: BaseException | None):
    """Record the provider's answer by the response table, and say what follows."""
    verdict = classify(error)
    entry = {
        "action": "answer",
        "verdict": verdict.verdict.value,
        "error_class": verdict.error_class,
        "message": verdict.message[:500],
    }
    if verdict.verdict is Verdict.SUCCEEDED:
        return record_answer(claim, tool, step, succeeded_values(claim, value), log_entry=entry)
    if verdict.verdict is Verdict.REFUSED:
        values = {
            "status": StepStatus.FAILED,
            "completed_at": NOW,
            "in_flight": False,
            "last_error_class": verdict.error_class,
            "last_error": verdict.message,
        }
        return record_answer(claim, tool, step, values, log_entry=entry)
    if verdict.verdict is Verdict.BUSY:
        _busy(claim, tool, step, verdict, error, entry)
    # Ambiguous: it may have happened. Record that, then recover.
    step = record_answer(
        claim,
        tool,
        step,
        {
            "status": StepStatus.UNKNOWN,
            "in_flight": False,
            "ambiguous_attempts": Sql("ambiguous_attempts + 1"),
            "last_error_class": verdict.error_class,
            "last_error": verdict.message,
        },
        log_entry=entry,
        progress=False,
    )
    recovery = Recovery.from_json(step.recovery or {})
    if (
        recovery.idempotency_window is not None
        and step.ambiguous_attempts <= tool.retry.max_ambiguous_resends
        and not claim.past_deadline(step)
    ):
        wait_for_retry(claim, step, tool.retry.delay(step.attempts), False, reason=verdict.message)
    return step


def _busy(claim: Claim, tool: Tool, step: Step, verdict, error, entry) -> NoReturn:
    """409 in use or 429: the provider did not act on it; send the same request later."""
    delay = tool.retry.delay(step.attempts, retry_after=verdict.retry_after)
    values = {
        "status": StepStatus.RUNNING,
        "in_flight": False,
        "last_error_class": verdict.error_class,
        "last_error": verdict.message,
        "provider_retry_after": verdict.retry_after,
    }
    if error is not None and getattr(error, "may_be_in_flight", False):
        values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
    record_answer(
        claim,
        tool,
        step,
        values,
        log_entry=entry,
        progress=False,
        run_set=claim.waiting(
            RunStatus.WAITING_FOR_RETRY, delay, new_step=False, step_id=step.step_id
        ),
    )
    raise Suspend(RunStatus.WAITING_FOR_RETRY, verdict.message)


def succeeded_values(claim: Claim, value: Any) -> dict[str, Any]:
    """The columns of a step the provider says happened, with what it answered."""
    value = json_safe(value)
    return {
        "status": StepStatus.SUCCEEDED,
        "completed_at": NOW,
        "in_flight": False,
        "provider_reference": provider_reference(value),
        **claim.result_columns(value),
    }


def wait_for_retry(
    claim: Claim, step: Step, delay: float, interrupted: bool, *, reason: str
) -> NoReturn:
    """Leave an ambiguous send ``unknown`` and come back after ``delay`` to settle it."""
    values: dict[str, Any] = {"status": StepStatus.UNKNOWN, "in_flight": False}
    if interrupted:
        values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
    claim.decide(
        claim.waiting(RunStatus.WAITING_FOR_RETRY, delay, new_step=False, step_id=step.step_id),
        step=StepUpdate(step.pk, values),
        event=Event("waiting_for_retry", step.step_id, {"reason": reason, "delay": delay}),
    )
    raise Suspend(RunStatus.WAITING_FOR_RETRY, reason)


def record_answer(
    claim: Claim,
    tool: Tool,
    step: Step,
    values: dict[str, Any],
    *,
    log_entry: dict | None = None,
    ambiguous: bool = False,
    progress: bool = True,
    run_set: dict | None = None,
) -> Step:
    """Record what a provider answered: a fact, written even if the lease is gone."""
    values = dict(values)
    if log_entry is not None:
        values["recovery_log"] = Json([*(step.recovery_log or []), log_entry])
    if ambiguous:
        values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
    event = Event(
        "step_" + str(values.get("status", step.status)), step.step_id, {"tool": tool.name}
    )
    step_write = StepUpdate(step.pk, values, only_if_status=UNSETTLED_OR_PLANNED)
    if run_set is None and (claim.progress_reset or not progress):
        # Nothing to decide and nothing to reset on the run: the answer and its
        # event alone. The next decision is fenced as always.
        claim.store.record_fact(claim.run_id, step_write, event)
        claim.cancel_unseen = True
        return _after_record(claim, tool, step, values)
    if run_set is None:
        run_set = claim.progress(step.step_id, new_step=False)
    committed = claim.record(run_set, step=step_write, event=event)
    if not committed.fenced:
        # The answer is on record; the decision to go on belongs to the new owner.
        raise LeaseLost()
    return _after_record(claim, tool, step, values)


def _after_record(claim: Claim, tool: Tool, step: Step, values: dict[str, Any]) -> Step:
    # The send's long lease is no longer needed: the next commit brings it back to
    # the normal length, so a worker that dies now is replaced in seconds.
    claim.lease_valid_until = 0.0
    observe.step_settled(claim.run.agent_name, step.kind, tool.name, step.step_id, values["status"])
    claim.reach(fault_points.AFTER_RESULT_RECORDED, tool.name)
    if values.get("status") in (StepStatus.SUCCEEDED, StepStatus.FAILED):
        # Settled: status, result and error are all the caller reads.
        return known(step, values)
    # Still unsettled: recovery decisions need the database's own timestamps.
    return claim.reload(step.seq)
