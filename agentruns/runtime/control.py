"""Control flow between the run context and the engine.

These derive from BaseException so that agent code's ``except Exception`` can
never swallow a suspension, a lost lease or a divergence.
"""

from __future__ import annotations

from typing import Any

from agentruns.runtime.outcomes import Ending


class Stop(BaseException):
    """Stop advancing the run now."""


class Suspend(Stop):
    """The run was released to wait: for a time, for a person, or for the queue.

    Raised only after the suspension is committed (with the step that caused it):
    whoever catches it has nothing left to write.
    """

    def __init__(self, status: str, reason: str, *, requeue: bool = False):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        # Enqueue the run again at once (its time slice ended, not its work).
        self.requeue = requeue


class Finish(Stop):
    """The run's forward work is over; the engine derives the terminal state."""

    def __init__(self, ending: Ending, reason: str = "", output: Any = None):
        super().__init__(reason)
        self.ending = ending
        self.reason = reason
        self.output = output


class Blocked(Stop):
    """The code cannot safely continue; an operator must act."""

    def __init__(self, reason: str, detail: dict[str, Any] | None = None):
        super().__init__(reason)
        self.reason = reason
        self.detail = detail or {}


class LeaseLost(Stop):
    """Another worker owns the run now; this one must not write another decision."""


class Abandon(Stop):
    """The engine itself failed (the database is unreachable, say); the lease will expire."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


class Divergence(Blocked):
    """Replay asked for a different step than the one recorded at this position."""


class AgentUsageError(ValueError):
    """Agent code asked for something its declaration does not allow (an undeclared tool)."""
