"""Approval gating: what a tool declares, and the one small gate the engine calls.

A tool that needs a person's approval declares an ``ApprovalPolicy``. Whether a
call needs approval is decided once, from the canonical arguments and the
configuration pinned to the run, when its step is first recorded: such a step
is recorded ``planned`` (not sent) and stays so until an approval bound to its
exact arguments clears it (DESIGN §8).

The runtime knows nothing of how approvals are stored or decided. It calls an
``ApprovalGate`` (the approvals app provides the real one) to read the latest
approval of a step, to request one, to invalidate one, and to get the guard
statement that consumes an approval in the same commit that clears the send.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from agentruns.runtime.tools import CallInfo

DEFAULT_APPROVAL_EXPIRY = timedelta(hours=24)


@dataclass(frozen=True)
class ApprovalPolicy:
    """When a tool's call needs approval, and what the decision depends on.

    - ``required(args, config)``: whether this call needs a person (``config``
      is the run's pinned configuration, never the deployment's settings);
    - ``resource(args)``: the reference of the resource the decision depends on,
      e.g. ``"payment_intent:pi_123"``;
    - ``resource_state(args, call)``: reads that resource from its provider and
      returns the facts the decision depends on (for a refund: the amount
      received and the amount already refunded). Its hash is the resource
      fingerprint; a change between the decision and the send invalidates it;
    - ``preview(args)``: one line a person reads before deciding;
    - ``amount(args)``: the (minor units, currency) an approver's authority must
      cover, or None when the call moves no money;
    - ``refusal(args, state)``: why the provider will refuse this call given the
      resource's state (a refund larger than what remains, in another currency),
      in words, or None. Such a call is never approved, and is refused before it is
      sent, with nothing sent;
    - ``summary(args, state)``: what the resource allows now, in one line an
      approver reads beside its state ("249.00 EUR of 249.00 EUR still refundable").
    """

    required: Callable[[dict[str, Any], dict[str, Any]], bool]
    resource: Callable[[dict[str, Any]], str]
    resource_state: Callable[[dict[str, Any], CallInfo], dict[str, Any]]
    preview: Callable[[dict[str, Any]], str]
    amount: Callable[[dict[str, Any]], tuple[int, str] | None] | None = None
    expires_after: timedelta = DEFAULT_APPROVAL_EXPIRY
    refusal: Callable[[dict[str, Any], dict[str, Any]], str | None] | None = None
    summary: Callable[[dict[str, Any], dict[str, Any]], str] | None = None

    def summary_of(self, args: dict[str, Any], state: dict[str, Any] | None) -> str:
        """``summary(args, state)``, or "" when the policy has none or no state is known."""
        if self.summary is None or not state:
            return ""
        return self.summary(args, state)

    def refusal_for(self, args: dict[str, Any], state: dict[str, Any] | None) -> str | None:
        """``refusal(args, state)``, or None when the policy has none or no state is known."""
        if self.refusal is None or not state:
            return None
        return self.refusal(args, state)


def always(args: dict[str, Any], config: dict[str, Any]) -> bool:
    """An ``ApprovalPolicy.required`` for tools whose every call needs a person."""
    return True


ApprovalStatusName = Literal[
    "pending", "approved", "rejected", "expired", "invalidated", "consumed"
]


@dataclass(frozen=True)
class ApprovalState:
    """The latest approval of one step, as the engine needs to see it."""

    id: int
    status: ApprovalStatusName
    args_hash: str
    resource_fingerprint: str
    resource_state: dict[str, Any]
    decided_by: str = ""
    note: str = ""
    # An expired approval an operator asked to request again.
    rerequested: bool = False
    consumed_by_effect_key: str | None = None


@dataclass(frozen=True)
class ApprovalRequest:
    """Everything an approval is bound to when the engine asks for one."""

    run_id: str
    tenant_id: int
    step_id: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    requested_by: str
    resource: str
    resource_state: dict[str, Any]
    resource_fingerprint: str
    preview: str
    amount: int | None
    currency: str
    expires_after: timedelta
    effect_key: str
    # The approval this one replaces (invalidated or expired), and what changed.
    replaces: int | None = None
    changes: list[str] = field(default_factory=list)
    # Why the provider will refuse the call on ``resource_state`` ("" when it will not).
    refusal: str = ""


@dataclass(frozen=True)
class Guard:
    """A statement that must write exactly one row for a transition to commit.

    ``sql`` uses ``%s`` placeholders and ends with ``RETURNING id``; ``params``
    are already in the form the backend takes.
    """

    sql: str
    params: list[Any]


class ApprovalGate(Protocol):
    def latest(self, run_id: str, step_id: str) -> ApprovalState | None: ...

    def request(self, request: ApprovalRequest) -> int:
        """Record a pending approval for the step, or return the live one (idempotent)."""

    def consume_guard(
        self,
        approval_id: int,
        *,
        vendor: str,
        tenant_id: int,
        args_hash: str,
        resource_fingerprint: str,
        effect_key: str,
    ) -> Guard:
        """The statement that marks the approval consumed only if every check still holds."""

    def explain(
        self, approval_id: int, *, tenant_id: int, args_hash: str, resource_fingerprint: str
    ) -> str:
        """Why ``consume_guard`` matched no row: the first check that failed, in words."""

    def invalidate(self, approval_id: int, reason: str) -> None: ...

    def approval_for_effect(self, effect_key: str) -> int | None:
        """The approval consumed by this effect key, if any (it travels with every resend)."""

    def withdraw(self, run_id: str, reason: str) -> None:
        """The run ended: its approvals still waiting for a decision are closed."""


class NoApprovals:
    """A gate for deployments and tests without the approvals app: any gated call is
    refused, never sent without the approval it needs."""

    def latest(self, run_id: str, step_id: str) -> ApprovalState | None:
        return None

    def request(self, request: ApprovalRequest) -> int:
        raise RuntimeError(
            f"tool {request.tool!r} needs approval but this engine has no approval gate"
        )

    def consume_guard(self, approval_id: int, **kwargs) -> Guard:  # pragma: no cover
        raise RuntimeError("no approval gate")

    def explain(self, approval_id: int, **kwargs) -> str:  # pragma: no cover
        return "no approval gate"

    def invalidate(self, approval_id: int, reason: str) -> None:  # pragma: no cover
        raise RuntimeError("no approval gate")

    def approval_for_effect(self, effect_key: str) -> int | None:
        return None

    def withdraw(self, run_id: str, reason: str) -> None:
        return None
