"""Budgets end runs with the reason; they limit forward steps only."""

from __future__ import annotations

import pytest

from agentruns.runtime import Budget, Registry, agent
from tests.agentruns.runtime import agents

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_over_its_step_budget_ends_with_the_reason(harness, provider):
    @agent(name="greedy", version=1, tools=agents.TOOLS, budget=Budget(max_steps=3))
    def greedy(ctx, input):
        for i in range(10):
            ctx.tool("lookup_order", {"order_id": f"o-{i}"})

    harness.registry = Registry([greedy])
    harness.engine = harness.build()
    run = harness.start("greedy")
    assert harness.advance(run) == "finished:failed_before_effect"
    run.refresh_from_db()
    assert run.outcome_detail == "budget exhausted: max_steps (3)"
    assert run.steps.count() == 3
    assert provider.calls["lookup_order"] == 3


def test_a_run_over_its_model_call_budget_ends(harness):
    run = harness.start("support", {"scenario": "looping"})
    result = harness.advance(run)
    run.refresh_from_db()
    assert result == "finished:failed_before_effect"
    # looping scenario spends 2,000 tokens per call against a 10,000 token budget
    assert run.outcome_detail == "budget exhausted: max_tokens (10000)"
    assert run.model_calls_used == 5
    assert run.tokens_used == 10_000


def test_a_run_over_its_cost_budget_ends(harness):
    @agent(
        name="spender",
        version=1,
        tools=agents.TOOLS,
        model=agents.support.model,
        scenarios=agents.support.scenarios,
        budget=Budget(max_cost=agents.Decimal("0.0005")),
    )
    def spender(ctx, input):
        return agents.support.fn(ctx, input)

    harness.registry = Registry([spender])
    harness.engine = harness.build()
    run = harness.start("spender", {"scenario": "looping"})
    harness.advance(run)
    run.refresh_from_db()
    assert run.outcome_detail.startswith("budget exhausted: max_cost")
    assert run.cost_micros >= 500


def test_budgets_never_stop_the_recovery_of_an_unsettled_effect(harness, provider):
    @agent(name="tight", version=1, tools=agents.TOOLS, budget=Budget(max_steps=2))
    def tight(ctx, input):
        ctx.tool("lookup_order", {"order_id": "o-1"})
        ctx.tool("charge", {"order_id": "o-1", "amount": 5})
        ctx.tool("lookup_order", {"order_id": "o-2"})

    harness.registry = Registry([tight])
    harness.engine = harness.build()
    provider.script["charge"] = ["fail_after"]
    run = harness.start("tight")
    assert harness.advance(run) == "suspended:waiting_for_retry"
    harness.make_due(run)
    # The budget is spent, yet the unknown charge is settled first; then the run
    # fails, and compensation (not limited by the budget either) undoes the charge.
    assert harness.advance(run) == "finished:compensated"
    run.refresh_from_db()
    assert run.outcome_detail == "budget exhausted: max_steps (2)"
    assert run.steps.get(name="charge").status == "succeeded"
    assert run.steps.get(kind="compensation").status == "succeeded"
    assert provider.effect_count() == 1
    assert provider.calls["refund_charge"] == 1
