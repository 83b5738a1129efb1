"""Retry policy: bounded exponential backoff with jitter, Retry-After honoured, a deadline."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 6
    initial_delay: float = 1.0
    max_delay: float = 60.0
    multiplier: float = 2.0
    # Seconds from a step's first attempt after which it is not retried again.
    deadline: float = 600.0
    # Ambiguous answers (5xx, timeouts) under the same key resent before the
    # engine turns to a lookup or to an operator.
    max_ambiguous_resends: int = 2

    def delay(self, attempt: int, *, retry_after: float | None = None, rng=random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        Full jitter over the upper half of the exponential step keeps workers
        from retrying in lockstep while never waiting less than half the step;
        a provider's Retry-After is a floor.
        """
        step = min(self.max_delay, self.initial_delay * self.multiplier ** max(0, attempt - 1))
        delay = step / 2 + rng.random() * step / 2
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay
