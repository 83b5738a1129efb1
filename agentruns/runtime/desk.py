"""Where unknown effects go: the reconciliation desk the engine reports them to.

The engine knows only that an effect step ended ``unknown`` and why; the
reconciliation app (``reconciliation.desk``) opens exactly one case per such step
for an operator. Settling a case comes back through ``Engine.settle_unknown``,
the same fenced transitions as everything else.
"""

from __future__ import annotations

from typing import Protocol


class ReconciliationDesk(Protocol):
    def open_case(self, run_id: str, step_pk: int, reason: str) -> None:
        """Open the step's case, or reopen it; idempotent."""


class NoDesk:
    """No reconciliation app: the run still waits in its state, visible on its page."""

    def open_case(self, run_id: str, step_pk: int, reason: str) -> None:
        return None
