"""Replay: recorded steps return their results; changed code blocks instead of re-executing."""

from __future__ import annotations

import pytest

from agentruns.models import Run, Step
from agentruns.runtime import Registry, agent, faults
from agentruns.runtime.registry import Agent
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_runs_a_flow_to_completion_recording_every_step(harness, provider):
    run = harness.start("flow", {"order_id": "o-1", "amount": 700})
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.status == "completed"
    assert run.output["charged"] is True
    steps = list(run.steps.order_by("seq"))
    assert [s.step_id for s in steps] == ["0000.tool.lookup_order", "0001.tool.charge"]
    assert [s.status for s in steps] == ["succeeded", "succeeded"]
    assert steps[1].effect_key.startswith("hf_")
    assert steps[1].provider_reference == "ch_1"
    assert steps[1].request == {"order_id": "o-1", "amount": 700}
    assert steps[1].first_sent_at is not None
    assert run.steps_used == 2
    assert run.events.filter(type="finished").exists()


def test_replay_skips_completed_steps(harness, provider):
    """A run that stops after a step (here: a durable sleep) replays it without re-running it."""
    run = harness.start("flow", {"order_id": "o-1", "sleep": 60})
    assert harness.advance(run) == "suspended:sleeping"
    assert provider.calls["lookup_order"] == 1
    harness.make_due(run)
    assert harness.advance(run) == "finished:completed"
    assert provider.calls["lookup_order"] == 1
    assert provider.calls["charge"] == 1
    assert provider.effect_count() == 1


def test_replay_after_a_crash_between_steps_continues_from_the_last_recorded_fact(
    harness, provider
):
    crashed = harness.build()

    def die():
        raise SystemExit("worker killed")

    crashed.faults.arm(faults.AFTER_RESULT_RECORDED, die, step_name="lookup_order")
    run = harness.start("flow", {"order_id": "o-1"})
    with pytest.raises(SystemExit):
        harness.advance(run, crashed)
    assert Run.objects.get(pk=run.id).status == "running"
    harness.expire_lease(run)
    assert harness.advance(run) == "finished:completed"
    assert provider.calls["lookup_order"] == 1
    assert provider.calls["charge"] == 1


def test_the_model_is_never_asked_again_for_a_recorded_answer(harness, provider):
    asked = []

    def scenario(request):
        asked.append(len(request.messages))
        return agents.SUPPORT_SCENARIO[len(asked) - 1] if len(asked) <= 3 else None

    engine = harness.build()
    engine.faults.arm(faults.AFTER_RESULT_RECORDED, _raise_exit, step_name="charge")
    counting = Agent(
        name="support",
        version=1,
        fn=agents.support.fn,
        tools=agents.TOOLS,
        model=agents.support.model,
        scenarios={"refund": scenario},
        budget=agents.support.budget,
    )
    harness.registry = Registry([counting])
    engine = harness.build(faults=engine.faults)
    run = harness.start("support", {"scenario": "refund"})
    with pytest.raises(SystemExit):
        harness.advance(run, engine)
    assert len(asked) == 2
    harness.expire_lease(run)
    assert harness.advance(run, harness.build()) == "finished:completed"
    # Two answers were recorded before the crash; only the third was asked after it.
    assert len(asked) == 3
    assert provider.effect_count() == 1


def _raise_exit():
    raise SystemExit("worker killed")


def test_changed_code_at_a_recorded_position_blocks_the_run(harness, provider):
    run = harness.start("flow", {"order_id": "o-1", "sleep": 30})
    assert harness.advance(run) == "suspended:sleeping"

    @agent(name="flow", version=1, tools=agents.TOOLS, input_model=agents.FlowInput)
    def changed(ctx, input):
        ctx.tool("lookup_order", {"order_id": "o-2"})  # other arguments than recorded
        return {}

    harness.registry = Registry([changed])
    harness.make_due(run)
    assert harness.advance(run, harness.build()) == "blocked"
    run.refresh_from_db()
    assert run.status == "blocked"
    assert "replay diverged at step 0" in run.outcome_detail
    event = run.events.get(type="blocked")
    assert event.payload["detail"]["recorded"]["step_id"] == "0000.tool.lookup_order"
    assert event.payload["detail"]["requested"]["name"] == "lookup_order"
    assert (
        event.payload["detail"]["recorded"]["input_hash"]
        != event.payload["detail"]["requested"]["input_hash"]
    )
    assert provider.calls["lookup_order"] == 1


def test_code_that_asks_for_another_tool_at_a_recorded_position_blocks(harness):
    run = harness.start("flow", {"order_id": "o-1", "sleep": 30})
    harness.advance(run)

    @agent(name="flow", version=1, tools=agents.TOOLS, input_model=agents.FlowInput)
    def reordered(ctx, input):
        ctx.tool("charge", {"order_id": "o-1", "amount": 1})
        return {}

    harness.registry = Registry([reordered])
    harness.make_due(run)
    assert harness.advance(run, harness.build()) == "blocked"
    run.refresh_from_db()
    assert "recorded 0000.tool.lookup_order, code now asks for 0000.tool.charge" in (
        run.outcome_detail
    )
    assert not Step.objects.filter(run=run, name="charge").exists()


def test_a_run_whose_version_is_no_longer_registered_is_blocked(harness, provider):
    run = harness.start("flow", {"order_id": "o-1", "sleep": 30})
    harness.advance(run)
    harness.registry = Registry([agents.mailer])
    harness.make_due(run)
    assert harness.advance(run, harness.build()) == "blocked"
    run.refresh_from_db()
    assert run.status == "blocked"
    assert "'flow' version 1 is not registered" in run.outcome_detail
    assert provider.calls["charge"] == 0


def test_a_newer_version_does_not_take_over_runs_pinned_to_the_old_one(harness, provider):
    run = harness.start("flow", {"order_id": "o-1", "sleep": 30})
    harness.advance(run)

    @agent(name="flow", version=2, tools=agents.TOOLS, input_model=agents.FlowInput)
    def flow_v2(ctx, input):
        raise AssertionError("version 2 must not replay a version 1 run")

    harness.registry = Registry([agents.flow, flow_v2])
    harness.make_due(run)
    assert harness.advance(run, harness.build()) == "finished:completed"
    assert Run.objects.get(pk=run.id).agent_version == 1
    assert harness.start("flow", {"order_id": "o-9"}).agent_version == 2


def test_an_agent_that_ends_early_on_replay_is_a_divergence(harness):
    run = harness.start("flow", {"order_id": "o-1", "sleep": 30})
    harness.advance(run)

    @agent(name="flow", version=1, tools=agents.TOOLS, input_model=agents.FlowInput)
    def shorter(ctx, input):
        return {}

    harness.registry = Registry([shorter])
    harness.make_due(run)
    assert harness.advance(run, harness.build()) == "blocked"


def test_clock_and_random_values_are_recorded_and_replayed(harness):
    run = harness.start("values")
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    recorded = {s.kind: s.result for s in run.steps.all()}
    assert run.output["random"] == recorded["random"]["value"]
    assert run.output["now"] == recorded["clock"]["now"]
