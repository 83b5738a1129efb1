"""How a tool declares itself: its arguments, its effect on the world, and how to recover it.

A tool's ``call`` performs one attempt and reports what the provider said by
returning a result or raising one of the errors below. The engine, not the
tool, decides what that means for the step (see ``outcomes.classify``):

- returning a JSON-able dict: the provider said yes;
- ``ToolRefused``: a definite no; nothing happened;
- ``ProviderBusy``: a 409 in use or a 429; send the same request again later;
- anything else (a 5xx, a timeout, a dropped connection, any other exception):
  it may have taken effect.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from agentruns.runtime.approval import ApprovalPolicy
from agentruns.runtime.credentials import Credentials, CredentialSource, NoCredentials
from agentruns.runtime.effects import content_hash
from agentruns.runtime.retry import RetryPolicy

# Error classes that no retry will cure: the step fails at once with the reason.
NON_RETRYABLE = frozenset({"authentication", "invalid_arguments", "policy_rejection"})


class ToolRefused(Exception):
    """The provider definitely did not act (a 4xx such as an invalid amount or bad credentials)."""

    def __init__(self, message: str, *, error_class: str = "refused", status: int | None = None):
        super().__init__(message)
        self.error_class = error_class
        self.status = status


class ProviderBusy(Exception):
    """The provider did not act yet: 409 (the same key is still being processed) or 429."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        error_class: str = "rate_limited",
        may_be_in_flight: bool = False,
    ):
        super().__init__(message)
        self.retry_after = retry_after
        self.error_class = error_class
        # A 409 "in use" means an earlier send under this key is still executing.
        self.may_be_in_flight = may_be_in_flight


@dataclass(frozen=True)
class Recovery:
    """What the provider offers to settle an interrupted call (DESIGN §7)."""

    read_only: bool = False
    idempotency_window: timedelta | None = None
    lookup: bool = False

    @property
    def is_effect(self) -> bool:
        return not self.read_only

    def describe(self) -> str:
        if self.read_only:
            return "read_only"
        parts = []
        if self.idempotency_window is not None:
            parts.append(f"idempotent({int(self.idempotency_window.total_seconds())}s)")
        if self.lookup:
            parts.append("lookup")
        return "+".join(parts) or "manual"

    def as_json(self) -> dict[str, Any]:
        return {
            "read_only": self.read_only,
            "idempotency_window_seconds": (
                None if self.idempotency_window is None else self.idempotency_window.total_seconds()
            ),
            "lookup": self.lookup,
            "describe": self.describe(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Recovery:
        window = data.get("idempotency_window_seconds")
        return cls(
            read_only=bool(data.get("read_only")),
            idempotency_window=None if window is None else timedelta(seconds=window),
            lookup=bool(data.get("lookup")),
        )


READ_ONLY = Recovery(read_only=True)
MANUAL = Recovery()


def idempotent(window: timedelta, *, lookup: bool = False) -> Recovery:
    return Recovery(idempotency_window=window, lookup=lookup)


def lookup() -> Recovery:
    return Recovery(lookup=True)


@dataclass(frozen=True)
class CallInfo:
    """What a tool attempt knows besides its request."""

    run_id: str
    step_id: str
    effect_key: str | None
    attempt: int
    timeout: float
    config: dict[str, Any]
    # The approval that authorised this effect, when it needed one: the tool
    # writes it into the provider's record so a lookup can show it.
    approval_id: int | None = None
    # The run's tenant, whose provider accounts the call acts with.
    tenant_id: int | None = None
    credential_source: CredentialSource = field(default_factory=NoCredentials, repr=False)

    @classmethod
    def for_run(
        cls,
        run: Any,
        *,
        step_id: str,
        effect_key: str | None,
        attempt: int,
        timeout: float,
        credential_source: CredentialSource,
        approval_id: int | None = None,
    ) -> CallInfo:
        """A call on behalf of ``run`` (a Run), with the configuration pinned to it
        and its tenant's provider accounts."""
        return cls(
            run_id=str(run.id),
            step_id=step_id,
            effect_key=effect_key,
            attempt=attempt,
            timeout=timeout,
            config=(run.agent_snapshot or {}).get("config", {}),
            approval_id=approval_id,
            tenant_id=run.tenant_id,
            credential_source=credential_source,
        )

    def credentials(self, provider: str) -> Credentials:
        """The run's tenant's account at ``provider``, resolved now.

        Never another tenant's, and never the deployment's for a tenant that has
        none of its own: without one the call is refused before anything is sent.
        """
        try:
            if self.tenant_id is None:
                raise LookupError(f"a call made for no tenant cannot act on {provider}")
            return self.credential_source.credentials(self.tenant_id, provider)
        except LookupError as missing:
            raise ToolRefused(str(missing), error_class="no_provider_account") from None


def validation_errors(exc: ValidationError, *, root: str = "(root)") -> list[dict[str, str]]:
    """Each problem pydantic found: the field it concerns (dotted; ``root`` for the
    whole value) and the message."""
    return [
        {"field": ".".join(str(p) for p in e["loc"]) or root, "message": e["msg"]}
        for e in exc.errors()
    ]


def validation_message(exc: ValidationError, *, what: str = "arguments") -> str:
    """Why a value was refused, in one line a model (or a person) can act on."""
    problems = validation_errors(exc)
    return f"invalid {what}: " + "; ".join(f"{e['field']}: {e['message']}" for e in problems)


@dataclass(frozen=True)
class LookupResult:
    """What the provider says happened under an effect key."""

    outcome: Literal["found", "absent", "inconclusive"]
    result: dict[str, Any] | None = None
    # "absent" counts only when the provider's listing is complete (every record
    # of the resource was read), never from a search that may have missed it.
    conclusive: bool = False
    detail: str = ""


@dataclass(frozen=True)
class Undo:
    """A tool's compensation: which tool undoes it and with which arguments."""

    tool: str
    args: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


# Tool schemas by (name, description, argument model): see Tool._schema_text.
_SCHEMAS: dict[tuple[str, str, type[BaseModel]], tuple[str, str]] = {}


@dataclass
class Tool:
    name: str
    description: str
    args_model: type[BaseModel]
    recovery: Recovery
    call: Callable[[dict[str, Any], CallInfo], dict[str, Any]]
    # Builds the exact outbound request from the canonical arguments; stored with
    # the step and sent unchanged on every resend.
    build_request: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    find: Callable[[dict[str, Any], CallInfo], LookupResult] | None = None
    undo: Undo | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float = 10.0
    approval: ApprovalPolicy | None = None
    # Who performs the effect, in words an operator searches for ("payments").
    provider: str = ""
    # Its arguments or results carry personal data (a customer's address, an order's
    # buyer): a tenant may have them redacted sooner than the rest of a run is kept.
    personal_data: bool = False

    def __post_init__(self) -> None:
        if self.recovery.lookup and self.find is None:
            raise ValueError(f"tool {self.name!r} declares lookup but has no lookup function")
        if self.approval is not None and self.recovery.read_only:
            raise ValueError(f"tool {self.name!r} is read-only: there is nothing to approve")

    def json_schema(self) -> dict[str, Any]:
        return json.loads(self._schema_text()[0])

    def _schema_text(self) -> tuple[str, str]:
        """The schema as JSON text, and its hash: built once per name, description and
        argument model (Pydantic builds it afresh on every call, about a millisecond,
        and every run's admission pins it)."""
        key = (self.name, self.description, self.args_model)
        known = _SCHEMAS.get(key)
        if known is None:
            schema = {
                "type": "function",
                "function": {
                    "name": self.name,
                    "description": self.description,
                    "parameters": self.args_model.model_json_schema(),
                },
            }
            known = _SCHEMAS[key] = (json.dumps(schema), content_hash(schema))
        return known

    def request_for(self, canonical_args: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        if self.build_request is None:
            return canonical_args
        return self.build_request(canonical_args, config)

    def snapshot(self) -> dict[str, Any]:
        schema, schema_hash = self._schema_text()
        return {
            "schema": json.loads(schema),
            "schema_hash": schema_hash,
            "recovery": self.recovery.as_json(),
            "undo": self.undo.tool if self.undo else None,
            "approval": self.approval is not None,
            "personal_data": self.personal_data,
        }


def tool(
    *,
    name: str,
    args: type[BaseModel],
    description: str,
    recovery: Recovery,
    request: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]] | None = None,
    lookup: Callable[[dict[str, Any], CallInfo], LookupResult] | None = None,
    undo: Undo | None = None,
    retry: RetryPolicy | None = None,
    timeout: float = 10.0,
    approval: ApprovalPolicy | None = None,
    provider: str = "",
    personal_data: bool = False,
) -> Callable[[Callable[[dict[str, Any], CallInfo], dict[str, Any]]], Tool]:
    """Declare a tool from a function that performs one attempt.

    The function receives the exact stored request (a dict) and a ``CallInfo``
    with the effect key; it returns the provider's answer as a JSON-able dict.
    ``personal_data``: its arguments or results name a person, so a tenant's
    "redact personal data after" setting applies to its steps.
    """

    def decorate(fn: Callable[[dict[str, Any], CallInfo], dict[str, Any]]) -> Tool:
        return Tool(
            name=name,
            description=description,
            args_model=args,
            recovery=recovery,
            call=fn,
            build_request=request,
            find=lookup,
            undo=undo,
            retry=retry or RetryPolicy(),
            timeout=timeout,
            approval=approval,
            provider=provider,
            personal_data=personal_data,
        )

    return decorate


@dataclass(frozen=True)
class ToolResult:
    """What agent code gets back from ``ctx.tool``."""

    status: Literal["succeeded", "failed", "invalid_arguments"]
    value: dict[str, Any] | None = None
    error: str | None = None
    error_class: str | None = None
    step_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def for_model(self) -> dict[str, Any]:
        """The result as the model should see it in a tool message."""
        if self.ok:
            return {"ok": True, "result": self.value}
        return {"ok": False, "error": self.error, "error_class": self.error_class}
