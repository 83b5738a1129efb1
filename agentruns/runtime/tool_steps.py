"""Tool steps: validate the arguments, replay a recorded answer, or perform the call.

A read-only tool changes nothing, so it is simply called, its answer recorded
after the call, and any error retried. A tool with effects goes to
``recovery.perform_effect``: the effect key, the gate, the send and its recovery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agentruns.models import RunStatus, Step, StepKind, StepStatus
from agentruns.runtime import faults as fault_points
from agentruns.runtime import observe
from agentruns.runtime.control import AgentUsageError, Suspend
from agentruns.runtime.effects import content_hash
from agentruns.runtime.outcomes import Verdict, classify
from agentruns.runtime.recovery import perform_effect
from agentruns.runtime.results import json_safe, recorded_result
from agentruns.runtime.tools import NON_RETRYABLE, Tool, ToolResult, validation_message
from agentruns.runtime.writes import NOW, Event, Json, NowPlus

if TYPE_CHECKING:
    from agentruns.runtime.claim import Claim


def tool_step(claim: Claim, name: str, args: dict[str, Any]) -> ToolResult:
    tool = claim.agent.tool(name)
    if tool is None:
        raise AgentUsageError(f"ctx.tool: agent {claim.agent.name!r} declares no tool {name!r}")
    try:
        canonical = tool.args_model.model_validate(args).model_dump(mode="json")
    except ValidationError as exc:
        return ToolResult(
            status="invalid_arguments",
            error=validation_message(exc),
            error_class="invalid_arguments",
        )
    input_hash = content_hash({"tool": name, "args": canonical})
    seq, step_id, recorded = claim.position(StepKind.TOOL, name, input_hash, input=canonical)
    return perform(claim, seq, step_id, StepKind.TOOL, tool, canonical, input_hash, recorded)


def perform(
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
    """A tool step (or an undo) at its position: replayed if settled, else performed."""
    if recorded is not None:
        settled = recorded_result(recorded, step_id)
        if settled is not None:
            return settled
    else:
        forward = kind != StepKind.COMPENSATION
        claim.boundary(forward=forward, effect=not tool.recovery.read_only)
        claim.reach(fault_points.BEFORE_STEP_RECORDED, tool.name)
    if tool.recovery.read_only:
        return _read_only(claim, seq, step_id, kind, tool, canonical, input_hash, recorded)
    return perform_effect(
        claim, seq, step_id, kind, tool, canonical, input_hash, recorded, compensates=compensates
    )


def _read_only(claim: Claim, seq, step_id, kind, tool: Tool, canonical, input_hash, recorded):
    attempt = (recorded.attempts if recorded else 0) + 1
    info = claim.call_info(step_id, None, attempt, tool.timeout)
    error: BaseException | None = None
    value = None
    called_at = claim.engine.monotonic()
    observe.call_started(claim.run.agent_name, kind, tool.name, step_id, None)
    try:
        with claim.heartbeat(tool.timeout):
            value = tool.call(canonical, info)
    except Exception as exc:
        error = exc
    observe.call_returned(error)
    claim.reach(fault_points.AFTER_CALL_RETURNED, tool.name)
    verdict = classify(error)

    def write(values: dict[str, Any], **started: Any):
        return claim.step_write(
            recorded,
            {"recovery": Json(tool.recovery.as_json()), **values},
            seq=seq,
            step_id=step_id,
            kind=kind,
            name=tool.name,
            input=canonical,
            input_hash=input_hash,
            **started,
        )

    if verdict.verdict is Verdict.SUCCEEDED:
        return _read_only_succeeded(
            claim, tool, step_id, recorded, json_safe(value), write, called_at
        )
    # Nothing a read-only tool does can have taken effect: any error is retried
    # unless it is a definite refusal or a class no retry cures.
    policy = tool.retry
    values = {
        "last_error_class": verdict.error_class,
        "last_error": verdict.message,
        "provider_retry_after": verdict.retry_after,
    }
    # A provider that is busy or away did not act: it is asked again until the
    # deadline, however many attempts that takes (an outage outlasts six tries).
    give_up = (
        verdict.verdict is Verdict.REFUSED
        or verdict.error_class in NON_RETRYABLE
        or (attempt >= policy.max_attempts and verdict.verdict is not Verdict.BUSY)
        or claim.past_deadline(recorded)
    )
    if give_up:
        values.update({"status": StepStatus.FAILED, "completed_at": NOW})
        claim.decide(
            claim.progress(step_id, new_step=recorded is None),
            step=write(values),
            event=Event.for_attempt(step_id, values),
        )
        observe.step_settled(claim.run.agent_name, kind, tool.name, step_id, values["status"])
        if recorded is None:
            claim.counters["steps"] += 1
        return ToolResult(
            "failed", error=verdict.message, error_class=verdict.error_class, step_id=step_id
        )
    delay = policy.delay(attempt, retry_after=verdict.retry_after)
    values["status"] = StepStatus.PLANNED
    if recorded is None:
        values["retry_deadline"] = NowPlus(policy.deadline)
    claim.decide(
        claim.waiting(
            RunStatus.WAITING_FOR_RETRY, delay, new_step=recorded is None, step_id=step_id
        ),
        step=write(values),
        event=Event.for_attempt(step_id, values),
    )
    observe.step_settled(claim.run.agent_name, kind, tool.name, step_id, values["status"])
    raise Suspend(RunStatus.WAITING_FOR_RETRY, verdict.message)


def _read_only_succeeded(claim: Claim, tool: Tool, step_id, recorded, value, write, called_at):
    # Recorded after the call: its start is now less the call's length.
    values = {"status": StepStatus.SUCCEEDED, "completed_at": NOW, **claim.result_columns(value)}
    claim.decide(
        claim.progress(step_id, new_step=recorded is None),
        step=write(values, started_at=claim.called_at(called_at)),
        event=Event("step_succeeded", step_id),
    )
    observe.step_settled(claim.run.agent_name, StepKind.TOOL, tool.name, step_id, "succeeded")
    if recorded is None:
        claim.counters["steps"] += 1
    claim.reach(fault_points.AFTER_RESULT_RECORDED, tool.name)
    return ToolResult("succeeded", value, step_id=step_id)
