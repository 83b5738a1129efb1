"""Model steps: ask the run's model once, validate what it asked for, record it.

A model call is recorded after it returns, with its evidence (provider, model,
prompt and tool-schema versions, tokens, cost, validation). The accepted output
is reused on replay; the model is never asked twice for a recorded step.
Failures are retried by the engine (``MODEL_RETRY``), each attempt recorded;
model clients run with their own retries off.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from pydantic import ValidationError

from agentruns.llm.base import ModelError, ModelReply, ModelRequest, ModelUnavailable
from agentruns.llm.providers import ModelConfigurationError
from agentruns.models import RunStatus, Step, StepKind, StepStatus
from agentruns.runtime import faults as fault_points
from agentruns.runtime import observe
from agentruns.runtime.control import AgentUsageError, Finish, Suspend
from agentruns.runtime.effects import content_hash
from agentruns.runtime.outcomes import Ending
from agentruns.runtime.responses import ModelResponse, ModelToolCall
from agentruns.runtime.results import json_safe, load_result
from agentruns.runtime.retry import RetryPolicy
from agentruns.runtime.tools import NON_RETRYABLE, validation_message
from agentruns.runtime.writes import NOW, Event, Increment, Json, NowPlus, Sql

if TYPE_CHECKING:
    from agentruns.runtime.claim import Claim

MODEL_RETRY = RetryPolicy(max_attempts=5, initial_delay=1.0, max_delay=30.0, deadline=300.0)

T = TypeVar("T")


def model_step(claim: Claim, messages, *, tools=None, temperature=None) -> ModelResponse:
    spec = claim.snapshot.get("model", {})
    all_tools = claim.snapshot.get("tools", {})
    # Sorted: the snapshot's key order is not kept by every database (jsonb).
    tool_names = sorted(all_tools) if tools is None else list(tools)
    unknown = [n for n in tool_names if n not in all_tools]
    if unknown:
        raise AgentUsageError(f"ctx.model: tools not declared by the agent: {unknown}")
    step_input = {
        "provider": spec.get("provider"),
        "model": spec.get("model"),
        "prompt_version": spec.get("prompt_version"),
        "tool_schema_version": claim.snapshot.get("tool_schema_version"),
        "messages": messages,
        "tools": tool_names,
        "temperature": temperature,
    }
    input_hash = content_hash(step_input)
    seq, step_id, recorded = claim.position(StepKind.MODEL, "chat", input_hash, input=step_input)
    if recorded is not None and recorded.status == StepStatus.SUCCEEDED:
        # The accepted output is reused; the model is never asked twice.
        return ModelResponse.from_recorded(load_result(recorded), step_id)
    if recorded is not None and recorded.status == StepStatus.FAILED:
        raise Finish(Ending.FAILED, f"model call failed: {recorded.last_error}")
    claim.boundary(forward=recorded is None, model=recorded is None)
    if recorded is None:
        claim.reach(fault_points.BEFORE_STEP_RECORDED, "chat")
    try:
        provider = claim.engine.providers(spec, claim.agent)
    except ModelConfigurationError as exc:
        raise Finish(Ending.FAILED, f"model configuration: {exc}") from exc
    request = ModelRequest(
        model=spec.get("model", ""),
        messages=messages,
        tools=[all_tools[n]["schema"] for n in tool_names],
        temperature=temperature,
    )
    attempt = _Attempt(claim, seq, step_id, step_input, input_hash, recorded)
    reply, evidence = _asked_once(
        attempt, spec, lambda timeout: provider.complete(request, timeout=timeout)
    )
    return _succeeded(attempt, reply, tool_names, evidence, spec)


def _asked_once(
    attempt: _Attempt, spec: dict[str, Any], ask: Callable[[float], T]
) -> tuple[T, dict[str, Any]]:
    """The model asked once, within the pinned timeout, the lease renewed while it
    answers. A failure is recorded here and stops or retries the run; otherwise returns
    the answer and the step's evidence."""
    claim = attempt.claim
    timeout = float(spec.get("timeout", 20.0))
    error: ModelError | None = None
    answer: T | None = None
    attempt.called_at = claim.engine.monotonic()
    observe.call_started(claim.run.agent_name, StepKind.MODEL, "chat", attempt.step_id, None)
    try:
        with claim.heartbeat(timeout):
            answer = ask(timeout)
    except ModelError as exc:
        error = exc
    except Exception as exc:  # an adapter bug: nothing usable came back
        error = ModelUnavailable(f"{type(exc).__name__}: {exc}")
    observe.call_returned(error)
    claim.reach(fault_points.AFTER_CALL_RETURNED, "chat")
    evidence = {
        "model_provider": spec.get("provider", ""),
        "model_id": spec.get("model", ""),
        "prompt_version": str(spec.get("prompt_version", "")),
        "tool_schema_version": claim.snapshot.get("tool_schema_version", ""),
    }
    if error is not None:
        _failed(attempt, error, evidence)
    assert answer is not None
    return answer, evidence


@dataclass(frozen=True)
class ModelAnswer:
    """What a model call made through ``ctx.model_exchange`` answered, as its step records it.

    ``result`` is JSON and is exactly what replay returns. ``cost_micros`` is the
    cost the provider's own pricing gives (USD millionths), or None to price the
    tokens with the agent's pinned ``ModelSpec.pricing``. ``validation`` lists
    what was checked of the answer, one ``{"name", "valid", "error"}`` each, as
    the run page shows them.
    """

    result: Any
    model: str
    input_tokens: int
    output_tokens: int
    cost_micros: int | None = None
    validation: list[dict[str, Any]] = field(default_factory=list)


def model_exchange(
    claim: Claim, request: dict[str, Any], call: Callable[[float], ModelAnswer]
) -> Any:
    """A model step whose call an integration makes itself (a Pydantic AI model, say).

    ``request`` is what identifies the call (the conversation, the tools offered,
    the settings), as JSON: its hash is the step's identity, so a changed
    conversation at a recorded position is a divergence. ``call(timeout)`` asks
    the model once and raises a ``ModelError`` when nothing usable came back. The
    step is recorded, retried and budgeted exactly as ``model_step``'s; a
    recorded answer is returned without calling again.
    """
    spec = claim.snapshot.get("model", {})
    step_input = {
        "provider": spec.get("provider"),
        "model": spec.get("model"),
        "prompt_version": spec.get("prompt_version"),
        "tool_schema_version": claim.snapshot.get("tool_schema_version"),
        "request": request,
    }
    input_hash = content_hash(step_input)
    seq, step_id, recorded = claim.position(StepKind.MODEL, "chat", input_hash, input=step_input)
    if recorded is not None and recorded.status == StepStatus.SUCCEEDED:
        return load_result(recorded)
    if recorded is not None and recorded.status == StepStatus.FAILED:
        raise Finish(Ending.FAILED, f"model call failed: {recorded.last_error}")
    claim.boundary(forward=recorded is None, model=recorded is None)
    if recorded is None:
        claim.reach(fault_points.BEFORE_STEP_RECORDED, "chat")
    attempt = _Attempt(claim, seq, step_id, step_input, input_hash, recorded)
    answer, evidence = _asked_once(attempt, spec, call)
    result = json_safe(answer.result)
    if answer.cost_micros is None:
        cost = _priced(spec, answer.input_tokens, answer.output_tokens)
    else:
        cost = answer.cost_micros
    _record_success(
        attempt,
        result,
        {
            **evidence,
            "model_id": answer.model or evidence["model_id"],
            "input_tokens": answer.input_tokens,
            "output_tokens": answer.output_tokens,
            "cost_micros": cost,
            "validation": Json(answer.validation),
        },
        tokens=answer.input_tokens + answer.output_tokens,
        cost=cost,
    )
    return result


def _priced(spec: dict[str, Any], input_tokens: int, output_tokens: int) -> int:
    """The cost in USD millionths at the pinned price per million tokens."""
    pricing = spec.get("pricing_per_million", ["0", "0"])
    return int(
        Decimal(input_tokens) * Decimal(pricing[0]) + Decimal(output_tokens) * Decimal(pricing[1])
    )


class _Attempt:
    """One call of one model step, as its write needs it."""

    def __init__(self, claim, seq, step_id, step_input, input_hash, recorded):
        self.claim = claim
        self.seq = seq
        self.step_id = step_id
        self.step_input = step_input
        self.input_hash = input_hash
        self.recorded: Step | None = recorded
        # When the call was made (engine monotonic time), set as it is made.
        self.called_at = 0.0

    def write(self, values: dict[str, Any], *, started_at: Any = NOW):
        return self.claim.step_write(
            self.recorded,
            values,
            seq=self.seq,
            step_id=self.step_id,
            kind=StepKind.MODEL,
            name="chat",
            input=self.step_input,
            input_hash=self.input_hash,
            started_at=started_at,
        )


def _succeeded(
    attempt: _Attempt, reply: ModelReply, tool_names: list[str], evidence: dict, spec: dict
) -> ModelResponse:
    claim, step_id = attempt.claim, attempt.step_id
    response, validation = validate_reply(claim, reply, tool_names, step_id)
    cost = _priced(spec, reply.input_tokens, reply.output_tokens)
    result = {
        "content": response.content,
        "finish_reason": response.finish_reason,
        "tool_calls": [call.__dict__ for call in response.tool_calls],
        "model": reply.model,
    }
    evidence = {
        **evidence,
        "model_id": reply.model or evidence["model_id"],
        "input_tokens": reply.input_tokens,
        "output_tokens": reply.output_tokens,
        "cost_micros": cost,
        "validation": Json(validation),
    }
    tokens = reply.input_tokens + reply.output_tokens
    _record_success(attempt, result, evidence, tokens=tokens, cost=cost)
    return response


def _record_success(attempt: _Attempt, result: Any, evidence: dict, *, tokens: int, cost: int):
    """Record a model step's answer with its evidence, and count it against the budgets."""
    claim, step_id, recorded = attempt.claim, attempt.step_id, attempt.recorded
    run_set = claim.progress(
        step_id,
        new_step=recorded is None,
        model_calls_used=Sql("model_calls_used + 1"),
        tokens_used=Increment(tokens),
        cost_micros=Increment(cost),
    )
    values = {
        "status": StepStatus.SUCCEEDED,
        "completed_at": NOW,
        **claim.result_columns(result),
        **evidence,
    }
    # Recorded after the call: its start is now less the call's length.
    step = attempt.write(values, started_at=claim.called_at(attempt.called_at))
    claim.decide(run_set, step=step, event=Event("step_succeeded", step_id))
    observe.step_settled(claim.run.agent_name, StepKind.MODEL, "chat", step_id, "succeeded")
    claim.counters["model_calls"] += 1
    claim.counters["tokens"] += tokens
    claim.counters["cost_micros"] += cost
    if recorded is None:
        claim.counters["steps"] += 1
    claim.reach(fault_points.AFTER_RESULT_RECORDED, "chat")


def validate_reply(claim: Claim, reply: ModelReply, tool_names: list[str], step_id: str):
    """The reply's tool calls checked against the tools offered and their argument models.

    An invalid call is not an error: it comes back ``valid=False`` with the
    reason, for the agent to feed back to the model.
    """
    calls = []
    validation = []
    for raw in reply.tool_calls:
        arguments = None
        error = None
        tool = claim.agent.tool(raw.name) if raw.name in tool_names else None
        if tool is None:
            error = f"unknown tool {raw.name!r}; available: {', '.join(tool_names) or 'none'}"
        else:
            try:
                parsed = json.loads(raw.arguments or "{}")
                if not isinstance(parsed, dict):
                    raise ValueError("arguments must be a JSON object")
                arguments = tool.args_model.model_validate(parsed).model_dump(mode="json")
            except json.JSONDecodeError as exc:
                error = f"arguments are not valid JSON: {exc.msg} at position {exc.pos}"
            except ValidationError as exc:
                error = validation_message(exc)
            except ValueError as exc:
                error = f"invalid arguments: {exc}"
        calls.append(
            ModelToolCall(
                id=raw.id,
                name=raw.name,
                raw_arguments=raw.arguments,
                arguments=arguments,
                valid=error is None,
                error=error,
            )
        )
        validation.append({"id": raw.id, "name": raw.name, "valid": error is None, "error": error})
    response = ModelResponse(reply.content, calls, reply.finish_reason, step_id)
    return response, validation


def _failed(attempt: _Attempt, error: ModelError, evidence: dict) -> NoReturn:
    """Record a failed call; retry it later, or fail the run when no retry can help."""
    claim, step_id, recorded = attempt.claim, attempt.step_id, attempt.recorded
    attempts = (recorded.attempts if recorded else 0) + 1
    retry_after = getattr(error, "retry_after", None)
    message = f"{type(error).__name__}: {error}"
    values = {
        "last_error_class": error.error_class,
        "last_error": message,
        "provider_retry_after": retry_after,
        **evidence,
    }
    give_up = not error.retryable or error.error_class in NON_RETRYABLE
    if not give_up:
        give_up = attempts >= MODEL_RETRY.max_attempts or claim.past_deadline(recorded)
    if give_up:
        values.update({"status": StepStatus.FAILED, "completed_at": NOW})
        claim.decide(
            claim.progress(step_id, new_step=recorded is None),
            step=attempt.write(values),
            event=Event.for_attempt(step_id, values),
        )
        observe.step_settled(claim.run.agent_name, StepKind.MODEL, "chat", step_id, "failed")
        raise Finish(Ending.FAILED, f"model call failed after {attempts} attempt(s): {message}")
    delay = MODEL_RETRY.delay(attempts, retry_after=retry_after)
    values.update({"status": StepStatus.PLANNED})
    if recorded is None:
        values["retry_deadline"] = NowPlus(MODEL_RETRY.deadline)
    claim.decide(
        claim.waiting(
            RunStatus.WAITING_FOR_RETRY, delay, new_step=recorded is None, step_id=step_id
        ),
        step=attempt.write(values),
        event=Event.for_attempt(step_id, values),
    )
    observe.step_settled(claim.run.agent_name, StepKind.MODEL, "chat", step_id, "planned")
    raise Suspend(RunStatus.WAITING_FOR_RETRY, message)
