"""The contract between the engine and a model provider."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ModelRequest:
    model: str
    # Chat messages in the OpenAI chat-completions shape.
    messages: list[dict[str, Any]]
    # Function-tool schemas in the OpenAI shape: {"type": "function", "function": {...}}.
    tools: list[dict[str, Any]] = field(default_factory=list)
    temperature: float | None = None


@dataclass(frozen=True)
class RawToolCall:
    id: str
    name: str
    # The arguments exactly as the model produced them: JSON text that may be invalid.
    arguments: str


@dataclass(frozen=True)
class ModelReply:
    content: str | None
    tool_calls: list[RawToolCall]
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    # The model id the provider reports having used.
    model: str


class ModelError(Exception):
    error_class = "model_error"
    retryable = True


class ModelRateLimited(ModelError):
    """429: try again after ``retry_after`` seconds (when the provider said)."""

    error_class = "rate_limited"

    def __init__(self, message: str, *, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class ModelUnavailable(ModelError):
    """5xx, a timeout or a dropped connection: nothing usable came back."""

    error_class = "unavailable"


class MalformedModelResponse(ModelError):
    """The provider answered, but not in the chat-completions shape."""

    error_class = "malformed_response"


class ModelRequestRejected(ModelError):
    """400/401/403/404: the request itself is wrong; asking again will not help."""

    retryable = False

    def __init__(self, message: str, *, error_class: str = "invalid_request"):
        super().__init__(message)
        self.error_class = error_class


class ModelProvider(Protocol):
    name: str

    def complete(self, request: ModelRequest, *, timeout: float) -> ModelReply: ...
