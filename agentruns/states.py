"""Run states as an operator reads them: grouped, in words, each with a line saying what it means.

The one place a state's label, group and explanation are written. URLs (``?state=``),
the API and the database keep the raw names (``RunStatus`` values); pages show these.
Every ``RunStatus`` has an entry (tests/agentruns/test_states.py).
"""

from __future__ import annotations

from typing import NamedTuple

from agentruns.models import RunStatus


class StateGroup(NamedTuple):
    slug: str  # what ?group= carries
    label: str


NEEDS_PERSON = StateGroup("needs_person", "Needs a person")
WORKING = StateGroup("working", "Working")
ENDED = StateGroup("ended", "Ended")
# In the order the run list shows them: what waits for someone first.
GROUPS = (NEEDS_PERSON, WORKING, ENDED)


class RunState(NamedTuple):
    value: str
    label: str
    group: StateGroup
    explanation: str


_STATES = [
    RunState(
        RunStatus.WAITING_FOR_APPROVAL,
        "Waiting for approval",
        NEEDS_PERSON,
        "An effect waits for a person to approve or reject it; nothing is sent until then.",
    ),
    RunState(
        RunStatus.EFFECT_UNKNOWN,
        "Outcome unknown — needs reconciliation",
        NEEDS_PERSON,
        "Whether an effect happened is unknown; a reconciler finds out before the run goes on.",
    ),
    RunState(
        RunStatus.BLOCKED,
        "Blocked",
        NEEDS_PERSON,
        "The run cannot go on by itself (its code changed, its version is gone, or it kept "
        "crashing); a person cancels it.",
    ),
    RunState(RunStatus.QUEUED, "Queued", WORKING, "Waiting for a worker to take it."),
    RunState(RunStatus.RUNNING, "Running", WORKING, "A worker holds the run and takes its steps."),
    RunState(
        RunStatus.SLEEPING,
        "Sleeping",
        WORKING,
        "Waiting on its own timer; it wakes by itself at its next attempt time.",
    ),
    RunState(
        RunStatus.WAITING_FOR_RETRY,
        "Waiting for retry",
        WORKING,
        "A call failed in a way another try may cure, or a send must have landed first; "
        "it tries again at its next attempt time.",
    ),
    RunState(
        RunStatus.COMPENSATING,
        "Compensating",
        WORKING,
        "The run failed after effects and is undoing them, newest first.",
    ),
    RunState(
        RunStatus.COMPLETED,
        "Completed",
        ENDED,
        "The agent finished; every effect it made is settled.",
    ),
    RunState(
        RunStatus.FAILED_BEFORE_EFFECT,
        "Failed before any effect",
        ENDED,
        "The run failed and nothing it did changed the world.",
    ),
    RunState(
        RunStatus.FAILED_AFTER_EFFECT,
        "Failed after an effect",
        ENDED,
        "The run failed after an effect that nothing undid; that effect remains.",
    ),
    RunState(
        RunStatus.COMPENSATED,
        "Compensated",
        ENDED,
        "The run failed and every effect it made was undone.",
    ),
    RunState(
        RunStatus.CANCELLED_NO_EFFECT,
        "Cancelled with no effect",
        ENDED,
        "Cancelled before anything it did changed the world.",
    ),
    RunState(
        RunStatus.CANCELLED_AFTER_EFFECT,
        "Cancelled after an irreversible effect",
        ENDED,
        "Cancelled after an effect that cannot be undone; that effect remains.",
    ),
]
STATES: dict[str, RunState] = {state.value: state for state in _STATES}


def state_of(value: str) -> RunState:
    """The state named ``value``; a name this deployment does not know is shown as it is."""
    known = STATES.get(value)
    if known is not None:
        return known
    return RunState(value, value, WORKING, "")


def states_of(group: StateGroup) -> list[RunState]:
    return [state for state in _STATES if state.group == group]


def group_named(slug: str) -> StateGroup | None:
    return next((group for group in GROUPS if group.slug == slug), None)
