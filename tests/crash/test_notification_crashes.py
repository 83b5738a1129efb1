"""A notify run's worker SIGKILLed mid-delivery of its webhook: one delivery, by the receiver.

A refund above the auto-approval amount waits for approval; the gate's hook starts
the notify run, which the same armed cluster takes and posts to the default tenant's
webhook (the sandbox's receiver). The cluster dies right after the receiver
answered, before the step's result is recorded. A clean cluster and the sweeper
take over: the step is settled by the receiver's lookup by key (or a resend the
receiver deduplicates by ``Idempotency-Key``), and the receiver holds one delivery.
"""

from __future__ import annotations

import pytest

from tests.crash.harness import RefundWorld
from tests.harness import ORDER, OVER_LIMIT

pytestmark = pytest.mark.crash


def _notify_run(refunds: RefundWorld) -> str | None:
    rows = refunds.world.db.query("SELECT id FROM agentruns_run WHERE agent_name = %s", ("notify",))
    return str(rows[0]["id"]) if rows else None


def _canonical(run_id: str) -> str:
    import uuid

    return str(uuid.UUID(run_id))


def test_a_worker_killed_mid_delivery_leaves_one_webhook_delivery(refunds: RefundWorld):
    refunds.world.env.update(
        {
            "HOLDFAST_AGENT_MODULES": "support.agents,notifications.agents",
            "HOLDFAST_WEBHOOK_URL": f"{refunds.sandbox.url}/hooks/crash-ops",
        }
    )
    refund_run = refunds.kill_cluster_at(
        "after_call_returned@post_webhook", ORDER, amount=OVER_LIMIT
    )
    assert refunds.world.db.run(refund_run)["status"] == "waiting_for_approval", refunds.explain()
    notify_run = _notify_run(refunds)
    assert notify_run is not None, refunds.explain()
    notify_run = _canonical(notify_run)
    refunds.run_ids.append(notify_run)
    # It died after the receiver delivered and before the step knew.
    assert refunds.stats()["webhooks"]["total"] == 1, refunds.explain()
    step = refunds.tool_steps(notify_run)["post_webhook"]
    assert step["status"] == "running", refunds.explain()

    refunds.restart()
    refunds.wait_for_status(notify_run, "completed")

    step = refunds.tool_steps(notify_run)["post_webhook"]
    assert step["status"] == "succeeded", refunds.explain()
    webhooks = refunds.stats()["webhooks"]
    assert webhooks["total"] == 1, refunds.explain()
    assert webhooks["by_idempotency_key"] == {step["effect_key"]: 1}, refunds.explain()
    [delivery] = refunds.sandbox.get("/_sandbox/webhooks").json()["deliveries"]
    assert delivery["channel"] == "crash-ops"
    assert "Approval needed: issue_refund" in delivery["body"]["text"]
