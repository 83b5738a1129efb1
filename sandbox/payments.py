"""The payments provider: Stripe v1 refunds and payment intents, on the sandbox's own rows.

Wire format and semantics follow the stripe-python 16.1.0 contract (form-encoded bodies
with bracket notation in, JSON objects carrying ``"object"`` out, ``{"error": {...}}`` for
every non-2xx answer).

Every operation takes the caller's ``account`` (``sandbox.accounts``) and sees only that
account's payment intents and their refunds: another account's object gets the same 404
``resource_missing`` as an id that does not exist, so a key learns nothing of the others.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet, Sum

from sandbox import clock
from sandbox.models import DB, PaymentIntent, Refund
from sandbox.responses import ApiError, new_id, resource_missing

REFUND_REASONS = {"duplicate", "fraudulent", "requested_by_customer"}
# Parameters Stripe accepts on POST /v1/refunds; anything else is "unknown parameter".
REFUND_CREATE_PARAMS = {
    "amount",
    "charge",
    "currency",
    "customer",
    "instructions_email",
    "metadata",
    "origin",
    "payment_intent",
    "reason",
    "refund_application_fee",
    "reverse_transfer",
    "expand",
}
_BRACKETED = re.compile(r"^([^\[\]]+)\[([^\[\]]*)\]$")
_CURRENCY_SYMBOLS = {"eur": "€", "usd": "$", "gbp": "£"}


def unix(moment: datetime) -> int:
    return int(moment.timestamp())


def format_money(amount: int, currency: str) -> str:
    symbol = _CURRENCY_SYMBOLS.get(currency)
    major = f"{amount / 100:.2f}"
    return f"{symbol}{major}" if symbol else f"{major} {currency.upper()}"


# --- serialisation -----------------------------------------------------------------------


def refund_json(refund: Refund, charge_id: str) -> dict[str, Any]:
    return {
        "id": refund.id,
        "object": "refund",
        "amount": refund.amount,
        "balance_transaction": None,
        "charge": charge_id,
        "created": unix(refund.created),
        "currency": refund.currency,
        "destination_details": None,
        "metadata": refund.metadata,
        "payment_intent": refund.payment_intent_id,
        "reason": refund.reason or None,
        "receipt_number": None,
        "source_transfer_reversal": None,
        "status": refund.status,
        "transfer_reversal": None,
    }


def amount_refunded(intent: PaymentIntent) -> int:
    return intent.refunds.aggregate(total=Sum("amount"))["total"] or 0


def charge_json(intent: PaymentIntent) -> dict[str, Any]:
    refunded = amount_refunded(intent)
    return {
        "id": intent.charge_id,
        "object": "charge",
        "amount": intent.amount,
        "amount_captured": intent.amount_received,
        "amount_refunded": refunded,
        "captured": True,
        "created": unix(intent.created),
        "currency": intent.currency,
        "livemode": False,
        "metadata": intent.metadata,
        "paid": True,
        "payment_intent": intent.id,
        "refunded": refunded >= intent.amount_received,
        "status": "succeeded",
    }


def payment_intent_json(intent: PaymentIntent, *, expand: set[str]) -> dict[str, Any]:
    return {
        "id": intent.id,
        "object": "payment_intent",
        "amount": intent.amount,
        "amount_capturable": 0,
        "amount_received": intent.amount_received,
        "created": unix(intent.created),
        "currency": intent.currency,
        "customer": intent.customer or None,
        "description": None,
        # Stripe's way to the refunded amount: expand[]=latest_charge gives the charge's
        # amount_refunded and refunded.
        "latest_charge": charge_json(intent) if "latest_charge" in expand else intent.charge_id,
        "livemode": False,
        "metadata": intent.metadata,
        "status": intent.status,
    }


# --- parameters --------------------------------------------------------------------------


def parse_params(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Decode Stripe's bracket notation one level deep: ``metadata[k]=v``, ``expand[0]=x``."""
    params: dict[str, Any] = {}
    for name, value in pairs:
        match = _BRACKETED.match(name)
        if match is None:
            params[name] = value
            continue
        outer, inner = match.groups()
        nested = params.get(outer)
        if not isinstance(nested, dict):
            nested = {}
            params[outer] = nested
        nested[inner] = value
    return params


def expand_fields(params: dict[str, Any]) -> set[str]:
    expand = params.get("expand")
    if isinstance(expand, dict):
        return set(expand.values())
    return {expand} if isinstance(expand, str) and expand else set()


def _positive_int(value: Any, param: str) -> int:
    if not isinstance(value, str) or not value.isdigit() or int(value) <= 0:
        raise ApiError(400, f"Invalid positive integer: {param}", param=param)
    return int(value)


def validate_refund_create(params: dict[str, Any]) -> dict[str, Any]:
    """Check the request before execution begins; errors raised here are never saved."""
    for name in params:
        if name not in REFUND_CREATE_PARAMS:
            raise ApiError(400, f"Received unknown parameter: {name}", param=name)
    intent_id = params.get("payment_intent")
    if "charge" in params and not intent_id:
        raise ApiError(
            400,
            "The sandbox refunds payment intents only; pass payment_intent.",
            param="charge",
        )
    if not isinstance(intent_id, str) or not intent_id:
        raise ApiError(
            400, "You must supply either a charge or a payment intent.", param="payment_intent"
        )
    amount = None if params.get("amount") in (None, "") else params["amount"]
    reason = params.get("reason") or ""
    if reason and reason not in REFUND_REASONS:
        raise ApiError(
            400,
            f"Invalid reason: must be one of {', '.join(sorted(REFUND_REASONS))}",
            param="reason",
        )
    metadata = params.get("metadata", {})
    if metadata == "":
        metadata = {}
    if not isinstance(metadata, dict):
        raise ApiError(400, "Invalid object", param="metadata")
    return {
        "payment_intent": intent_id,
        "amount": None if amount is None else _positive_int(amount, "amount"),
        "reason": reason,
        # metadata[key]= (empty) unsets a key; on a new refund it simply is not there.
        "metadata": {key: value for key, value in metadata.items() if value != ""},
    }


# --- operations --------------------------------------------------------------------------


def refund_create(request: dict[str, Any], *, account: str, idempotency_key: str) -> dict[str, Any]:
    """Create a refund. Runs inside the caller's transaction on the sandbox database."""
    intent = (
        PaymentIntent.objects.using(DB)
        .select_for_update()
        .filter(id=request["payment_intent"], account=account)
        .first()
    )
    if intent is None:
        raise resource_missing("payment_intent", request["payment_intent"], "payment_intent")
    remaining = intent.amount_received - amount_refunded(intent)
    if remaining <= 0:
        raise ApiError(
            400,
            f"Charge {intent.charge_id} has already been refunded.",
            code="charge_already_refunded",
        )
    amount = request["amount"] if request["amount"] is not None else remaining
    if amount > remaining:
        # Stripe's message; the code is a sandbox extension (Stripe sends none here).
        raise ApiError(
            400,
            f"Refund amount ({format_money(amount, intent.currency)}) is greater than "
            f"unrefunded amount on charge ({format_money(remaining, intent.currency)})",
            code="amount_too_large",
            param="amount",
        )
    refund = Refund.objects.using(DB).create(
        id=new_id("re_"),
        payment_intent=intent,
        amount=amount,
        currency=intent.currency,
        reason=request["reason"],
        metadata=request["metadata"],
        idempotency_key=idempotency_key,
        created=clock.now(),
    )
    return refund_json(refund, intent.charge_id)


def _refunds_of(account: str) -> QuerySet[Refund]:
    return Refund.objects.using(DB).filter(payment_intent__account=account)


def refund_retrieve(refund_id: str, *, account: str) -> dict[str, Any]:
    found = _refunds_of(account).select_related("payment_intent").filter(id=refund_id).first()
    if found is None:
        raise resource_missing("refund", refund_id)
    return refund_json(found, found.payment_intent.charge_id)


def refund_list(params: dict[str, Any], *, account: str) -> dict[str, Any]:
    """Newest first, paged by ``starting_after`` / ``ending_before`` like every Stripe list."""
    limit = 10
    if params.get("limit") not in (None, ""):
        raw = params["limit"]
        if not isinstance(raw, str) or not raw.isdigit() or not 1 <= int(raw) <= 100:
            raise ApiError(400, "Invalid integer: limit must be between 1 and 100", param="limit")
        limit = int(raw)
    refunds = _refunds_of(account).select_related("payment_intent")
    if params.get("payment_intent"):
        refunds = refunds.filter(payment_intent_id=params["payment_intent"])
    newest_first = ("-created", "-id")

    def cursor(param: str) -> Refund:
        found = _refunds_of(account).filter(id=params[param]).first()
        if found is None:
            raise resource_missing("refund", params[param], param)
        return found

    if params.get("starting_after"):
        after = cursor("starting_after")
        older = Q(created__lt=after.created) | Q(created=after.created, id__lt=after.id)
        rows = list(refunds.filter(older).order_by(*newest_first)[: limit + 1])
        has_more, page = len(rows) > limit, rows[:limit]
    elif params.get("ending_before"):
        before = cursor("ending_before")
        newer = Q(created__gt=before.created) | Q(created=before.created, id__gt=before.id)
        # The page just newer than the cursor: nearest first, then shown newest first.
        rows = list(refunds.filter(newer).order_by("created", "id")[: limit + 1])
        has_more, page = len(rows) > limit, rows[:limit][::-1]
    else:
        rows = list(refunds.order_by(*newest_first)[: limit + 1])
        has_more, page = len(rows) > limit, rows[:limit]
    return {
        "object": "list",
        "data": [refund_json(refund, refund.payment_intent.charge_id) for refund in page],
        "has_more": has_more,
        "url": "/v1/refunds",
    }


def payment_intent_retrieve(
    intent_id: str, params: dict[str, Any], *, account: str
) -> dict[str, Any]:
    intent = PaymentIntent.objects.using(DB).filter(id=intent_id, account=account).first()
    if intent is None:
        raise resource_missing("payment_intent", intent_id, "intent")
    return payment_intent_json(intent, expand=expand_fields(params))


def refund_totals(intent_ids: list[str]) -> dict[str, int]:
    rows = (
        Refund.objects.using(DB)
        .filter(payment_intent_id__in=intent_ids)
        .values("payment_intent_id")
        .annotate(total=Sum("amount"))
    )
    return {row["payment_intent_id"]: row["total"] for row in rows}


def atomic():
    return transaction.atomic(using=DB)
