"""Incoming webhooks: a chat's "post a message to this URL", Slack-compatible.

- ``POST /hooks/<channel>`` with a JSON body (``{"text": …, "blocks": […]}``): the
  message is delivered (one ``WebhookDelivery`` row) and the answer is
  ``{"ok": true, "delivery": <id>}``;
- the same ``Idempotency-Key`` again is the same delivery: nothing new is
  delivered and the answer says ``"replayed": true`` (the contract a sender that
  lost its reply relies on to send again);
- ``GET /hooks/<channel>/deliveries/<key>``: the delivery made under a key, or 404
  ``no_delivery`` (complete: every delivery of the channel is a row);
- a Standard Webhooks post (``webhook-id``, ``webhook-timestamp``,
  ``webhook-signature``) is deduplicated by its ``webhook-id`` the same way, and its
  body may be any JSON object; the headers and the body as sent are kept, so a test
  verifies the signature on the receiver's own record.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import IntegrityError, transaction

from sandbox import clock
from sandbox.models import DB, WebhookDelivery
from sandbox.responses import ApiError, Response, json_response

MAX_KEY_LENGTH = 255


def _delivery_json(delivery: WebhookDelivery, *, replayed: bool = False) -> dict[str, Any]:
    return {
        "ok": True,
        "delivery": delivery.pk,
        "channel": delivery.channel,
        "idempotency_key": delivery.idempotency_key,
        "received_at": delivery.received_at.isoformat(),
        "replayed": replayed,
    }


def deliver(
    channel: str,
    body: bytes,
    *,
    key: str,
    signature: str,
    message_id: str = "",
    timestamp: str = "",
) -> Response:
    # A Standard Webhooks sender's webhook-id is its idempotency key.
    standard = bool(message_id)
    key = key or message_id
    if len(key) > MAX_KEY_LENGTH:
        raise ApiError(400, f"Idempotency-Key must be at most {MAX_KEY_LENGTH} characters long.")
    try:
        message = json.loads(body or b"null")
    except ValueError as exc:
        raise ApiError(400, f"invalid_payload: {exc}") from exc
    if standard and not isinstance(message, dict):
        raise ApiError(400, "invalid_payload: a JSON object is required")
    if not standard and (not isinstance(message, dict) or not isinstance(message.get("text"), str)):
        raise ApiError(400, "invalid_payload: a JSON object with a text is required")
    if key:
        existing = WebhookDelivery.objects.using(DB).filter(channel=channel, idempotency_key=key)
        if (found := existing.first()) is not None:
            return json_response(200, _delivery_json(found, replayed=True))
    try:
        with transaction.atomic(using=DB):
            delivery = WebhookDelivery.objects.using(DB).create(
                channel=channel,
                idempotency_key=key,
                body=message,
                signature=signature[:500],
                timestamp=timestamp[:20],
                raw_body=body.decode("utf-8", "replace") if standard else "",
                received_at=clock.now(),
            )
    except IntegrityError:
        # The same key posted concurrently: that post delivered it.
        found = WebhookDelivery.objects.using(DB).get(channel=channel, idempotency_key=key)
        return json_response(200, _delivery_json(found, replayed=True))
    return json_response(200, _delivery_json(delivery))


def delivery_for(channel: str, key: str) -> Response:
    found = WebhookDelivery.objects.using(DB).filter(channel=channel, idempotency_key=key).first()
    if found is None:
        raise ApiError(404, f"No delivery with key {key} on this channel.", code="no_delivery")
    return json_response(200, _delivery_json(found))


def delivery_stats() -> dict[str, Any]:
    """Deliveries per channel and per key, from the receiver's own rows."""
    by_key: dict[str, int] = {}
    by_channel: dict[str, int] = {}
    rows = WebhookDelivery.objects.using(DB).values_list("channel", "idempotency_key")
    for channel, key in rows:
        by_channel[channel] = by_channel.get(channel, 0) + 1
        if key:
            by_key[key] = by_key.get(key, 0) + 1
    return {"total": len(rows), "by_channel": by_channel, "by_idempotency_key": by_key}


def recent_deliveries(limit: int = 100) -> list[dict[str, Any]]:
    rows = WebhookDelivery.objects.using(DB).order_by("-received_at", "-id")[:limit]
    return [
        {
            **_delivery_json(row),
            "body": row.body,
            "signature": row.signature,
            "timestamp": row.timestamp,
            "raw_body": row.raw_body,
        }
        for row in rows
    ]
