"""An approval that waits is told, once, to exactly the operators who may decide it."""

from __future__ import annotations

import pytest

from agentruns.models import Run
from notifications.services import approval_notify, notifications_missed
from tests.harness import ORDER

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_emails_each_operator_who_may_decide_and_nobody_else(world, people):
    approval = world.pending_approval()

    runs = world.notify_runs()
    assert [(r.agent_name, r.request_id) for r in runs] == [
        ("notify", f"notify:approval:{approval.pk}")
    ]
    [run] = world.drive_notifications()
    assert run.status == "completed", run.outcome_detail

    # Not the requester, not a viewer or a reconciler, not a deactivated login, not one
    # without authority in EUR or whose limit is below 60.00 EUR, not another tenant's.
    assert world.recipients() == ["ann@ops.example"]
    [message] = world.messages()
    assert message["subject"] == "Approval needed: issue_refund, 60.00 EUR"
    body = message["body"]
    assert "Action: issue_refund: Refund 60.00 EUR of order ord_1001" in body
    assert "Amount: 60.00 EUR" in body
    assert f"http://127.0.0.1:8000/approvals/{approval.pk}/" in body


def test_a_repeated_hook_or_sweep_sends_nothing_twice(world, people):
    approval = world.pending_approval()
    approval_notify(approval)
    approval_notify(approval)
    assert notifications_missed() == 0
    world.drive_notifications()
    approval_notify(approval)
    world.drive_notifications()

    assert Run.objects.filter(agent_name="notify").count() == 1
    assert world.recipients() == ["ann@ops.example"]


def test_the_sweeper_starts_a_notification_the_hook_missed(world, people, monkeypatch):
    from approvals import gate

    monkeypatch.setattr(gate, "_requested_hooks", ())
    approval = world.pending_approval()
    assert world.notify_runs() == []

    assert notifications_missed() == 1
    assert notifications_missed() == 0
    world.drive_notifications()
    assert [r.request_id for r in world.notify_runs()] == [f"notify:approval:{approval.pk}"]
    assert world.recipients() == ["ann@ops.example"]


def test_an_approval_decided_before_the_run_got_to_it_is_told_to_nobody(world, people):
    approval = world.pending_approval()
    type(approval).objects.filter(pk=approval.pk).update(status="rejected")
    [run] = world.drive_notifications()
    assert run.status == "completed"
    assert run.outcome_code == "nothing_waits"
    assert world.messages() == []


def test_an_address_in_the_action_is_masked_and_nothing_approves_by_itself(world, people):
    approval = world.pending_approval()
    type(approval).objects.filter(pk=approval.pk).update(
        preview=f"Refund 60.00 EUR of order {ORDER} for alice@customer.example"
    )
    world.drive_notifications()
    [message] = world.messages()
    assert "alice@customer.example" not in message["body"]
    assert "••••@customer.example" in message["body"]
    # Only the card's page: no decision endpoint, no token, no hash to post.
    assert "/decide" not in message["body"]
    assert approval.args_hash not in message["body"]
    assert "hft_" not in message["body"] and "token" not in message["body"].lower()


def test_an_operator_who_chose_off_is_not_told(world, people):
    from notifications.models import NotificationPreference

    NotificationPreference.objects.create(user=people["ann"], delivery="off")
    world.pending_approval()
    world.drive_notifications()
    assert world.messages() == []


def test_a_tenant_with_nobody_to_tell_starts_no_run(world, make_operator, tenant):
    make_operator(tenant, "approver", username="no-address")
    approval = world.pending_approval()
    assert notifications_missed() == 0
    approval_notify(approval)
    assert world.notify_runs() == []
