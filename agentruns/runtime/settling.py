"""Settling an ``unknown`` effect step as a person (or a conclusive lookup) found it (DESIGN §9).

The caller's own compare-and-set on its record (the reconciliation case), the
step's ``status = unknown`` check and the run's fence commit together or not at
all, so a late provider answer and a resolution can never both win.
"""

from __future__ import annotations

from contextlib import suppress
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from agentruns.models import RunStatus, Step, StepKind, StepStatus
from agentruns.runtime.control import Finish, LeaseLost
from agentruns.runtime.endings import finish_cancelled, write_end
from agentruns.runtime.outcomes import Ending
from agentruns.runtime.results import json_safe
from agentruns.runtime.writes import NOW, Event, Json, NowPlus, Sql

if TYPE_CHECKING:
    from agentruns.runtime.approval import Guard
    from agentruns.runtime.claim import Claim
    from agentruns.runtime.tools import Tool


class Resolution(StrEnum):
    """What a person found about an unknown effect, and so what the run does next."""

    HAPPENED = "happened"  # the step succeeds with what was observed; the run goes on
    RETRY = "retry"  # it did not happen: back to planned, sent again under the same key
    CANCEL = "cancel"  # it did not happen: the step fails and the run is cancelled
    DIFFERENTLY = "differently"  # it happened otherwise: compensate, or end failed


# A resend's deadline when the tool is no longer deployed (it cannot be sent then anyway).
FALLBACK_RETRY_DEADLINE = 300.0


def settle(
    claim: Claim,
    step_pk: int,
    resolution: Resolution,
    *,
    by: str,
    guard: Guard,
    observed: dict[str, Any] | None,
    reference: str,
    note: str,
) -> str:
    """Settle the step and say what the run did next ("refused" if a guard failed)."""
    step = Step.objects.get(pk=step_pk, run_id=claim.run_id)
    tool = claim.engine.registry.tool_of(claim.run, step.name)
    entry = {"action": "settled", "resolution": resolution.value, "by": by, "note": note[:500]}
    values: dict[str, Any] = {
        "in_flight": False,
        "recovery_log": Json([*(step.recovery_log or []), entry]),
        **_step_values(claim, resolution, tool, by=by, observed=observed, reference=reference),
    }
    reason = f"{step.step_id} settled by {by}: {resolution.value}"
    # The run is marked reconciled in the commit that settles the step and its case.
    run_set = {**_run_values(resolution, step, tool, by=by, reason=reason), "reconciled": True}
    step_guard = claim.store.step_guard(step.pk, values, only_if_status=(StepStatus.UNKNOWN,))
    committed = claim.decide_guarded(
        run_set,
        guards=[guard, step_guard],
        event=Event("effect_settled", step.step_id, {"resolution": resolution.value, "by": by}),
    )
    if committed.guard_failed:
        # Someone else settled it first, or newer evidence arrived: nothing was
        # written. Give the run back as it was. (A refused settle is no crash:
        # its claim does not count toward the crash-loop limit.)
        with suppress(LeaseLost):
            claim.decide(
                {"lease_owner": "", "lease_expires_at": None, "claim_count": Sql("claim_count - 1")}
            )
        return "refused"
    if resolution is Resolution.CANCEL:
        claim.run.cancel_requested_by = by
        return finish_cancelled(claim)
    if run_set.get("status") in (RunStatus.QUEUED, RunStatus.COMPENSATING):
        claim.engine.enqueue(claim.run_id)
        return f"settled:{run_set['status']}"
    # It happened differently and nothing undoes it: what remains true is that
    # an effect happened and the run cannot go on as planned.
    return write_end(claim, Finish(Ending.FAILED, reason))


def _step_values(
    claim: Claim,
    resolution: Resolution,
    tool: Tool | None,
    *,
    by: str,
    observed: dict[str, Any] | None,
    reference: str,
) -> dict[str, Any]:
    if resolution in (Resolution.HAPPENED, Resolution.DIFFERENTLY):
        return {
            "status": StepStatus.SUCCEEDED,
            "completed_at": NOW,
            "provider_reference": reference[:200],
            **claim.result_columns(json_safe(observed or {})),
        }
    if resolution is Resolution.RETRY:
        # Back to planned: the gate checks any approval it needs again before
        # the send, which goes out under the same effect key (DESIGN §8, §9).
        deadline = tool.retry.deadline if tool is not None else FALLBACK_RETRY_DEADLINE
        return {
            "status": StepStatus.PLANNED,
            "resent_after_absence": True,
            # A fresh start for the resend: a 429 on it waits and tries again,
            # it does not count as the earlier sends' ambiguity.
            "ambiguous_attempts": 0,
            "retry_deadline": NowPlus(deadline),
        }
    return {
        "status": StepStatus.FAILED,
        "completed_at": NOW,
        "last_error_class": "did_not_happen",
        "last_error": f"settled by {by}: it did not happen",
    }


def _run_values(
    resolution: Resolution, step: Step, tool: Tool | None, *, by: str, reason: str
) -> dict[str, Any]:
    released = {
        "status": RunStatus.QUEUED,
        "lease_owner": "",
        "lease_expires_at": None,
        "next_attempt_at": None,
        "enqueued_at": NOW,
        "claim_count": 0,
    }
    if resolution in (Resolution.HAPPENED, Resolution.RETRY):
        if step.kind == StepKind.COMPENSATION:
            # An undo settled: the run goes on compensating, not forward.
            return {**released, "status": RunStatus.COMPENSATING}
        return released
    if resolution is Resolution.CANCEL:
        return {"cancel_requested_at": NOW, "cancel_requested_by": by}
    if tool is not None and tool.undo is not None:
        return {**released, "status": RunStatus.COMPENSATING, "outcome_detail": reason}
    return {}
