"""The provider's request log: what each account asked ``/v1`` and ``/shop``, and the answer.

Tests read it (``GET /_sandbox/requests``) to prove that no provider call was made, so
the server records a request before its reply leaves: a client that got an answer always
finds its row. 401s (no account), 404s, faults and dropped replies are recorded too.

The table stays bounded: every ``PRUNE_EVERY``-th row deletes those older than the newest
``KEEP``, one range delete on the primary key instead of a count on every request.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sandbox.models import DB, ProviderRequest

KEEP = 10_000
PRUNE_EVERY = 500
# What GET /_sandbox/requests answers at most: the newest matching rows.
LIST_LIMIT = 1_000


def record(
    *,
    account: str,
    method: str,
    path: str,
    status: int | None,
    fault: str,
    received_at: datetime,
) -> ProviderRequest:
    row = ProviderRequest.objects.using(DB).create(
        account=account,
        method=method,
        path=path,
        status=status,
        fault=fault,
        received_at=received_at,
    )
    if row.pk % PRUNE_EVERY == 0:
        ProviderRequest.objects.using(DB).filter(pk__lte=row.pk - KEEP).delete()
    return row


def request_json(row: ProviderRequest) -> dict[str, Any]:
    return {
        "id": row.pk,
        "account": row.account,
        "method": row.method,
        "path": row.path,
        "status": row.status,
        # Blank when no fault was armed for it.
        "fault": row.fault,
        "received_at": row.received_at.isoformat(),
    }


def recent(*, account: str | None) -> list[dict[str, Any]]:
    """The newest ``LIST_LIMIT`` requests of ``account`` (None: of all), oldest first."""
    rows = ProviderRequest.objects.using(DB)
    if account is not None:
        rows = rows.filter(account=account)
    newest = list(rows.order_by("-id")[:LIST_LIMIT])
    return [request_json(row) for row in reversed(newest)]
