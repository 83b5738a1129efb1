"""A run's end state is derived from its effect steps, for every combination."""

from __future__ import annotations

import itertools

import pytest

from agentruns.models import RunStatus, StepStatus
from agentruns.runtime import EffectFact, Ending, derive_terminal_state
from agentruns.runtime.outcomes import NotSettled

SETTLED = [
    EffectFact(StepStatus.SUCCEEDED),
    EffectFact(StepStatus.SUCCEEDED, compensated=True),
    EffectFact(StepStatus.FAILED),
    EffectFact(StepStatus.PLANNED),
]


def _expected(ending: Ending, effects: list[EffectFact]) -> RunStatus:
    happened = [e for e in effects if e.status == StepStatus.SUCCEEDED]
    remaining = [e for e in happened if not e.compensated]
    if ending is Ending.COMPLETED:
        return RunStatus.COMPLETED
    if ending is Ending.CANCELLED:
        return RunStatus.CANCELLED_AFTER_EFFECT if remaining else RunStatus.CANCELLED_NO_EFFECT
    if not happened:
        return RunStatus.FAILED_BEFORE_EFFECT
    if remaining:
        return RunStatus.FAILED_AFTER_EFFECT
    return RunStatus.COMPENSATED


@pytest.mark.parametrize("ending", list(Ending))
@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_every_combination_of_settled_effects(ending, count):
    for effects in itertools.product(SETTLED, repeat=count):
        assert derive_terminal_state(ending, list(effects)) == _expected(ending, list(effects))


@pytest.mark.parametrize("ending", list(Ending))
@pytest.mark.parametrize("unsettled", [StepStatus.RUNNING, StepStatus.UNKNOWN])
def test_a_run_with_an_unsettled_effect_never_ends(ending, unsettled):
    for others in itertools.product(SETTLED, repeat=2):
        with pytest.raises(NotSettled):
            derive_terminal_state(ending, [*others, EffectFact(unsettled)])


def test_the_named_outcomes():
    ok, undone, refused = SETTLED[0], SETTLED[1], SETTLED[2]
    assert derive_terminal_state(Ending.FAILED, []) == "failed_before_effect"
    assert derive_terminal_state(Ending.FAILED, [refused]) == "failed_before_effect"
    assert derive_terminal_state(Ending.FAILED, [ok]) == "failed_after_effect"
    assert derive_terminal_state(Ending.FAILED, [undone, undone]) == "compensated"
    assert derive_terminal_state(Ending.FAILED, [undone, ok]) == "failed_after_effect"
    assert derive_terminal_state(Ending.CANCELLED, [refused]) == "cancelled_no_effect"
    assert derive_terminal_state(Ending.CANCELLED, [ok]) == ("cancelled_after_irreversible_effect")
