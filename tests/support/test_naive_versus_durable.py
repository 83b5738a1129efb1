"""The experiment the product grew from: the same three-step refund flow, failing at step 3.

Retried naively from the top, it refunds twice in the provider's own records. Run on
Holdfast with the same failure, it refunds exactly once and completes.
"""

from __future__ import annotations

import pytest

from agentruns.runtime import faults
from tests.harness import point_at_sandbox, refund_harness

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = "ord_1002"


class ReplyFailed(Exception):
    pass


def naive_flow(sandbox, *, fail_at_step_3: bool) -> str:
    """Look up the order, refund it, write the reply: one function, no recorded steps."""
    order = sandbox.order(ORDER)
    # The SDK makes up a fresh idempotency key for every call, as an application
    # without a stable operation id would.
    refund = sandbox.client().v1.refunds.create(
        params={"payment_intent": order["payment_intent"], "amount": 500}
    )
    if fail_at_step_3:
        raise ReplyFailed("the reply could not be generated")
    return refund.id


def _refunds(sandbox) -> int:
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    intent = sandbox.stats()["refunds"]["by_payment_intent"].get(order["payment_intent"])
    return intent["count"] if intent else 0


def test_retrying_the_whole_flow_refunds_twice(sandbox):
    for attempt in range(2):
        try:
            naive_flow(sandbox, fail_at_step_3=attempt == 0)
            break
        except ReplyFailed:
            continue
    assert _refunds(sandbox) == 2


def test_the_same_failure_on_holdfast_refunds_once_and_completes(sandbox, settings, tenant):
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant)
    run = harness.start("refund_support", {"order_id": ORDER, "amount": 500})
    # The worker dies right after the refund, before the reply is written.
    harness.interrupt(run, faults.AFTER_RESULT_RECORDED, "issue_refund")
    assert _refunds(sandbox) == 1
    assert harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    assert run.output["reply"].startswith("Refunded 5.00 EUR")
    assert _refunds(sandbox) == 1
