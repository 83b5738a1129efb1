"""Recorded values: the clock, random numbers, waits and the outcome agent code declares.

Each is a step like any other, so replay returns the same instant, the same
number, the same declared outcome, and a wait that already passed is not waited
again (DESIGN §6.2).
"""

from __future__ import annotations

import random
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agentruns.models import RunStatus, StepKind, StepStatus
from agentruns.runtime import faults as fault_points
from agentruns.runtime.control import AgentUsageError, Suspend
from agentruns.runtime.effects import content_hash
from agentruns.runtime.writes import NOW, Event, StepUpdate

if TYPE_CHECKING:
    from agentruns.runtime.claim import Claim


def clock_step(claim: Claim) -> datetime:
    seq, step_id, recorded = claim.position(StepKind.CLOCK, "now", "")
    if recorded is not None:
        return datetime.fromisoformat(recorded.result["now"])
    claim.boundary(forward=True)
    claim.reach(fault_points.BEFORE_STEP_RECORDED, "now")
    value = claim.store.db_now()
    _record_value(claim, seq, step_id, StepKind.CLOCK, "now", {"now": value.isoformat()})
    return value


def random_step(claim: Claim) -> float:
    seq, step_id, recorded = claim.position(StepKind.RANDOM, "random", "")
    if recorded is not None:
        return float(recorded.result["value"])
    claim.boundary(forward=True)
    claim.reach(fault_points.BEFORE_STEP_RECORDED, "random")
    value = random.random()
    _record_value(claim, seq, step_id, StepKind.RANDOM, "random", {"value": value})
    return value


def _record_value(
    claim: Claim,
    seq: int,
    step_id: str,
    kind: str,
    name: str,
    result: dict[str, Any],
    *,
    input_hash: str = "",
) -> None:
    values = {"status": StepStatus.SUCCEEDED, "completed_at": NOW, **claim.result_columns(result)}
    claim.decide(
        claim.progress(step_id),
        step=claim.step_write(
            None, values, seq=seq, step_id=step_id, kind=kind, name=name, input_hash=input_hash
        ),
        event=Event("step_succeeded", step_id),
    )
    claim.reach(fault_points.AFTER_RESULT_RECORDED, name)


OUTCOME_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def outcome_step(claim: Claim, code: str, detail: str) -> None:
    """Record what the run's end means (``refund_refused``); the last declared one counts."""
    if not OUTCOME_CODE.match(code or ""):
        raise AgentUsageError(
            f"ctx.outcome: {code!r} is not an outcome code (lower-case words joined by _, "
            "at most 64 characters)"
        )
    declared = {"code": code, "detail": detail}
    seq, step_id, recorded = claim.position(StepKind.OUTCOME, code, content_hash(declared))
    if recorded is None:
        claim.boundary(forward=False)
        claim.reach(fault_points.BEFORE_STEP_RECORDED, code)
        _record_value(
            claim, seq, step_id, StepKind.OUTCOME, code, declared, input_hash=content_hash(declared)
        )
    claim.declared_outcome = (code, detail)


def wait_step(claim: Claim, seconds: float) -> None:
    input_hash = content_hash({"seconds": seconds})
    seq, step_id, recorded = claim.position(StepKind.WAIT, "sleep", input_hash)
    if recorded is not None:
        if recorded.status == StepStatus.SUCCEEDED:
            return
        # The run was claimed, so its wake time (next_attempt_at) has come.
        claim.decide(
            claim.progress(step_id, new_step=False),
            step=StepUpdate(recorded.pk, {"status": StepStatus.SUCCEEDED, "completed_at": NOW}),
            event=Event("woke", step_id),
        )
        return
    claim.boundary(forward=True)
    claim.reach(fault_points.BEFORE_STEP_RECORDED, "sleep")
    claim.decide(
        claim.waiting(RunStatus.SLEEPING, seconds, new_step=True, step_id=step_id),
        step=claim.step_write(
            None,
            {"status": StepStatus.RUNNING, "result": {"seconds": seconds}},
            seq=seq,
            step_id=step_id,
            kind=StepKind.WAIT,
            name="sleep",
            input={"seconds": seconds},
            input_hash=input_hash,
        ),
        event=Event("sleeping", step_id, {"seconds": seconds}),
    )
    raise Suspend(RunStatus.SLEEPING, f"sleeping {seconds}s")
