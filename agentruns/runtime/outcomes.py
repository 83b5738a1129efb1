"""What came back from a provider, and what a finished run says about the world.

``classify`` is the one table every tool call goes through (DESIGN §7);
``derive_terminal_state`` is the one place a run's end state is decided from
its effect steps (DESIGN §5).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from agentruns.models import RunStatus, StepStatus
from agentruns.runtime.tools import ProviderBusy, ToolRefused


class Verdict(Enum):
    SUCCEEDED = "succeeded"  # the provider said yes
    REFUSED = "refused"  # a definite no: nothing happened
    BUSY = "busy"  # 409 in use / 429: resend the same request later
    AMBIGUOUS = "ambiguous"  # may have taken effect: settle before going on


@dataclass(frozen=True)
class Classified:
    verdict: Verdict
    error_class: str = ""
    message: str = ""
    retry_after: float | None = None


def classify(error: BaseException | None) -> Classified:
    """Map one attempt's ending to a verdict. ``None`` means the call returned normally."""
    if error is None:
        return Classified(Verdict.SUCCEEDED)
    if isinstance(error, ToolRefused):
        return Classified(Verdict.REFUSED, error.error_class, str(error))
    if isinstance(error, ProviderBusy):
        return Classified(Verdict.BUSY, error.error_class, str(error), error.retry_after)
    # A 5xx, a timeout, a dropped connection, a bug in the adapter: the request
    # may have reached the provider and taken effect. Never "failed".
    return Classified(Verdict.AMBIGUOUS, _error_class(error), f"{type(error).__name__}: {error}")


def _error_class(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "timeout"
    if isinstance(error, ConnectionError):
        return "connection"
    return getattr(error, "error_class", None) or "unexpected"


class Ending(Enum):
    COMPLETED = "completed"  # the agent returned
    FAILED = "failed"  # the agent raised, a budget ran out, a model refused for good
    CANCELLED = "cancelled"  # an operator cancelled


@dataclass(frozen=True)
class EffectFact:
    status: str  # a StepStatus value
    compensated: bool = False


class NotSettled(Exception):
    """A run with an effect still running or unknown cannot end."""


def derive_terminal_state(ending: Ending, effects: Iterable[EffectFact]) -> RunStatus:
    effects = list(effects)
    unsettled = [e for e in effects if e.status in (StepStatus.RUNNING, StepStatus.UNKNOWN)]
    if unsettled:
        raise NotSettled(f"{len(unsettled)} effect step(s) are still running or unknown")
    happened = [e for e in effects if e.status == StepStatus.SUCCEEDED]
    remaining = [e for e in happened if not e.compensated]
    if ending is Ending.COMPLETED:
        return RunStatus.COMPLETED
    if ending is Ending.CANCELLED:
        return RunStatus.CANCELLED_AFTER_EFFECT if remaining else RunStatus.CANCELLED_NO_EFFECT
    if not happened:
        return RunStatus.FAILED_BEFORE_EFFECT
    return RunStatus.FAILED_AFTER_EFFECT if remaining else RunStatus.COMPENSATED
