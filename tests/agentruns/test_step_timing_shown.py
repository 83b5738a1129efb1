"""A step's duration is its call's; what it waited for is shown apart from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentruns.models import Step, StepKind, StepStatus
from agentruns.selectors import step_timing
from agentruns.templatetags.runs import duration

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _effect(**values) -> Step:
    defaults = {
        "kind": StepKind.TOOL,
        "status": StepStatus.SUCCEEDED,
        "is_effect": True,
        "attempts": 1,
        "started_at": _at(0),
        "last_sent_at": _at(0),
        "completed_at": _at(0.4),
        "recovery_log": [{"action": "send", "attempt": 1}],
    }
    return Step(**{**defaults, **values})


def test_a_step_settled_by_one_call_shows_the_call_alone():
    timing = step_timing(_effect(), approved=False)
    assert duration(timing.call_started, timing.call_ended) == "400 ms"
    assert timing.waited_for == ""


def test_an_approved_refund_shows_its_call_and_apart_the_wait_for_approval():
    step = _effect(last_sent_at=_at(95), completed_at=_at(95.3))
    timing = step_timing(step, approved=True)
    assert duration(timing.call_started, timing.call_ended) == "300 ms"
    assert timing.waited_for == "approval"
    assert duration(timing.waited_started, timing.waited_ended) == "1 min 35 s"


def test_a_send_refused_as_busy_and_sent_again_waited_for_retries():
    step = _effect(attempts=3, last_sent_at=_at(12), completed_at=_at(12.5))
    timing = step_timing(step, approved=False)
    assert duration(timing.call_started, timing.call_ended) == "500 ms"
    assert (timing.waited_for, duration(timing.waited_started, timing.waited_ended)) == (
        "retries",
        "12.0 s",
    )


@pytest.mark.parametrize(
    ("action", "waited_for"),
    [("settled", "a person to settle it"), ("lookup", "recovery after an interrupted send")],
)
def test_an_outcome_not_answered_by_the_send_has_no_call_time(action, waited_for):
    step = _effect(completed_at=_at(600), recovery_log=[{"action": "send"}, {"action": action}])
    timing = step_timing(step, approved=False)
    assert timing.call_started is None
    assert timing.waited_for == waited_for
    assert duration(timing.waited_started, timing.waited_ended) == "10 min 0 s"


def test_a_retried_read_shows_its_attempts_as_one_span_and_says_so():
    step = Step(
        kind=StepKind.MODEL,
        status=StepStatus.SUCCEEDED,
        attempts=3,
        started_at=_at(0),
        completed_at=_at(31),
    )
    timing = step_timing(step, approved=False)
    assert timing.call_started is None
    assert timing.waited_for == "3 attempts and the waits between them"


def test_a_timer_is_a_wait_not_a_call():
    step = Step(
        kind=StepKind.WAIT, status=StepStatus.SUCCEEDED, started_at=_at(0), completed_at=_at(60)
    )
    timing = step_timing(step, approved=False)
    assert timing.call_started is None
    assert (timing.waited_for, duration(timing.waited_started, timing.waited_ended)) == (
        "its timer",
        "1 min 0 s",
    )


def test_an_unfinished_step_has_no_timing():
    assert step_timing(_effect(completed_at=None), approved=False) is None


def test_a_refund_rejected_before_any_send_shows_only_its_wait_for_approval():
    step = _effect(status=StepStatus.FAILED, attempts=0, last_sent_at=None, completed_at=_at(2.6))
    timing = step_timing(step, approved=False, asked=True)
    assert timing.call_started is None
    assert (timing.waited_for, duration(timing.waited_started, timing.waited_ended)) == (
        "approval",
        "2.6 s",
    )
