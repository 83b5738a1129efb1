"""A run's ending says what happened: what its agent declared, or a refused effect."""

from __future__ import annotations

import pytest

from agentruns.models import Step, StepKind
from agentruns.runtime import agent
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)


@agent(name="declares", version=1, tools=agents.TOOLS)
def declares(ctx, input):
    charged = ctx.tool("charge", {"order_id": "o-1", "amount": 500})
    ctx.outcome("charged" if charged.ok else "charge_refused", charged.error or "")
    if input.get("sleep"):
        ctx.sleep(input["sleep"])
    return {"ok": charged.ok}


@agent(name="bad_outcome", version=1)
def bad_outcome(ctx, input):
    ctx.outcome("Refund Refused!")
    return {}


@pytest.fixture
def harness(harness):
    harness.registry = agents.registry(declares, bad_outcome)
    harness.engine = harness.build()
    return harness


def test_a_declared_outcome_is_recorded_as_a_step_and_names_the_ending(harness):
    run = harness.start("declares")
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert (run.outcome_code, run.outcome_label) == ("charged", "charged")
    step = Step.objects.get(run=run, kind=StepKind.OUTCOME)
    assert step.step_id == "0001.outcome.charged"
    assert step.result == {"code": "charged", "detail": ""}


def test_replay_keeps_the_declared_outcome_across_a_suspension(harness, provider):
    provider.script["charge"] = ["refuse"]
    run = harness.start("declares", {"sleep": 0.01})
    assert harness.advance(run) == "suspended:sleeping"
    run.refresh_from_db()
    assert run.outcome_code == ""  # not ended yet
    harness.engine.wake_now(run.id, by="test")
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.outcome_code == "charge_refused"
    assert run.outcome_detail  # the refusal, in the provider's words
    assert Step.objects.filter(run=run, kind=StepKind.OUTCOME).count() == 1


def test_a_run_that_completed_with_a_refused_effect_says_so_without_a_declaration(
    harness, provider
):
    provider.script["charge"] = ["refuse"]
    run = harness.start("flow")
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert (run.status, run.outcome_label) == ("completed", "charge refused")


def test_a_run_whose_effects_went_through_needs_no_word_beside_completed(harness):
    run = harness.start("flow")
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.outcome_code == ""


def test_an_outcome_that_is_not_a_code_is_the_agents_mistake(harness):
    run = harness.start("bad_outcome")
    assert harness.advance(run) == "finished:failed_before_effect"
    run.refresh_from_db()
    assert "is not an outcome code" in run.outcome_detail
