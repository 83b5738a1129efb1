"""Effects and their recovery: a new effect's first record, and settling one that is
planned, interrupted or unknown (DESIGN §7).

The recovery order for a send whose outcome nobody recorded: inside the
provider's idempotency window, resend the stored request under the same key
(the provider answers with what happened); else, with a lookup, wait until the
last send could no longer land, then ask: found is recorded; conclusively
absent allows one more send under the same key (through the approval gate
again when the effect consumed an approval); absent again, or anything the
lookup cannot tell, goes to a person as ``unknown``. With neither, ``unknown``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from agentruns.models import RunStatus, Step, StepKind, StepStatus
from agentruns.runtime.control import Suspend
from agentruns.runtime.effects import make_effect_key
from agentruns.runtime.gating import approval_consumed, gated_send, needs_approval, plan
from agentruns.runtime.results import json_safe, recorded_result
from agentruns.runtime.sending import (
    record_answer,
    send,
    send_budget,
    succeeded_values,
    wait_for_retry,
)
from agentruns.runtime.tools import LookupResult, Recovery, Tool, ToolResult
from agentruns.runtime.writes import NOW, Event, Json, NowPlus, Sql, StepUpdate

if TYPE_CHECKING:
    from agentruns.runtime.claim import Claim


def perform_effect(
    claim: Claim,
    seq: int,
    step_id: str,
    kind: str,
    tool: Tool,
    canonical: dict[str, Any],
    input_hash: str,
    recorded: Step | None,
    *,
    compensates: int | None = None,
) -> ToolResult:
    """Record a new effect (its key and exact request fixed before any send) and send
    it, or settle a recorded one; return once it is settled."""
    if recorded is None:
        insert = {
            "run_id": claim.run_id,
            "seq": seq,
            "step_id": step_id,
            "kind": kind,
            "name": tool.name,
            "input": Json(canonical),
            "input_hash": input_hash,
            "recovery": Json(tool.recovery.as_json()),
            "effect_key": make_effect_key(str(claim.run_id), step_id, canonical),
            "is_effect": True,
            "request": Json(
                json_safe(tool.request_for(canonical, claim.snapshot.get("config", {})))
            ),
            "started_at": NOW,
            "compensates_id": compensates,
            "retry_deadline": NowPlus(tool.retry.deadline),
        }
        if kind != StepKind.COMPENSATION and needs_approval(claim, tool, canonical):
            step = plan(claim, tool, step_id, insert)
        else:
            step = send(claim, tool, step_id, insert=insert, new_step=kind != StepKind.COMPENSATION)
    else:
        step = recorded
    while True:
        settled = recorded_result(step, step_id)
        if settled is not None:
            return settled
        step = settle_step(claim, tool, step)


def settle_step(claim: Claim, tool: Tool, step: Step) -> Step:
    """Take one recovery action on a step that is planned, running or unknown."""
    if step.status == StepStatus.PLANNED:
        return gated_send(claim, tool, step)
    if step.status == StepStatus.RUNNING and not step.in_flight:
        # The last answer was 409/429: the provider did not act on it.
        if not claim.past_deadline(step):
            return send(claim, tool, step.step_id, step=step)
        if step.ambiguous_attempts == 0:
            values = {
                "status": StepStatus.FAILED,
                "completed_at": NOW,
                "last_error": f"gave up after {step.attempts} busy answer(s): {step.last_error}",
            }
            entry = {"action": "gave_up", "reason": "deadline"}
            return record_answer(claim, tool, step, values, log_entry=entry)
    # Running and in flight (interrupted mid-call), or unknown.
    return recover_ambiguous(claim, tool, step)


def recover_ambiguous(claim: Claim, tool: Tool, step: Step) -> Step:
    """A send that may have happened: resend under the key, look it up, or ask a person."""
    recovery = Recovery.from_json(step.recovery or {})
    interrupted = step.status == StepStatus.RUNNING and step.in_flight
    now = claim.store.db_now()
    budget = send_budget(claim, tool)
    within_window = (
        recovery.idempotency_window is not None
        and step.first_sent_at is not None
        and (now - step.first_sent_at).total_seconds() + budget
        < recovery.idempotency_window.total_seconds()
    )
    ambiguous = step.ambiguous_attempts + (1 if interrupted else 0)
    if within_window and ambiguous <= tool.retry.max_ambiguous_resends:
        # The provider honours the key: the resend returns what happened.
        return send(claim, tool, step.step_id, step=step, interrupted=interrupted)
    if not recovery.lookup:
        unknown(
            claim, step, interrupted=interrupted, reason="no idempotency window left and no lookup"
        )
    # Asking is always safe; only a second send after absence is not (see lookup).
    if step.last_sent_at is not None:
        # A send could still land until its budget has passed: only then can
        # "not found" mean "did not happen" (DESIGN §12.1).
        landed_by = (now - step.last_sent_at).total_seconds()
        if landed_by < budget:
            wait_for_retry(
                claim,
                step,
                budget - landed_by,
                interrupted,
                reason="waiting for the last send to land",
            )
    return lookup(claim, tool, step, interrupted=interrupted)


def lookup(claim: Claim, tool: Tool, step: Step, *, interrupted: bool) -> Step:
    """Ask the provider what happened under the step's effect key, and act on the answer."""
    info = claim.call_info(step.step_id, step.effect_key, step.attempts, tool.timeout)
    failure = ""
    try:
        with claim.heartbeat(tool.timeout):
            found: LookupResult = tool.find(step.request, info)
    except Exception as exc:
        # The provider client's own words (hosts, ports) go in "error", which pages
        # show only to those who may read them; the detail and the case's reason
        # are Holdfast's words, read by everyone.
        found = LookupResult(
            "inconclusive", detail="the lookup failed: the provider could not be asked"
        )
        failure = f"{type(exc).__name__}: {exc}"
    entry = {
        "action": "lookup",
        "outcome": found.outcome,
        "conclusive": found.conclusive,
        "detail": found.detail,
    }
    if failure:
        entry["error"] = failure
    if found.outcome == "found":
        values = succeeded_values(claim, found.result or {})
        return record_answer(claim, tool, step, values, log_entry=entry, ambiguous=interrupted)
    absent = found.outcome == "absent" and found.conclusive
    if absent and step.resent_after_absence:
        # Sent once more after an earlier absence, and absent again: a person
        # looks before anything is sent a third time.
        unknown(
            claim,
            step,
            interrupted=interrupted,
            reason="absent again after the one resend that absence allows",
            log_entry=entry,
        )
    if absent and approval_consumed(claim, tool, step):
        return _plan_again(claim, step, entry, interrupted)
    if absent:
        step = record_answer(
            claim,
            tool,
            step,
            {"status": StepStatus.UNKNOWN, "in_flight": False, "resent_after_absence": True},
            log_entry=entry,
            ambiguous=interrupted,
            progress=False,
        )
        return send(claim, tool, step.step_id, step=step)
    unknown(
        claim,
        step,
        interrupted=interrupted,
        reason=found.detail or "the lookup could not tell",
        log_entry=entry,
    )


def _plan_again(claim: Claim, step: Step, entry: dict, interrupted: bool) -> Step:
    """Proven absent after an approved send: a new send needs a valid approval again
    (DESIGN §8). Planned, the step goes through the gate before it is sent.

    A decision, not a fact: a worker whose lease lapsed while it looked must not
    turn another worker's send in flight back into "planned".
    """
    values = {
        "status": StepStatus.PLANNED,
        "in_flight": False,
        "resent_after_absence": True,
        "recovery_log": Json([*(step.recovery_log or []), entry]),
    }
    if interrupted:
        values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
    claim.decide(
        claim.progress(step.step_id, new_step=False),
        step=StepUpdate(step.pk, values, only_if_status=(step.status,)),
        event=Event("step_planned", step.step_id, {"reason": "proven absent"}),
    )
    return claim.reload(step.seq)


def unknown(
    claim: Claim, step: Step, *, interrupted: bool, reason: str, log_entry: dict | None = None
) -> NoReturn:
    """Nobody can tell whether the effect happened: stop and open a case for a person."""
    values: dict[str, Any] = {
        "status": StepStatus.UNKNOWN,
        "in_flight": False,
        "recovery_log": Json(
            [
                *(step.recovery_log or []),
                *([log_entry] if log_entry else []),
                {"action": "needs_operator", "reason": reason},
            ]
        ),
    }
    if interrupted:
        values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
    claim.decide(
        claim.waiting(RunStatus.EFFECT_UNKNOWN, None, new_step=False, step_id=step.step_id),
        step=StepUpdate(step.pk, values),
        event=Event(
            "effect_unknown", step.step_id, {"reason": reason, "effect_key": step.effect_key}
        ),
    )
    claim.engine.desk.open_case(str(claim.run_id), step.pk, reason)
    raise Suspend(RunStatus.EFFECT_UNKNOWN, reason)
