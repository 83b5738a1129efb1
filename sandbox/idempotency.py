"""Stripe API v1 idempotency: save the first outcome per (account, key), replay it after.

- The first request with a key inserts an ``in_flight`` row; the unique (scope, key)
  constraint means two concurrent requests cannot both insert it, so only one executes.
- Anyone else with the key gets 409 ``idempotency_key_in_use`` while it is in flight,
  400 ``idempotency_error`` for another endpoint or other parameters, and afterwards the
  saved status and body verbatim with ``Idempotent-Replayed: true``.
- Validation failures before execution release the row (nothing is saved, retry works).
- The executing request saves its outcome in the same transaction as its effect, so a
  refund never exists without its saved answer, nor the answer without the refund.
- Keys older than ``SANDBOX_IDEMPOTENCY_TTL_SECONDS`` are pruned; reusing one is new.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction

from sandbox import clock
from sandbox.models import DB, IdempotencyRecord
from sandbox.responses import ApiError, Response

MAX_KEY_LENGTH = 255
Fingerprint = list[list[str]]


def scope_for(api_key: str, account: str) -> str:
    return hashlib.sha256(f"{api_key}\0{account}".encode()).hexdigest()


def fingerprint(pairs: list[tuple[str, str]]) -> Fingerprint:
    """Decoded form parameters as a sorted multiset: order on the wire does not matter."""
    return sorted([name, value] for name, value in pairs)


@dataclass
class Claim:
    """Either this request owns the key (``record``) or it gets ``answer`` right away."""

    record: IdempotencyRecord | None = None
    answer: Response | None = None


def _in_use(key: str) -> ApiError:
    return ApiError(
        409,
        "There is currently another in-progress request using this Idempotent Key (that "
        "probably means you submitted twice, and the other request is still going through): "
        f"{key}. Please try again later.",
        code="idempotency_key_in_use",
    )


def replay(record: IdempotencyRecord) -> Response:
    headers = {"Idempotent-Replayed": "true"}
    if record.response_status and record.response_status >= 500:
        # Replaying it again would give the same 500: tell the SDK not to retry.
        headers["Stripe-Should-Retry"] = "false"
    return Response(record.response_status or 500, record.response_body, headers)


def claim(*, scope: str, key: str, method: str, path: str, params: Fingerprint) -> Claim:
    if len(key) > MAX_KEY_LENGTH:
        raise ApiError(
            400,
            f"Idempotency-Key must be at most {MAX_KEY_LENGTH} characters long.",
            param="Idempotency-Key",
        )
    now = clock.now()
    cutoff = now - timedelta(seconds=settings.SANDBOX_IDEMPOTENCY_TTL_SECONDS)
    with transaction.atomic(using=DB):
        IdempotencyRecord.objects.using(DB).filter(created_at__lt=cutoff).delete()
        record = (
            IdempotencyRecord.objects.using(DB)
            .select_for_update()
            .filter(scope=scope, key=key)
            .first()
        )
        if record is None:
            try:
                with transaction.atomic(using=DB):
                    record = IdempotencyRecord.objects.using(DB).create(
                        scope=scope,
                        key=key,
                        method=method,
                        path=path,
                        params_fingerprint=params,
                        created_at=now,
                    )
            except IntegrityError:
                # Another request inserted the key between our read and our insert
                # (PostgreSQL waits on the unique index, then fails here): it executes.
                return Claim(answer=_in_use(key).response())
            return Claim(record=record)
    if record.method != method or record.path != path:
        raise ApiError(
            400,
            "Keys for idempotent requests can only be used for the same endpoint they were "
            f"first used for ('{record.path}' vs '{path}'). Try using a key other than "
            f"'{key}' if you meant to execute a different request.",
            type="idempotency_error",
        )
    if record.params_fingerprint != params:
        raise ApiError(
            400,
            "Keys for idempotent requests can only be used with the same parameters they "
            f"were first used with. Try using a key other than '{key}' if you meant to "
            "execute a different request.",
            type="idempotency_error",
        )
    if record.state == IdempotencyRecord.State.IN_FLIGHT:
        return Claim(answer=_in_use(key).response())
    return Claim(answer=replay(record))


def release(record: IdempotencyRecord) -> None:
    """Forget a claim whose request never began executing (nothing is saved)."""
    IdempotencyRecord.objects.using(DB).filter(
        pk=record.pk, state=IdempotencyRecord.State.IN_FLIGHT
    ).delete()


def save(record: IdempotencyRecord, response: Response) -> None:
    """Save the outcome; call inside the transaction that made the effect."""
    IdempotencyRecord.objects.using(DB).filter(pk=record.pk).update(
        state=IdempotencyRecord.State.DONE,
        response_status=response.status,
        response_body=response.body,
    )


def forget_in_flight() -> int:
    """At startup: no request is executing, so an in-flight key's work never committed.

    A sandbox killed mid-request would otherwise answer 409 for that key until it expired.
    """
    return (
        IdempotencyRecord.objects.using(DB)
        .filter(state=IdempotencyRecord.State.IN_FLIGHT)
        .delete()[0]
    )
