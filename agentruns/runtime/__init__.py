"""Holdfast's durable runtime: the public surface agent code and the apps use.

Read ``agentruns.runtime.context`` for the rules agent code follows.
"""

from agentruns.runtime.admission import (
    AdmissionError,
    DuplicateActiveRun,
    InvalidRunInput,
    QueuedTask,
    RequestConflict,
    merged_config,
    start_run,
)
from agentruns.runtime.approval import (
    ApprovalGate,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalState,
    Guard,
    NoApprovals,
    always,
)
from agentruns.runtime.context import RunContext, run_tool_loop
from agentruns.runtime.credentials import Credentials, CredentialSource, NoCredentials
from agentruns.runtime.desk import NoDesk, ReconciliationDesk
from agentruns.runtime.effects import canonical_json, content_hash
from agentruns.runtime.engine import CancelRefused, Engine, EngineSettings
from agentruns.runtime.faults import FaultPoints
from agentruns.runtime.model_steps import ModelAnswer
from agentruns.runtime.outcomes import EffectFact, Ending, derive_terminal_state
from agentruns.runtime.registry import Agent, Budget, ModelSpec, Registry, agent
from agentruns.runtime.responses import ModelResponse, ModelToolCall, tool_message
from agentruns.runtime.retry import RetryPolicy
from agentruns.runtime.tools import (
    MANUAL,
    READ_ONLY,
    CallInfo,
    LookupResult,
    ProviderBusy,
    Recovery,
    Tool,
    ToolRefused,
    ToolResult,
    Undo,
    idempotent,
    lookup,
    tool,
    validation_errors,
    validation_message,
)

__all__ = [
    "MANUAL",
    "READ_ONLY",
    "AdmissionError",
    "Agent",
    "ApprovalGate",
    "ApprovalPolicy",
    "ApprovalRequest",
    "ApprovalState",
    "Budget",
    "CallInfo",
    "CancelRefused",
    "CredentialSource",
    "Credentials",
    "DuplicateActiveRun",
    "EffectFact",
    "Ending",
    "Engine",
    "EngineSettings",
    "FaultPoints",
    "Guard",
    "InvalidRunInput",
    "LookupResult",
    "ModelAnswer",
    "ModelResponse",
    "ModelSpec",
    "ModelToolCall",
    "NoApprovals",
    "NoCredentials",
    "NoDesk",
    "ProviderBusy",
    "QueuedTask",
    "ReconciliationDesk",
    "Recovery",
    "Registry",
    "RequestConflict",
    "RetryPolicy",
    "RunContext",
    "Tool",
    "ToolRefused",
    "ToolResult",
    "Undo",
    "agent",
    "always",
    "canonical_json",
    "content_hash",
    "derive_terminal_state",
    "idempotent",
    "lookup",
    "merged_config",
    "run_tool_loop",
    "start_run",
    "tool",
    "tool_message",
    "validation_errors",
    "validation_message",
]
