"""Every run state has words: a label, a group and an explanation (agentruns.states)."""

from __future__ import annotations

import pytest
from django.template import Context, Template

from agentruns.models import RUNNABLE_STATUSES, TERMINAL_STATUSES, RunStatus
from agentruns.states import ENDED, GROUPS, NEEDS_PERSON, STATES, WORKING, state_of, states_of


@pytest.mark.parametrize("status", list(RunStatus), ids=lambda s: s.value)
def test_every_state_has_a_label_a_group_and_an_explanation(status):
    state = STATES.get(status.value)
    assert state is not None, f"{status.value} has no words in agentruns/states.py"
    assert state.label and "_" not in state.label and state.label[0].isupper()
    assert state.group in GROUPS
    assert state.explanation.endswith(".") and "\n" not in state.explanation


def test_no_two_states_read_the_same_and_nothing_else_has_words():
    assert set(STATES) == set(RunStatus.values)
    assert len({state.label for state in STATES.values()}) == len(STATES)


def test_the_groups_are_the_engines_own_sets():
    """Ended is terminal, working is what a worker may claim, the rest waits for a person."""
    assert {s.value for s in states_of(ENDED)} == {s.value for s in TERMINAL_STATUSES}
    assert {s.value for s in states_of(WORKING)} == {s.value for s in RUNNABLE_STATUSES}
    assert {s.value for s in states_of(NEEDS_PERSON)} == {
        "waiting_for_approval",
        "effect_unknown_reconciliation_required",
        "blocked",
    }


def test_the_operators_words_for_the_long_names():
    assert state_of("effect_unknown_reconciliation_required").label == (
        "Outcome unknown — needs reconciliation"
    )
    assert state_of("partially_completed_compensation_running").label == "Compensating"
    assert state_of("cancelled_after_irreversible_effect").label == (
        "Cancelled after an irreversible effect"
    )
    assert state_of("waiting_for_approval").label == "Waiting for approval"


def test_a_name_this_deployment_does_not_know_is_shown_as_it_is():
    assert state_of("paused_by_the_future").label == "paused_by_the_future"


def test_the_badge_keeps_the_raw_name_in_its_class_and_explains_itself():
    html = Template("{% load runs %}{% run_state status %}").render(Context({"status": "blocked"}))
    explanation = STATES["blocked"].explanation
    assert html == (
        f'<span class="state state-blocked" title="{explanation}">Blocked'
        f'<span class="visually-hidden">: {explanation}</span></span>'
    )
