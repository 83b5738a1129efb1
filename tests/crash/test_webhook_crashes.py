"""A webhook delivery's worker SIGKILLed mid-attempt: one delivery per webhook-id,
counted in the receiver's own records.

A refund run ends; the engine's ending path raises its ``run.ended`` event and starts
the delivery run, which the same armed cluster takes and posts to the tenant's
endpoint (the sandbox's receiver, which deduplicates by ``webhook-id``). The cluster
kills its whole group right after the receiver answered. A clean cluster and the
sweeper take over: the step is resent under the same ``webhook-id``, and the receiver
holds one delivery of that id.
"""

from __future__ import annotations

import uuid

import pytest

from tests.crash.harness import RefundWorld
from tests.harness import ORDER
from webhooks.signing import secret_new

pytestmark = pytest.mark.crash


def _make_endpoint(refunds: RefundWorld, url: str) -> None:
    """The tenant's endpoint, made a minute before the run, written as an outside
    observer writes (raw SQL): no process of the test's own starts for it."""
    made = (
        "statement_timestamp() - interval '1 minute'"
        if refunds.world.db.is_postgres
        else "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 minute')"
    )
    [made_row] = refunds.world.db.query(
        "INSERT INTO webhooks_webhookendpoint (tenant_id, url, description, events, is_active, "
        "secret, previous_secret, created_at, created_by) "
        "SELECT id, %s, 'crash receiver', '[\"run.ended\"]', TRUE, %s, '', "
        f"{made}, 'user:crash' FROM accounts_tenant WHERE slug = 'default' RETURNING id",
        (url, secret_new()),
    )
    assert made_row["id"]


def _delivery_run(refunds: RefundWorld) -> str | None:
    rows = refunds.world.db.query(
        "SELECT id FROM agentruns_run WHERE agent_name = %s", ("webhook_deliver",)
    )
    return str(uuid.UUID(str(rows[0]["id"]))) if rows else None


def _message_id(refunds: RefundWorld) -> str:
    [row] = refunds.world.db.query("SELECT message_id FROM webhooks_webhookdelivery")
    return row["message_id"]


def test_a_worker_killed_mid_delivery_leaves_one_delivery_per_webhook_id(refunds: RefundWorld):
    refunds.world.env["HOLDFAST_AGENT_MODULES"] = "support.agents,webhooks.agents"
    # The sandbox's receiver listens on 127.0.0.1.
    refunds.world.env["HOLDFAST_WEBHOOK_ALLOW_PRIVATE"] = "true"
    _make_endpoint(refunds, f"{refunds.sandbox.url}/hooks/crash-hooks")

    # Killed after the receiver took it, before the step recorded the answer: the
    # window a resend must not deliver twice (the other points: tests/webhooks).
    refund_run = refunds.kill_cluster_at("after_call_returned@deliver_webhook", ORDER)
    assert refunds.world.db.run(refund_run)["status"] == "completed", refunds.explain()
    delivery_run = _delivery_run(refunds)
    assert delivery_run is not None, refunds.explain()
    refunds.run_ids.append(delivery_run)
    assert refunds.stats()["webhooks"]["total"] == 1, refunds.explain()
    assert refunds.tool_steps(delivery_run)["deliver_webhook"]["status"] == "running"

    refunds.restart()
    refunds.wait_for_status(delivery_run, "completed")

    step = refunds.tool_steps(delivery_run)["deliver_webhook"]
    assert step["status"] == "succeeded", refunds.explain()
    message_id = _message_id(refunds)
    webhooks = refunds.stats()["webhooks"]
    assert webhooks["total"] == 1, refunds.explain()
    assert webhooks["by_idempotency_key"] == {message_id: 1}, refunds.explain()
    [received] = refunds.sandbox.get("/_sandbox/webhooks").json()["deliveries"]
    assert received["channel"] == "crash-hooks"
    assert received["body"]["type"] == "run.ended"
    assert received["body"]["data"]["id"] == refund_run
    [row] = refunds.world.db.query("SELECT status FROM webhooks_webhookdelivery")
    assert row["status"] == "delivered", refunds.explain()
