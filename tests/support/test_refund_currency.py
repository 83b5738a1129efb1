"""A refund in another currency than its payment's is refused before anything is sent,
with or without an approval in the way."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from agentruns.models import Step, StepStatus
from agentruns.runtime import agent
from support.tools import issue_refund
from tests.harness import point_at_sandbox, refund_harness

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = "ord_1001"


class _Asked(BaseModel):
    payment_intent: str
    amount: int
    currency: str


@agent(
    name="small_refund",
    version=1,
    tools=[issue_refund],
    input_model=_Asked,
    # Small refunds go without a person: nothing reads the payment before the send.
    config={"approvals": {"enabled": False}},
)
def small_refund(ctx, input):
    result = ctx.tool("issue_refund", {"order_id": ORDER, **input})
    return {"status": result.status, "error": result.error, "class": result.error_class}


@pytest.fixture
def world(sandbox, settings, tenant):
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant, small_refund)
    order = sandbox.order(ORDER)
    return harness, sandbox, order


def test_a_refund_in_another_currency_is_refused_and_nothing_reaches_the_provider(world):
    harness, sandbox, order = world
    run = harness.start(
        "small_refund",
        {"payment_intent": order["payment_intent"], "amount": 1500, "currency": "jpy"},
    )
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.output == {
        "status": "failed",
        "error": "not sent: the payment is in EUR, not JPY",
        "class": "currency_mismatch",
    }
    step = Step.objects.get(run=run, name="issue_refund")
    assert step.status == StepStatus.FAILED
    stats = sandbox.stats()
    assert stats["refunds"]["total"] == 0
    assert stats["idempotency_records"] == 0  # no refund request ever arrived
    assert run.outcome_code == "issue_refund_refused"


def test_a_refund_in_the_payments_currency_goes_through_once(world):
    harness, sandbox, order = world
    run = harness.start(
        "small_refund",
        {"payment_intent": order["payment_intent"], "amount": 1500, "currency": "eur"},
    )
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.output["status"] == "succeeded"
    assert sandbox.stats()["refunds"]["by_payment_intent"][order["payment_intent"]] == {
        "count": 1,
        "amount": 1500,
    }
