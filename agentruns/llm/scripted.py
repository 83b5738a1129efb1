"""A deterministic model for demos and tests: a scenario of replies, chosen by turn.

The reply for a request is the scenario's entry at the number of assistant
messages already in the conversation, so the same conversation always gets the
same reply, in any process, with no state kept between calls.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentruns.llm.base import ModelReply, ModelRequest, RawToolCall


@dataclass(frozen=True)
class ScriptedCall:
    name: str
    # A dict is sent as JSON; a string is sent as-is (for malformed arguments).
    arguments: dict[str, Any] | str


@dataclass(frozen=True)
class ScriptedReply:
    content: str | None = None
    tool_calls: Sequence[ScriptedCall] = field(default_factory=tuple)
    input_tokens: int = 100
    output_tokens: int = 20


Scenario = Sequence[ScriptedReply] | Callable[[ModelRequest], ScriptedReply]


class ScriptedProvider:
    name = "scripted"

    def __init__(self, scenario: Scenario, *, model: str = "scripted-1"):
        self._scenario = scenario
        self._model = model

    def complete(self, request: ModelRequest, *, timeout: float) -> ModelReply:
        if callable(self._scenario):
            reply = self._scenario(request)
        else:
            turn = sum(1 for m in request.messages if m.get("role") == "assistant")
            if turn >= len(self._scenario):
                reply = ScriptedReply(content="(scenario finished)")
            else:
                reply = self._scenario[turn]
        calls = [
            RawToolCall(
                id=f"call_{turn_index(request)}_{i}",
                name=call.name,
                arguments=(
                    call.arguments
                    if isinstance(call.arguments, str)
                    else json.dumps(call.arguments, sort_keys=True)
                ),
            )
            for i, call in enumerate(reply.tool_calls)
        ]
        return ModelReply(
            content=reply.content,
            tool_calls=calls,
            finish_reason="tool_calls" if calls else "stop",
            input_tokens=reply.input_tokens,
            output_tokens=reply.output_tokens,
            model=self._model,
        )


def turn_index(request: ModelRequest) -> int:
    return sum(1 for m in request.messages if m.get("role") == "assistant")
