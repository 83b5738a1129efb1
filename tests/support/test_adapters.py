"""Stripe's errors, mapped once to what the engine needs to know."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import stripe

from agentruns.runtime import ProviderBusy, ToolRefused
from agentruns.runtime.outcomes import Verdict, classify
from support import adapters
from support.adapters import translate_stripe_error


def _verdict(error):
    return classify(translate_stripe_error(error)).verdict


def test_a_rate_limit_is_busy_with_its_retry_after():
    error = stripe.RateLimitError("slow down", http_status=429, headers={"Retry-After": "7"})
    translated = translate_stripe_error(error)
    assert isinstance(translated, ProviderBusy)
    assert translated.retry_after == 7.0
    assert _verdict(error) is Verdict.BUSY


def test_a_key_still_in_use_is_busy_and_may_be_in_flight():
    error = stripe.APIError("in use", http_status=409, code="idempotency_key_in_use")
    translated = translate_stripe_error(error)
    assert isinstance(translated, ProviderBusy) and translated.may_be_in_flight


@pytest.mark.parametrize(
    ("error", "error_class"),
    [
        (
            stripe.InvalidRequestError(
                "too much", "amount", code="amount_too_large", http_status=400
            ),
            "amount_too_large",
        ),
        (
            stripe.InvalidRequestError(
                "no such intent", "payment_intent", code="resource_missing", http_status=404
            ),
            "resource_missing",
        ),
        (stripe.AuthenticationError("bad key", http_status=401), "authentication"),
        (stripe.PermissionError("no access", http_status=403), "authentication"),
    ],
)
def test_definite_refusals_fail_without_effect(error, error_class):
    translated = translate_stripe_error(error)
    assert isinstance(translated, ToolRefused)
    assert translated.error_class == error_class
    assert _verdict(error) is Verdict.REFUSED


@pytest.mark.parametrize(
    "error",
    [
        stripe.APIError("internal error", http_status=500),
        stripe.APIConnectionError("connection reset"),
        stripe.IdempotencyError("keys can only be used with the same parameters", http_status=400),
    ],
)
def test_anything_that_may_have_taken_effect_is_ambiguous(error):
    assert _verdict(error) is Verdict.AMBIGUOUS


@pytest.mark.parametrize("read", ["payments", "shop"])
def test_a_provider_that_cannot_be_reached_is_busy_not_ambiguous(read):
    """Refused at connect: not a byte was sent, so the same request goes again later
    (no lookup, no person), for as long as the provider is away."""
    nowhere = SimpleNamespace(
        provider=read,
        tenant="default",
        endpoint="http://127.0.0.1:9",
        secret="sk_test_x",
        sender="",
    )
    with pytest.raises(ProviderBusy) as busy:
        if read == "payments":
            adapters.payment_state(nowhere, "pi_1", timeout=2.0)
        else:
            adapters.shop_order(nowhere, "ord_1", timeout=2.0)
    assert busy.value.error_class == "unreachable"
    assert "unreachable" in str(busy.value)
