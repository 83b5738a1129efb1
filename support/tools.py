"""The refund-support agent's tools, declared with what their providers offer."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, Field

from agentruns.mail import email_send
from agentruns.money import format_amount
from agentruns.runtime import (
    MANUAL,
    READ_ONLY,
    ApprovalPolicy,
    CallInfo,
    LookupResult,
    ProviderBusy,
    ToolRefused,
    idempotent,
    tool,
)
from support import adapters

# Stripe honours an idempotency key for at least 24 hours after its first use.
STRIPE_KEY_WINDOW = timedelta(hours=24)


class LookupOrderArgs(BaseModel):
    order_id: str = Field(min_length=1, max_length=64, description="The shop's order id")


@tool(
    name="lookup_order",
    args=LookupOrderArgs,
    description="Read an order: customer, items, amount, payment intent and refund state.",
    recovery=READ_ONLY,
    timeout=5.0,
    provider="shop",
    # The order names its customer and their address.
    personal_data=True,
)
def lookup_order(request: dict, call: CallInfo) -> dict:
    return adapters.shop_order(call.credentials("shop"), request["order_id"], timeout=call.timeout)


class IssueRefundArgs(BaseModel):
    order_id: str = Field(min_length=1, max_length=64)
    payment_intent: str = Field(pattern=r"^pi_[A-Za-z0-9_]+$")
    amount: int = Field(gt=0, description="Amount in minor units (cents)")
    currency: str = Field(pattern=r"^[a-z]{3}$", description="ISO currency code, lower case")
    reason: Literal["duplicate", "fraudulent", "requested_by_customer"] = "requested_by_customer"


def _refund_request(args: dict, config: dict) -> dict:
    return {
        "payment_intent": args["payment_intent"],
        "amount": args["amount"],
        "currency": args["currency"],
        "reason": args["reason"],
        "metadata": {"order_id": args["order_id"]},
    }


def _find_refund(request: dict, call: CallInfo) -> LookupResult:
    found = adapters.refund_find(
        call.credentials("payments"),
        payment_intent=request["payment_intent"],
        effect_key=call.effect_key,
        timeout=call.timeout,
    )
    if found is None:
        return LookupResult(
            "absent",
            conclusive=True,
            detail=f"no refund of {request['payment_intent']} carries this effect key",
        )
    return LookupResult("found", found, conclusive=True)


def _refund_needs_approval(args: dict, config: dict) -> bool:
    # From the run's pinned configuration: the agent's default, or the tenant's own
    # auto-approval amount when it set one.
    approvals = config.get("approvals", {})
    if not approvals.get("enabled", True):
        return False
    limits = approvals.get("auto_approve_up_to")
    # Per currency: 50.00 EUR says nothing about JPY, so a currency without its own amount
    # (or with null) always waits for an approver. A run started before amounts were per
    # currency pinned one bare amount; it keeps what it was started with.
    limit = limits.get(args["currency"]) if isinstance(limits, dict) else limits
    return limit is None or args["amount"] > limit


def _refund_preview(args: dict) -> str:
    return (
        f"Refund {format_amount(args['amount'], args['currency'])} of order "
        f"{args['order_id']} (payment {args['payment_intent']}, reason: {args['reason']})"
    )


def _refund_refusal(args: dict, state: dict) -> str | None:
    """Why the payments provider will refuse this refund of the payment as it is."""
    currency = state.get("currency", "")
    if currency and currency != args["currency"]:
        return (
            f"the payment is in {currency.upper()}, not {args['currency'].upper()}: "
            "the provider refunds in the payment's own currency"
        )
    remaining = state.get("amount_received", 0) - state.get("amount_refunded", 0)
    if remaining <= 0:
        return "the payment is already fully refunded"
    if args["amount"] > remaining:
        return (
            f"{format_amount(args['amount'], currency)} is more than the "
            f"{format_amount(remaining, currency)} still refundable"
        )
    return None


def _refund_summary(args: dict, state: dict) -> str:
    """What remains refundable of the payment now, as money."""
    currency = state.get("currency", "")
    received = state.get("amount_received", 0)
    remaining = max(0, received - state.get("amount_refunded", 0))
    return (
        f"{format_amount(remaining, currency)} of {format_amount(received, currency)} "
        "still refundable"
    )


def _payment_state(args: dict, call: CallInfo) -> dict:
    return adapters.payment_state(
        call.credentials("payments"), args["payment_intent"], timeout=call.timeout
    )


REFUND_APPROVAL = ApprovalPolicy(
    required=_refund_needs_approval,
    resource=lambda args: f"payment_intent:{args['payment_intent']}",
    resource_state=_payment_state,
    preview=_refund_preview,
    amount=lambda args: (args["amount"], args["currency"]),
    expires_after=timedelta(hours=24),
    refusal=_refund_refusal,
    summary=_refund_summary,
)


@tool(
    name="issue_refund",
    args=IssueRefundArgs,
    description="Refund (part of) an order's payment. Amount in minor units.",
    recovery=idempotent(STRIPE_KEY_WINDOW, lookup=True),
    request=_refund_request,
    lookup=_find_refund,
    timeout=10.0,
    approval=REFUND_APPROVAL,
    provider="payments (Stripe API)",
)
def issue_refund(request: dict, call: CallInfo) -> dict:
    # The payment is read first, inside the one timeout the send was cleared for: a
    # refund is never still in flight when its send budget has passed.
    deadline = time.monotonic() + call.timeout
    account = call.credentials("payments")
    payment = adapters.payment_state(account, request["payment_intent"], timeout=call.timeout)
    if payment["currency"] != request["currency"]:
        # The provider refunds in the payment's own currency whatever is asked: an
        # amount meant in one currency must never move in another. Nothing is sent.
        raise ToolRefused(
            f"not sent: the payment is in {payment['currency'].upper()}, not "
            f"{request['currency'].upper()}",
            error_class="currency_mismatch",
        )
    remaining = deadline - time.monotonic()
    if remaining <= 0.5:
        # Too little of the timeout left to send safely; nothing was sent: try again.
        raise ProviderBusy("reading the payment used up the send's timeout", error_class="slow")
    metadata = {**request["metadata"], "holdfast_run_id": call.run_id}
    if call.approval_id is not None:
        # The provider's own record names the approval that authorised it. The
        # same on every resend (it is the approval this effect key consumed), so
        # the idempotent request stays identical.
        metadata["holdfast_approval_id"] = str(call.approval_id)
    refund = adapters.refund_create(
        account,
        payment_intent=request["payment_intent"],
        amount=request["amount"],
        reason=request["reason"],
        metadata=metadata,
        effect_key=call.effect_key,
        timeout=remaining,
    )
    if refund["currency"] != request["currency"]:
        # The refund happened (a fact); the agent learns the currency differed.
        refund["currency_mismatch"] = {"asked": request["currency"], "got": refund["currency"]}
    return refund


class CustomerEmailArgs(BaseModel):
    to: str = Field(pattern=r"^[^@\s]+@[^@\s]+$")
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=10_000)


@tool(
    name="send_customer_email",
    args=CustomerEmailArgs,
    description="Email the customer. Cannot be undone or checked afterwards.",
    # SMTP has no idempotency key and no lookup: only an operator can tell
    # whether an interrupted send went out.
    recovery=MANUAL,
    timeout=10.0,
    provider="mail (SMTP)",
    personal_data=True,
)
def send_customer_email(request: dict, call: CallInfo) -> dict:
    return email_send(call, to=request["to"], subject=request["subject"], body=request["body"])
