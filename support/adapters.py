"""Adapters to the outside world the refund-support agent talks to.

Every adapter acts as one tenant's account at its provider (``Credentials``: the
endpoint and the secret, resolved for the run's tenant when the call is made).
Payments speak Stripe's v1 API through the official SDK; the default tenant's
account points at the local sandbox, and Stripe's test mode is a settings change
(``PAYMENTS_API_BASE``, ``PAYMENTS_API_KEY``). The SDK's own retries are off:
the engine owns retries so every attempt is recorded. Every error is turned
into the runtime's vocabulary here, once: ``ToolRefused`` for a definite no,
``ProviderBusy`` for 409/429, and anything that may have taken effect is left
to propagate as what it is.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import requests
import stripe
import urllib3

from agentruns.runtime import Credentials, ProviderBusy, ToolRefused

EFFECT_KEY_METADATA = "holdfast_effect_key"


def payments_client(account: Credentials, timeout: float) -> stripe.StripeClient:
    return stripe.StripeClient(
        account.secret,
        base_addresses={"api": account.endpoint},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=timeout),
    )


def _retry_after(error: stripe.StripeError) -> float | None:
    headers = error.headers or {}
    for name, value in headers.items():
        if name.lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except (TypeError, ValueError):
                return None
    return None


def _never_connected(error: BaseException) -> bool:
    """Whether the request failed before a connection was made (refused, unreachable,
    a connect timeout): then not a byte of it reached the provider."""
    cause = error.__cause__
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return True
    if isinstance(cause, requests.exceptions.ConnectionError) and cause.args:
        reason = getattr(cause.args[0], "reason", None)
        return isinstance(
            reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError
        )
    return False


def translate_stripe_error(error: stripe.StripeError) -> Exception:
    """Map one Stripe error to the runtime's classification (DESIGN §7).

    A 400 idempotency_error (the key was used with other parameters) is not a
    refusal: a request under that key may already have executed. A connection
    that was never made sent nothing: the same request goes again later, for as
    long as the provider is away, and no lookup or person is needed.
    """
    if isinstance(error, stripe.APIConnectionError) and _never_connected(error):
        return ProviderBusy(
            f"the payments API is unreachable: {error.__cause__}", error_class="unreachable"
        )
    status = error.http_status
    code = getattr(error, "code", None) or getattr(getattr(error, "error", None), "code", None)
    message = error.user_message or str(error)
    if isinstance(error, stripe.RateLimitError) or status == 429:
        return ProviderBusy(f"rate limited: {message}", retry_after=_retry_after(error))
    if status == 409:
        return ProviderBusy(
            f"the same idempotency key is still being processed: {message}",
            retry_after=_retry_after(error),
            error_class="idempotency_key_in_use",
            may_be_in_flight=True,
        )
    if isinstance(error, stripe.IdempotencyError):
        return error
    if isinstance(error, (stripe.AuthenticationError, stripe.PermissionError)):
        return ToolRefused(message, error_class="authentication", status=status)
    if isinstance(error, stripe.InvalidRequestError) or (status is not None and status < 500):
        return ToolRefused(message, error_class=code or "invalid_request", status=status)
    return error


def refund_create(
    account: Credentials,
    *,
    payment_intent: str,
    amount: int,
    reason: str | None,
    metadata: dict[str, str],
    effect_key: str,
    timeout: float,
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "payment_intent": payment_intent,
        "amount": amount,
        "metadata": {**metadata, EFFECT_KEY_METADATA: effect_key},
    }
    if reason:
        params["reason"] = reason
    try:
        refund = payments_client(account, timeout).v1.refunds.create(
            params=params, options={"idempotency_key": effect_key}
        )
    except stripe.StripeError as error:
        raise translate_stripe_error(error) from error
    return _refund_json(refund)


def refund_find(
    account: Credentials, *, payment_intent: str, effect_key: str, timeout: float
) -> dict | None:
    """The refund made under ``effect_key``, or None after reading every refund of the
    payment (a complete listing, so None means it does not exist)."""
    client = payments_client(account, timeout)
    starting_after = None
    while True:
        params: dict[str, Any] = {"payment_intent": payment_intent, "limit": 100}
        if starting_after:
            params["starting_after"] = starting_after
        try:
            page = client.v1.refunds.list(params=params)
        except stripe.StripeError as error:
            raise translate_stripe_error(error) from error
        for refund in page.data:
            if _metadata(refund).get(EFFECT_KEY_METADATA) == effect_key:
                return _refund_json(refund)
        if not page.has_more or not page.data:
            return None
        starting_after = page.data[-1].id


def payment_state(account: Credentials, payment_intent: str, *, timeout: float) -> dict[str, Any]:
    """What a refund decision depends on: the amount received and already refunded."""
    try:
        intent = payments_client(account, timeout).v1.payment_intents.retrieve(
            payment_intent, params={"expand": ["latest_charge"]}
        )
    except stripe.StripeError as error:
        raise translate_stripe_error(error) from error
    charge = intent.latest_charge
    refunded = getattr(charge, "amount_refunded", None) if charge is not None else None
    if refunded is None:
        raise ValueError(f"{payment_intent}: the provider did not report the refunded amount")
    return {
        "payment_intent": intent.id,
        "currency": intent.currency,
        "amount_received": intent.amount_received,
        "amount_refunded": refunded,
    }


def _refund_json(refund: Any) -> dict[str, Any]:
    return {
        "id": refund.id,
        "amount": refund.amount,
        "currency": refund.currency,
        "status": refund.status,
        "payment_intent": refund.payment_intent,
        "metadata": _metadata(refund),
    }


def _metadata(refund: Any) -> dict[str, str]:
    # StripeObject is not a mapping in SDK 16: it converts explicitly.
    return refund.metadata.to_dict() if refund.metadata else {}


def shop_order(account: Credentials, order_id: str, *, timeout: float) -> dict[str, Any]:
    """The order as the tenant's shop account sees it: another account's order is
    "not found", exactly like one that does not exist."""
    base = account.endpoint.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ToolRefused(f"the shop endpoint must be an http(s) URL, not {base!r}")
    url = f"{base}/shop/orders/{urllib.parse.quote(order_id, safe='')}"
    headers = {"Accept": "application/json", "Authorization": f"Bearer {account.secret}"}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return json.loads(response.read())
    except urllib.error.HTTPError as error:
        if error.code == 404:
            raise ToolRefused(f"there is no order {order_id}", error_class="not_found") from None
        if error.code == 429:
            raise ProviderBusy("the shop is rate limiting") from None
        if error.code in (401, 403):
            raise ToolRefused(
                f"the shop refused tenant {account.tenant!r}'s credentials ({error.code})",
                error_class="authentication",
                status=error.code,
            ) from None
        if error.code < 500:
            raise ToolRefused(
                f"the shop refused the lookup ({error.code})", error_class="invalid_request"
            ) from None
        raise
    except urllib.error.URLError as error:
        if isinstance(error.reason, OSError):
            # Refused, unreachable, timed out connecting: a read changes nothing, so
            # it is asked again later, for as long as the shop is away.
            raise ProviderBusy(
                f"the shop is unreachable: {error.reason}", error_class="unreachable"
            ) from None
        raise
