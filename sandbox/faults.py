"""Armed faults: each matching request consumes one, oldest first.

Kinds:
- ``delay``: sleep ``delay`` seconds, then proceed (on POST after the idempotency claim,
  so a concurrent request with the same key sees it in flight);
- ``error_before``: 500 ``api_error`` before execution, nothing saved under the key;
- ``error_after``: execute and commit, then answer 500 and save that 500 under the key;
- ``drop_after_commit``: execute and commit, then close the socket without a reply;
- ``rate_limit``: 429 before execution with ``Retry-After``, nothing saved;
- ``refuse``: takes effect when armed, not per request: the listening socket closes for
  ``delay`` seconds, so connections are refused, then reopens.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F

from sandbox.models import DB, Fault
from sandbox.responses import ApiError


def arm(spec: dict[str, Any]) -> Fault:
    kind = spec.get("kind")
    if kind not in Fault.Kind.values:
        raise ApiError(400, f"kind must be one of {', '.join(Fault.Kind.values)}", param="kind")
    try:
        count = int(spec.get("count", 1))
        delay = float(spec.get("delay", 0))
        retry_after = int(spec.get("retry_after", 1))
    except (TypeError, ValueError) as exc:
        raise ApiError(400, f"count, delay and retry_after must be numbers: {exc}") from exc
    if count < 1 or delay < 0 or retry_after < 0:
        raise ApiError(400, "count must be ≥ 1, delay and retry_after ≥ 0")
    return Fault.objects.using(DB).create(
        kind=kind,
        method=str(spec.get("method", "")).upper(),
        path_prefix=str(spec.get("path", "/")) or "/",
        # A refusal acts once, when armed; it is never matched against requests.
        remaining=0 if kind == Fault.Kind.REFUSE else count,
        delay_seconds=delay,
        retry_after=retry_after,
    )


def take(method: str, path: str) -> Fault | None:
    """Consume one armed fault matching this request, if any."""
    with transaction.atomic(using=DB):
        armed = (
            Fault.objects.using(DB)
            .filter(remaining__gt=0)
            .exclude(kind=Fault.Kind.REFUSE)
            .order_by("created", "id")
        )
        for fault in armed:
            if fault.method and fault.method != method:
                continue
            if not path.startswith(fault.path_prefix):
                continue
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
        "path": fault.path_prefix,
        "remaining": fault.remaining,
        "delay": fault.delay_seconds,
        "retry_after": fault.retry_after,
    }


def armed() -> list[dict[str, Any]]:
    faults = Fault.objects.using(DB).filter(remaining__gt=0).order_by("created", "id")
    return [fault_json(fault) for fault in faults]


def clear() -> int:
    return Fault.objects.using(DB).all().delete()[0]
