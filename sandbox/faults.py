"""Armed faults: each matching request, or message, consumes one, oldest first.

HTTP kinds, matched by method and path prefix:
- ``delay``: sleep ``delay`` seconds, then proceed (on POST after the idempotency claim,
  so a concurrent request with the same key sees it in flight);
- ``error_before``: 500 ``api_error`` before execution, nothing saved under the key;
- ``error_after``: execute and commit, then answer 500 and save that 500 under the key;
- ``drop_after_commit``: execute and commit, then close the socket without a reply;
- ``rate_limit``: 429 before execution with ``Retry-After``, nothing saved;
- ``refuse``: takes effect when armed, not per request: the listening socket closes for
  ``delay`` seconds, so connections are refused, then reopens.

SMTP kinds, one per message the sink is sent (taken at its ``MAIL FROM``):
- ``smtp_drop_after_accept``: store the message, then close the connection before the
  250: the sender cannot know it was sent;
- ``smtp_refuse``: answer every ``RCPT TO`` with ``code`` (550 by default, or another
  4xx or 5xx), so nothing is stored; smtplib raises ``SMTPRecipientsRefused``, which the
  support agent's mail tool reads as a definite refusal;
- ``smtp_delay``: store the message, then wait ``delay`` seconds before the 250 (a
  sender whose timeout is shorter gives up on a message that was sent).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F

from sandbox.models import DB, Fault
from sandbox.responses import ApiError

SMTP_KINDS = (
    Fault.Kind.SMTP_DROP_AFTER_ACCEPT,
    Fault.Kind.SMTP_REFUSE,
    Fault.Kind.SMTP_DELAY,
)
# A mailbox that does not exist: the refusal every sender treats as final.
DEFAULT_SMTP_CODE = 550


def arm(spec: dict[str, Any]) -> Fault:
    kind = spec.get("kind")
    if kind not in Fault.Kind.values:
        raise ApiError(400, f"kind must be one of {', '.join(Fault.Kind.values)}", param="kind")
    try:
        count = int(spec.get("count", 1))
        delay = float(spec.get("delay", 0))
        retry_after = int(spec.get("retry_after", 1))
        code = int(spec.get("code", DEFAULT_SMTP_CODE))
    except (TypeError, ValueError) as exc:
        raise ApiError(400, f"count, delay, retry_after and code must be numbers: {exc}") from exc
    if count < 1 or delay < 0 or retry_after < 0:
        raise ApiError(400, "count must be ≥ 1, delay and retry_after ≥ 0")
    if not 400 <= code <= 599:
        raise ApiError(400, "code must be an SMTP reply from 400 to 599", param="code")
    smtp = kind in SMTP_KINDS
    return Fault.objects.using(DB).create(
        kind=kind,
        # An SMTP fault is matched against messages, never against HTTP requests.
        method="" if smtp else str(spec.get("method", "")).upper(),
        path_prefix="" if smtp else str(spec.get("path", "/")) or "/",
        # A refusal acts once, when armed; it is never matched against requests.
        remaining=0 if kind == Fault.Kind.REFUSE else count,
        delay_seconds=delay,
        retry_after=retry_after,
        smtp_code=code if kind == Fault.Kind.SMTP_REFUSE else None,
    )


def take(method: str, path: str) -> Fault | None:
    """Consume one armed HTTP fault matching this request, if any."""
    with transaction.atomic(using=DB):
        armed = (
            Fault.objects.using(DB)
            .filter(remaining__gt=0)
            .exclude(kind__in=[Fault.Kind.REFUSE, *SMTP_KINDS])
            .order_by("created", "id")
        )
        matching = (
            fault
            for fault in armed
            if (not fault.method or fault.method == method) and path.startswith(fault.path_prefix)
        )
        return _take_first(matching)


def take_for_message() -> Fault | None:
    """Consume the oldest armed SMTP fault, if any: one per message the sink is sent."""
    with transaction.atomic(using=DB):
        armed = (
            Fault.objects.using(DB)
            .filter(remaining__gt=0, kind__in=SMTP_KINDS)
            .order_by("created", "id")
        )
        return _take_first(armed)


def _take_first(candidates: Iterable[Fault]) -> Fault | None:
    for fault in candidates:
        # Conditional decrement: two concurrent requests cannot both take the last one.
        taken = (
            Fault.objects.using(DB)
            .filter(pk=fault.pk, remaining__gt=0)
            .update(remaining=F("remaining") - 1)
        )
        if taken:
            return fault
    return None


def fault_json(fault: Fault) -> dict[str, Any]:
    return {
        "id": fault.pk,
        "kind": fault.kind,
        "method": fault.method or None,
        "path": fault.path_prefix or None,
        "remaining": fault.remaining,
        "delay": fault.delay_seconds,
        "retry_after": fault.retry_after,
        "code": fault.smtp_code,
    }


def armed() -> list[dict[str, Any]]:
    faults = Fault.objects.using(DB).filter(remaining__gt=0).order_by("created", "id")
    return [fault_json(fault) for fault in faults]


def clear() -> int:
    return Fault.objects.using(DB).all().delete()[0]
