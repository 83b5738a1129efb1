"""The Standard Webhooks signature (standardwebhooks.com), both sides of it.

Every attempt carries three headers:

- ``webhook-id``: the delivery's message id, the same on every attempt (receivers
  deduplicate by it);
- ``webhook-timestamp``: the attempt's Unix time in seconds (receivers refuse one
  further than ``REPLAY_WINDOW`` from their clock);
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">``,
  keyed with the base64-decoded part of the ``whsec_…`` secret; several signatures,
  space-separated, while a rotated secret's grace period lasts.

``verify`` is what a receiver runs (README "Webhooks" shows it standalone).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

PREFIX = "whsec_"
# How far a receiver lets an attempt's timestamp be from its own clock.
REPLAY_WINDOW_SECONDS = 5 * 60


class SignatureError(Exception):
    """A message that must not be trusted: bad signature, or outside the replay window."""


def secret_new() -> str:
    """A new signing secret: 24 random bytes, base64, after ``whsec_``."""
    return PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(
    signing_secrets: list[str], message_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            signature(secret, message_id, timestamp, body) for secret in signing_secrets
        ),
    }


def verify(secret: str, received: dict[str, str], body: bytes, *, now: float | None = None) -> None:
    """Raise ``SignatureError`` unless ``body`` was signed with ``secret`` within the window."""
    lowered = {name.lower(): value for name, value in received.items()}
    try:
        message_id = lowered["webhook-id"]
        timestamp = int(lowered["webhook-timestamp"])
        offered = lowered["webhook-signature"].split()
    except (KeyError, ValueError) as exc:
        raise SignatureError(f"missing or malformed webhook headers: {exc}") from None
    if abs((time.time() if now is None else now) - timestamp) > REPLAY_WINDOW_SECONDS:
        raise SignatureError("the timestamp is outside the replay window")
    expected = signature(secret, message_id, timestamp, body)
    if not any(hmac.compare_digest(expected, each) for each in offered):
        raise SignatureError("no signature matches")
