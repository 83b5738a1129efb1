"""What agent code calls: the run context.

Agent code is orchestration only. Every model call, tool call, clock read,
random draw and wait goes through the context, which records it as a step; on
replay a recorded step returns its recorded result without running again. So:

- never read the clock, draw random numbers, or call a provider directly;
  use ``ctx.now()``, ``ctx.random()``, ``ctx.tool()``, ``ctx.model()`` (an
  integration whose framework brings its own model client calls it through
  ``ctx.model_exchange()``, which records it the same way);
- read configuration from ``ctx.config``, never from settings or the
  environment: it is pinned to the run when it starts;
- never sleep; ``ctx.sleep()`` suspends the run and a sweeper wakes it;
- do not catch BaseException: suspensions travel as exceptions.

Changing what the code asks for at an already-recorded position (another
tool, other arguments) is a divergence: the run is blocked for an operator,
never re-executed under a new effect key.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from agentruns.runtime import model_steps, tool_steps, values
from agentruns.runtime.control import Abandon, AgentUsageError, Stop
from agentruns.runtime.responses import ModelResponse, ModelToolCall, tool_message
from agentruns.runtime.tools import ToolResult

if TYPE_CHECKING:
    from agentruns.runtime.claim import Claim
    from agentruns.runtime.model_steps import ModelAnswer


def _engine_call(method):
    """Keep the engine's own failures out of agent code's reach.

    A database error while recording a step is not the agent's failure: it
    must not be caught by agent code nor end the run as failed. It abandons the
    claim; the lease expires and another worker replays from the last fact.
    """

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (Stop, AgentUsageError):
            raise
        except Exception as exc:
            raise Abandon(exc) from exc

    return wrapper


class RunContext:
    """The only door from agent code to the world."""

    def __init__(self, claim: Claim):
        self._claim = claim

    @property
    def run_id(self) -> str:
        return str(self._claim.run_id)

    @property
    def config(self) -> dict[str, Any]:
        """The agent configuration pinned to this run when it started."""
        return self._claim.snapshot.get("config", {})

    @_engine_call
    def model(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[str] | None = None,
        temperature: float | None = None,
    ) -> ModelResponse:
        """Ask the run's model; tool calls it produces come back validated.

        A tool call with invalid arguments is not an error here: it comes back
        with ``valid=False`` and the reason, to be fed back to the model.
        """
        return model_steps.model_step(self._claim, messages, tools=tools, temperature=temperature)

    @_engine_call
    def model_exchange(self, request: dict[str, Any], call: Callable[[float], ModelAnswer]) -> Any:
        """A model call made by an integration's own client, recorded as a model step.

        ``request`` (JSON) identifies the call; ``call(timeout)`` makes it once and
        returns a ``ModelAnswer``, raising a ``ModelError`` when nothing usable came
        back. Returns the answer's ``result`` as recorded; on replay the recorded
        result, without calling. Retries, budgets and divergence as for ``model``.
        """
        return model_steps.model_exchange(self._claim, request, call)

    @_engine_call
    def tool(self, name: str, args: dict[str, Any]) -> ToolResult:
        """Call a tool. Effects run at most once; what they answered is recorded.

        Invalid arguments, refusals and exhausted retries come back as a failed
        ``ToolResult`` with the reason; nothing that may have taken effect is
        ever raised here.
        """
        return tool_steps.tool_step(self._claim, name, args)

    def call_model_tool(self, call: ModelToolCall) -> ToolResult:
        """Run a tool call the model produced, or return its validation error."""
        if not call.valid or call.arguments is None:
            return ToolResult(
                status="invalid_arguments",
                error=call.error or "invalid arguments",
                error_class="invalid_arguments",
            )
        return self.tool(call.name, call.arguments)

    @_engine_call
    def now(self) -> datetime:
        """The database's time, recorded: replay returns the same instant."""
        return values.clock_step(self._claim)

    @_engine_call
    def random(self) -> float:
        """A random float in [0, 1), recorded: replay returns the same number."""
        return values.random_step(self._claim)

    @_engine_call
    def outcome(self, code: str, detail: str = "") -> None:
        """Say what the run's end means, for the people reading it ("refund_refused").

        Recorded as a step, so replay keeps it; the last one declared counts.
        """
        values.outcome_step(self._claim, code, detail)

    @_engine_call
    def sleep(self, duration: float | timedelta) -> None:
        """Suspend the run for ``duration``; no process waits meanwhile."""
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else float(duration)
        values.wait_step(self._claim, seconds)


def run_tool_loop(
    ctx: RunContext,
    messages: list[dict[str, Any]],
    *,
    tools: list[str] | None = None,
    max_turns: int = 10,
) -> tuple[ModelResponse, list[dict[str, Any]]]:
    """The usual agent loop: ask the model, run the tools it asks for, repeat.

    Returns the model's last response (one without tool calls, or the last turn)
    and the whole conversation.
    """
    conversation = list(messages)
    response = ctx.model(conversation, tools=tools)
    for _ in range(max_turns):
        conversation.append(response.assistant_message())
        if not response.tool_calls:
            return response, conversation
        for call in response.tool_calls:
            conversation.append(tool_message(call, ctx.call_model_tool(call)))
        response = ctx.model(conversation, tools=tools)
    conversation.append(response.assistant_message())
    return response, conversation
