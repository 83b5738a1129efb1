"""Model providers. Each runs with its own retries off: the engine owns retries so
every attempt is recorded."""

from agentruns.llm.base import (
    MalformedModelResponse,
    ModelError,
    ModelProvider,
    ModelRateLimited,
    ModelReply,
    ModelRequest,
    ModelRequestRejected,
    ModelUnavailable,
    RawToolCall,
)

__all__ = [
    "MalformedModelResponse",
    "ModelError",
    "ModelProvider",
    "ModelRateLimited",
    "ModelReply",
    "ModelRequest",
    "ModelRequestRejected",
    "ModelUnavailable",
    "RawToolCall",
]
