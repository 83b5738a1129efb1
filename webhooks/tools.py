"""The one tool of the delivery run: post one event to one endpoint, signed.

It rides on notifications' webhook path (a tool of a run of Holdfast's own engine,
the body's canonical bytes, the refused-connection test, Retry-After), with the
Standard Webhooks contract instead of Slack's:

- every attempt carries ``webhook-id`` = the delivery's message id, the same on every
  attempt and resend; a receiver deduplicates by it, so a resend after a crash, a
  timeout or a 5xx delivers nothing new (``idempotent`` recovery, no lookup: a
  receiver offers none);
- a 2xx is delivered; a 4xx other than 408 and 429 is a definite refusal, never
  sent again, and so is a redirect (a 3xx is never followed); everything else (5xx,
  408, 429 with its Retry-After, a timeout, a refused or dropped connection) is sent
  again later under the same id, with the tool's backoff, until ``MAX_ATTEMPTS``,
  after which the delivery is given up;
- an endpoint whose address became a private or local one is refused before the
  attempt (``webhooks.addresses``);
- the secret is read from the endpoint at each attempt and goes only into the
  signature: never into the step's stored request, its result or an error.

After each attempt the tool writes what the endpoint answered to the delivery's row
(attempts, status code, error, delivered at), which the delivery log shows.
"""

from __future__ import annotations

import time
from datetime import timedelta

import requests
from django.conf import settings
from django.db.models import F
from django.utils import timezone
from pydantic import BaseModel, Field

from agentruns.runtime import CallInfo, ProviderBusy, RetryPolicy, ToolRefused, idempotent, tool
from notifications.tools import never_connected, retry_after_seconds, webhook_body
from webhooks import signing
from webhooks.addresses import address_problem
from webhooks.models import DeliveryStatus, WebhookDelivery

# A receiver keeps the ids it saw at least this long (README "Webhooks").
DEDUPE_WINDOW = timedelta(days=3)
# Attempts at 0 s, then about 5 s, 30 s, 3 min, 18 min, 1.8 h, 10 h, 10 h: a day.
MAX_ATTEMPTS = 8
DELIVERY_RETRY = RetryPolicy(
    max_attempts=MAX_ATTEMPTS,
    initial_delay=5.0,
    multiplier=6.0,
    max_delay=10 * 3600.0,
    deadline=DEDUPE_WINDOW.total_seconds(),
    # A crash mid-attempt is resent under the same id as often as any failure.
    max_ambiguous_resends=MAX_ATTEMPTS,
)
USER_AGENT = "Holdfast-Webhooks/1"


class DeliverArgs(BaseModel):
    delivery_id: int = Field(gt=0)


def _record(delivery: WebhookDelivery, status: str, *, code: int | None, error: str = "") -> None:
    now = timezone.now()
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        status=status,
        attempts=F("attempts") + 1,
        last_status_code=code,
        last_error=error[:300],
        last_attempt_at=now,
        delivered_at=now if status == DeliveryStatus.DELIVERED else None,
    )


def _again(
    delivery: WebhookDelivery,
    call: CallInfo,
    why: str,
    *,
    code: int | None = None,
    retry_after: float | None = None,
) -> ProviderBusy | ToolRefused:
    """The exception for an attempt to be made again, or for the last one."""
    if call.attempt >= MAX_ATTEMPTS:
        _record(delivery, DeliveryStatus.FAILED, code=code, error=why)
        return ToolRefused(
            f"given up after {call.attempt} attempts: {why}", error_class="gave_up", status=code
        )
    _record(delivery, DeliveryStatus.RETRYING, code=code, error=why)
    return ProviderBusy(why, retry_after=retry_after, error_class="endpoint_failing")


@tool(
    name="deliver_webhook",
    args=DeliverArgs,
    description="Post one event to one of the tenant's webhook endpoints, signed.",
    recovery=idempotent(DEDUPE_WINDOW),
    retry=DELIVERY_RETRY,
    timeout=15.0,
    provider="webhook endpoint",
)
def deliver_webhook(request: dict, call: CallInfo) -> dict:
    delivery = (
        WebhookDelivery.objects.select_related("endpoint", "event")
        .filter(pk=request["delivery_id"], tenant_id=call.tenant_id)
        .first()
    )
    if delivery is None:
        raise ToolRefused("no such delivery in this tenant", error_class="invalid_request")
    if delivery.status == DeliveryStatus.DELIVERED:
        # Delivered by an attempt whose answer the step did not record (a crash).
        return {"delivered": True, "message_id": delivery.message_id, "status_code": None}
    endpoint = delivery.endpoint
    if not endpoint.is_active:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(status=DeliveryStatus.SKIPPED)
        raise ToolRefused("the endpoint is disabled", error_class="endpoint_disabled")
    if problem := address_problem(endpoint.url):
        _record(delivery, DeliveryStatus.REFUSED, code=None, error=problem)
        raise ToolRefused(problem, error_class="private_address")
    body = webhook_body(delivery.event.payload)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        **signing.headers(
            endpoint.signing_secrets(now=timezone.now()),
            delivery.message_id,
            int(time.time()),
            body,
        ),
    }
    timeout = min(call.timeout, settings.HOLDFAST_WEBHOOK_TIMEOUT_SECONDS)
    try:
        # Never followed: an endpoint is the address its admin typed, not one it names.
        answer = requests.post(
            endpoint.url, data=body, headers=headers, timeout=timeout, allow_redirects=False
        )
    except requests.exceptions.Timeout:
        raise _again(delivery, call, f"no answer within {timeout:g} s") from None
    except requests.exceptions.ConnectionError as error:
        why = "the connection was refused" if never_connected(error) else "the connection dropped"
        raise _again(delivery, call, why) from None
    except requests.exceptions.RequestException as error:
        # An address requests cannot post to (a bad scheme or host): nothing was sent.
        _record(delivery, DeliveryStatus.REFUSED, code=None, error=type(error).__name__)
        raise ToolRefused(
            f"the address cannot be posted to ({type(error).__name__})",
            error_class="invalid_request",
        ) from None
    code = answer.status_code
    if 200 <= code < 300:
        _record(delivery, DeliveryStatus.DELIVERED, code=code)
        return {"delivered": True, "message_id": delivery.message_id, "status_code": code}
    if code in (408, 429) or code >= 500:
        raise _again(
            delivery,
            call,
            f"the endpoint answered {code}",
            code=code,
            retry_after=retry_after_seconds(answer) if code in (429, 503) else None,
        )
    _record(delivery, DeliveryStatus.REFUSED, code=code, error=f"the endpoint answered {code}")
    raise ToolRefused(
        f"the endpoint refused the event ({code})", error_class="endpoint_refused", status=code
    )
