"""What agent code gets back from the model, and the message that feeds a tool's answer back."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentruns.runtime.tools import ToolResult


@dataclass(frozen=True)
class ModelToolCall:
    id: str
    name: str
    raw_arguments: str
    # Canonical arguments when valid, else None.
    arguments: dict[str, Any] | None
    valid: bool
    error: str | None = None


@dataclass(frozen=True)
class ModelResponse:
    content: str | None
    tool_calls: list[ModelToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    step_id: str = ""

    def assistant_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.raw_arguments},
                }
                for call in self.tool_calls
            ]
        return message

    @classmethod
    def from_recorded(cls, result: dict[str, Any], step_id: str) -> ModelResponse:
        return cls(
            content=result.get("content"),
            tool_calls=[ModelToolCall(**call) for call in result.get("tool_calls", [])],
            finish_reason=result.get("finish_reason"),
            step_id=step_id,
        )


def tool_message(call: ModelToolCall, result: ToolResult) -> dict[str, Any]:
    """The chat message that feeds a tool's result (or its rejection) back to the model."""
    return {
        "role": "tool",
        "tool_call_id": call.id,
        "content": json.dumps(result.for_model(), sort_keys=True),
    }
