"""Reads of approvals for the pages: the inbox, one approval's page, the navigation's count."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from accounts.models import AuditEntry, Tenant
from accounts.privacy import mask
from accounts.services import for_tenant
from agentruns.money import format_amount
from agentruns.runtime import canonical_json
from agentruns.services import get_registry
from approvals.models import Approval, ApprovalStatus
from approvals.policy import approver_problem, limits_for
from approvals.services import ResourceNow, approval_used_by

PAGE_SIZE = 100
# The pending cards of one inbox page that read their resource as the page loads:
# the provider is asked at most this many times per page view (readings are also
# shared for a few seconds, approvals.services.RESOURCE_READ_CACHE_SECONDS).
RESOURCE_READS_PER_PAGE = 10
PENDING = "pending"
DECIDED = "decided"


@dataclass(frozen=True)
class Viewer:
    """What the person looking may do, worked out once per request."""

    user: Any
    tenant: Tenant
    actor: str
    # Why they can decide no approval at all (account, tenant, role), or None.
    problem: str | None
    # The largest amount they may approve in each currency they hold authority in
    # (None: no limit in it); a currency missing here is one they may not approve in.
    limits: dict[str, int | None]
    # A superuser: any amount in any currency.
    unlimited: bool
    may_rerequest: bool
    # May read providers' own error messages (else a category and a reference).
    error_detail: bool = False

    @classmethod
    def of(cls, user, tenant: Tenant, *, actor: str) -> Viewer:
        return cls(
            user=user,
            tenant=tenant,
            actor=actor,
            problem=approver_problem(user, tenant, None, ""),
            limits=limits_for(user, tenant),
            unlimited=user.is_superuser,
            may_rerequest=user.has_perm("accounts.retry_runs"),
            error_detail=user.has_perm("accounts.view_provider_errors"),
        )

    @property
    def has_authority(self) -> bool:
        return self.unlimited or bool(self.limits)

    @property
    def limit_text(self) -> str:
        """One limit per currency held ("500.00 EUR, 8,000 JPY"); "no limit" for a superuser."""
        if self.unlimited:
            return "no limit"
        return ", ".join(
            f"no limit in {currency.upper()}" if limit is None else format_amount(limit, currency)
            for currency, limit in sorted(self.limits.items())
        )

    def covers(self, amount: int, currency: str) -> bool:
        if self.unlimited:
            return True
        if currency not in self.limits:
            return False
        limit = self.limits[currency]
        return limit is None or amount <= limit

    def why_not(self, approval: Approval) -> str:
        """Why this viewer gets no decision buttons on ``approval``; "" when they may decide."""
        if approval.requested_by == self.actor:
            return "You asked for this action; another approver must decide it."
        if self.problem:
            return f"You cannot decide approvals: {self.problem}."
        if approval.amount is None or self.covers(approval.amount, approval.currency):
            return ""
        # Refused: in the policy's own words (the same the decision would give).
        problem = approver_problem(self.user, self.tenant, approval.amount, approval.currency)
        return f"You cannot decide this one: {problem}." if problem else ""


@dataclass
class Reading:
    """The resource's state read from its provider now, against the state when asked."""

    rows: list[tuple[str, str]]
    changes: list[str]
    error: str
    summary: str = ""
    error_class: str = ""
    read_at: Any = None

    @classmethod
    def of(cls, approval: Approval, now: ResourceNow) -> Reading:
        return cls(
            _rows(now.state or {}),
            now.changes_from(approval),
            now.error,
            now.summary,
            now.error_class,
            now.read_at,
        )


@dataclass
class Card:
    """One approval as the inbox shows it to one viewer."""

    approval: Approval
    why_not: str = ""
    # Why the provider will refuse the action: no Approve is offered, Reject is.
    refusal: str = ""
    can_rerequest: bool = False
    expired: bool = False
    error: str = ""
    flash: str = ""
    note: str = ""
    reading: Reading | None = None
    # Read the resource from its provider as the card loads; further down a long
    # inbox, only when asked (RESOURCE_READS_PER_PAGE).
    reads_now: bool = True
    # What used a consumed approval, in words ("refund re_…").
    used_by: str = ""
    args: list[tuple[str, str]] = field(default_factory=list)
    state_then: list[tuple[str, str]] = field(default_factory=list)

    @property
    def amount(self) -> str:
        return format_amount(self.approval.amount, self.approval.currency)

    @property
    def stale(self) -> bool:
        """The resource changed since it was asked: no Approve, "ask again" instead."""
        return bool(self.reading and self.reading.changes)

    @property
    def canonical_args(self) -> str:
        """The text args_hash is taken over, as shown to people: through the one
        masking rule, so a card number or an address in it reads ••••."""
        return canonical_json(mask(self.approval.args))

    @property
    def canonical_masked(self) -> bool:
        return self.canonical_args != canonical_json(self.approval.args)


def _rows(values: Any) -> list[tuple[str, str]]:
    """Key/value rows for a table; nested values shown as JSON. Escaped by the template.

    Beside a ``currency``, an ``amount`` or ``amount_…`` in minor units is shown as
    money in that currency ("45.00 EUR", not 4500).
    """
    # Shown to people: the one masking rule (a card number, an address) applies.
    values = mask(values)
    if not isinstance(values, dict):
        return [("value", json.dumps(values, ensure_ascii=False))]
    currency = values.get("currency") if isinstance(values.get("currency"), str) else None
    rows = []
    for key, value in values.items():
        if _is_money(str(key), value) and currency:
            shown = format_amount(value, currency)
        elif isinstance(value, str):
            shown = value
        else:
            shown = json.dumps(value, ensure_ascii=False)
        rows.append((str(key), shown))
    return rows


def _is_money(key: str, value: Any) -> bool:
    return (key == "amount" or key.startswith("amount_")) and type(value) is int


def approval_card(viewer: Viewer, approval: Approval, **extra: Any) -> Card:
    pending = approval.status == ApprovalStatus.PENDING
    return Card(
        approval=approval,
        why_not=viewer.why_not(approval) if pending else "",
        refusal=approval.provider_refusal if pending else "",
        can_rerequest=viewer.may_rerequest
        and approval.status == ApprovalStatus.EXPIRED
        and approval.rerequested_at is None,
        expired=pending and approval.expires_at <= timezone.now(),
        args=_rows(approval.args),
        state_then=_rows(approval.resource_state),
        used_by=approval_used_by(approval) if approval.status == ApprovalStatus.CONSUMED else "",
        **extra,
    )


def card_signature(card: Card) -> str:
    """What a card shows that can change after it is rendered."""
    approval = card.approval
    return "|".join(
        str(part)
        for part in (
            approval.pk,
            approval.status,
            approval.decided_by_name,
            approval.rerequested_at,
            approval.consumed_at,
            approval.invalidated_reason,
            approval.run.status,
        )
    )


def cards_seen(cards: list[Card]) -> str:
    """A short name for a list of cards as rendered: the page carries it on its socket's
    address, so a socket (re)connecting can tell whether the page is still current."""
    joined = "\n".join(card_signature(card) for card in cards)
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def inbox_context(viewer: Viewer, params) -> dict[str, Any]:
    """The inbox ``viewer`` sees under ``params`` (show, tool, agent), in their tenant."""
    show = DECIDED if params.get("show") == DECIDED else PENDING
    tool = params.get("tool", "").strip()
    agent = params.get("agent", "").strip()
    approvals = for_tenant(Approval.objects.select_related("run"), viewer.tenant)
    if tool:
        approvals = approvals.filter(tool=tool)
    if agent:
        approvals = approvals.filter(run__agent_name=agent)
    pending_count = approvals.pending().count()
    if show == PENDING:
        # Oldest first: whoever has waited longest is on top.
        page = list(approvals.pending().order_by("created_at", "id")[: PAGE_SIZE + 1])
    else:
        page = list(approvals.decided().order_by("-created_at", "-id")[: PAGE_SIZE + 1])
    cards = [
        approval_card(viewer, approval, reads_now=index < RESOURCE_READS_PER_PAGE)
        for index, approval in enumerate(page[:PAGE_SIZE])
    ]
    return {
        "show": show,
        "tool": tool,
        "agent": agent,
        "tools": list(
            for_tenant(Approval.objects.all(), viewer.tenant)
            .order_by("tool")
            .values_list("tool", flat=True)
            .distinct()
        ),
        "agents": get_registry().names(),
        "viewer": viewer,
        "error_detail": viewer.error_detail,
        "pending_count": pending_count,
        "cards": cards,
        "more": len(page) > PAGE_SIZE,
        "seen": cards_seen(cards),
        # The cards' ids, on the socket's address too: a page older than the inbox
        # (its socket connected late, or again after an outage) is brought up to date
        # card by card, so a card its reader just decided stays on it, decided.
        "shown": ",".join(str(card.approval.pk) for card in cards),
        "page_size": PAGE_SIZE,
    }


def approval_detail_context(viewer: Viewer, card: Card) -> dict[str, Any]:
    """One approval's page: its card, what replaced it, what people did to it."""
    approval = card.approval
    return {
        "card": card,
        "viewer": viewer,
        "seen": cards_seen([card]),
        "error_detail": viewer.error_detail,
        "replaced_by": list(for_tenant(approval.replaced_by.all(), viewer.tenant)),
        "audit": list(
            for_tenant(AuditEntry.objects.all(), viewer.tenant).filter(
                object_type="approval", object_id=str(approval.pk)
            )[:50]
        ),
    }


def pending_approval_count(tenant: Tenant) -> dict[str, int]:
    # What the approvals inbox lists (approval_inbox index), not the runs waiting:
    # an expired approval leaves its run waiting with nothing to decide.
    return {"pending_approvals": for_tenant(Approval.objects.pending(), tenant).count()}
