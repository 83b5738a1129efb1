"""The sandbox's clock: wall time plus an offset the test endpoint ``/_sandbox/clock`` moves.

Idempotency keys expire after ``SANDBOX_IDEMPOTENCY_TTL_SECONDS``; moving this clock lets
a test see a key pruned without waiting a day. Every timestamp the sandbox stores comes
from here, so ages are always measured on one clock.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from django.utils import timezone

_lock = threading.Lock()
_offset = timedelta()


def now() -> datetime:
    with _lock:
        return timezone.now() + _offset


def advance(seconds: float) -> datetime:
    global _offset
    with _lock:
        _offset += timedelta(seconds=seconds)
    return now()


def reset() -> None:
    global _offset
    with _lock:
        _offset = timedelta()
