"""A tenant's chat webhook gets one Slack-compatible message per event, crash or not."""

from __future__ import annotations

import pytest

from accounts.provider_accounts import provider_account_set
from agentruns.models import Step

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hook(world, settings):
    settings.HOLDFAST_WEBHOOK_URL = f"{world.sandbox.url}/hooks/T0-ops"


def test_the_webhook_body_is_slack_compatible_and_keyed(world, people, hook):
    approval = world.pending_approval()
    [run] = world.drive_notifications()
    assert run.status == "completed", run.outcome_detail

    [delivery] = world.deliveries()
    step = Step.objects.get(run=run, name="post_webhook")
    assert delivery["channel"] == "T0-ops"
    assert delivery["idempotency_key"] == step.effect_key
    body = delivery["body"]
    link = f"http://127.0.0.1:8000/approvals/{approval.pk}/"
    assert body["text"] == f"Approval needed: issue_refund, 60.00 EUR: {link}"
    assert [block["type"] for block in body["blocks"]] == ["header", "section", "actions"]
    assert (
        "Action: issue_refund: Refund 60.00 EUR of order ord_1001"
        in (body["blocks"][1]["text"]["text"])
    )
    [button] = body["blocks"][2]["elements"]
    assert button["url"] == link
    assert delivery["signature"] == ""


def test_a_worker_killed_after_the_post_leaves_one_delivery(world, people, hook):
    world.pending_approval()
    [run] = world.notify_runs()
    world.harness.interrupt(run, "after_call_returned", "post_webhook")
    assert len(world.deliveries()) == 1
    world.harness.drive(run)
    run.refresh_from_db()
    assert run.status == "completed", run.outcome_detail
    assert world.sandbox.stats()["webhooks"]["total"] == 1


def test_another_tenants_webhook_is_signed_with_its_own_secret(
    world, people, other_tenant, monkeypatch
):
    from notifications.agents import notify
    from notifications.services import approval_notify
    from tests.harness import Harness

    monkeypatch.setenv("HOLDFAST_SECRET_OTHER_HOOK", "s3cret-signing")
    provider_account_set(
        tenant=other_tenant,
        provider="webhook",
        endpoint=f"{world.sandbox.url}/hooks/other",
        secret_ref="env:HOLDFAST_SECRET_OTHER_HOOK",
        sender="",
        actor="user:admin",
    )
    # The default tenant has none: its approval posts nothing.
    approval = world.pending_approval()
    world.drive_notifications()
    assert world.deliveries() == []
    # The other tenant's approval of the same kind posts to its own hook, signed.
    type(approval).objects.filter(pk=approval.pk).update(tenant=other_tenant)
    from agentruns.models import Run

    Run.objects.filter(pk=approval.run_id).update(tenant=other_tenant)
    approval.refresh_from_db()
    Run.objects.filter(agent_name="notify").delete()
    approval_notify(approval)
    harness = Harness(other_tenant)
    harness.registry.register(notify)
    harness.engine = harness.build()
    [run] = Run.objects.filter(agent_name="notify")
    harness.drive(run)
    [delivery] = world.deliveries()
    assert delivery["channel"] == "other"
    assert delivery["signature"].startswith("sha256=")
    assert "s3cret" not in str(delivery["body"])
