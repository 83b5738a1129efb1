"""The refund agent's Pydantic AI twin, its worker cluster SIGKILLed at each fault point.

As ``test_refund_crashes.py`` does for the native agent: each scenario starts a real
``qcluster`` armed with ``HOLDFAST_FAULTS=<point>@<step>=killgroup`` against the real
sandbox, starts a run of the twin on its own order, and waits for the group to die;
then one clean cluster and the sweeper take over every run. The sandbox's records
count the refunds; the model's own ledger rows count the model's answers.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.crash.harness import AMOUNT, RefundWorld
from tests.crash.pydantic_agents import MODEL
from tests.crash.test_refund_crashes import _assert_exactly_one_refund_recorded_on_the_step

pytestmark = pytest.mark.crash

TWIN = "refund_support_pydantic_ai"

# (fault, order): every point a refund passes, and the model's answer lost or on record.
KILLS = [
    ("before_step_recorded@issue_refund", "ord_1001"),
    ("after_step_running@issue_refund", "ord_1002"),
    ("after_call_returned@issue_refund", "ord_1003"),
    ("after_result_recorded@issue_refund", "ord_1004"),
    ("after_call_returned@chat", "ord_1005"),
    ("after_result_recorded@chat", "ord_1006"),
]


@pytest.fixture
def twin(refunds: RefundWorld) -> RefundWorld:
    refunds.world.env["HOLDFAST_AGENT_MODULES"] = "support.agents,tests.crash.pydantic_agents"
    return refunds


def _answers_by_position(twin: RefundWorld, order_id: str) -> Counter:
    """How many times the model answered each position of this order's conversation."""
    answered = Counter()
    for row in twin.world.ledger.executions(MODEL):
        request = json.loads(row["args"])
        if json.loads(request["prompt"].split("\n", 1)[1])["order_id"] == order_id:
            answered[request["position"]] += 1
    return answered


def test_the_twin_killed_at_each_fault_point_refunds_once_and_asks_no_recorded_step_again(
    twin: RefundWorld,
) -> None:
    killed = []
    for fault, order_id in KILLS:
        order = twin.order(order_id)
        run_id = twin.kill_cluster_at(fault, order_id, agent=TWIN)
        model_steps = [s for s in twin.world.db.steps(run_id) if s["kind"] == "model"]
        killed.append((fault, order, run_id, len(model_steps)))
    twin.restart()
    for fault, order, run_id, recorded_before in killed:
        run = twin.wait_for_status(run_id, "completed")
        explain = f"{fault} on {order['id']}\n{twin.explain()}"
        step = _assert_exactly_one_refund_recorded_on_the_step(twin, run_id, order, fault)
        reply = f"Refunded {AMOUNT / 100:.2f} EUR as {step['provider_reference']}."
        # A JSON string: its text on SQLite, decoded on PostgreSQL.
        assert run["output"] in (reply, json.dumps(reply)), explain
        answered = _answers_by_position(twin, order["id"])
        # Three model steps (ask for the order, the refund, the reply), each answered once:
        # only an answer lost with the worker, never recorded, was asked for again.
        lost = 1 if fault == "after_call_returned@chat" else 0
        assert sorted(answered) == [1, 3, 5], explain
        assert sum(answered.values()) == 3 + lost, explain
        assert answered[1] == 1 + lost, explain
        assert recorded_before <= 3, explain
    assert twin.stats()["refunds"]["total"] == len(KILLS), twin.explain()
