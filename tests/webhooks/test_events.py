"""Where events are raised: once per fact, for the endpoints that take it, never lost
to a hook that did not run (the sweeper's repair), never for another tenant."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentruns.models import Run
from approvals.models import Approval, ApprovalAuthority
from approvals.services import approval_decide
from reconciliation.models import ReconciliationCase
from reconciliation.services import case_lookup_now
from tests.harness import OVER_LIMIT
from webhooks.models import EventType, WebhookDelivery, WebhookEndpoint, WebhookEvent
from webhooks.services import (
    deliveries_unstarted,
    event_raise,
    events_missed,
    run_ended_hook,
    run_fact,
)

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

EVERYTHING = tuple(EventType.values)


def _events(type_=None) -> list[WebhookEvent]:
    events = WebhookEvent.objects.order_by("created_at")
    return list(events.filter(type=type_) if type_ else events)


def test_a_run_that_ends_raises_one_event_with_one_delivery_per_endpoint(world):
    first, _ = world.endpoint("first")
    second, _ = world.endpoint("second")
    world.endpoint("approvals-only", events=[EventType.APPROVAL_REQUESTED])
    run = world.refund_ended()
    [event] = _events()
    assert (event.type, event.object_id, event.topic) == (
        "run.ended",
        str(run.pk),
        f"run:{run.pk}:ended",
    )
    deliveries = WebhookDelivery.objects.filter(event=event)
    assert {d.endpoint_id for d in deliveries} == {first.pk, second.pk}
    # Each carried by one delivery run, started after the commit.
    assert all(d.run_id for d in deliveries)
    world.deliver_all()
    assert sorted(d["channel"] for d in world.received()) == ["first", "second"]
    # The delivery runs' own ends announce nothing (or each would start another).
    assert len(_events()) == 1


def test_a_repeated_hook_or_repair_raises_nothing_twice(world):
    world.endpoint()
    run = world.refund_ended()
    run_ended_hook(run.pk)
    run_ended_hook(run.pk)
    assert events_missed() == 0
    assert deliveries_unstarted() == 0
    assert WebhookEvent.objects.count() == 1
    assert WebhookDelivery.objects.count() == 1
    assert Run.objects.filter(agent_name="webhook_deliver").count() == 1


def test_the_sweeper_raises_the_event_a_dead_process_never_raised(world):
    world.endpoint()
    # A worker that died between the run's terminal commit and the hook.
    world.harness.engine = world.harness.build()
    run = world.refund_ended()
    assert WebhookEvent.objects.count() == 0
    assert events_missed() == 1
    [event] = _events()
    assert event.object_id == str(run.pk)
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.run_id is not None
    world.deliver_all()
    assert len(world.received()) == 1
    assert events_missed() == 0


def test_the_sweeper_starts_a_delivery_whose_run_never_started(world):
    endpoint, _ = world.endpoint()
    world.harness.engine = world.harness.build()
    run = world.refund_ended()
    # The event and its delivery committed; the process died before the commit hook.
    event = WebhookEvent.objects.create(
        tenant=world.tenant,
        type=EventType.RUN_ENDED,
        topic=f"run:{run.pk}:ended",
        object_id=str(run.pk),
        payload={"type": "run.ended"},
    )
    delivery = WebhookDelivery.objects.create(tenant=world.tenant, event=event, endpoint=endpoint)
    assert deliveries_unstarted() == 1
    delivery.refresh_from_db()
    assert delivery.run.request_id == f"webhook:{delivery.pk}"
    assert deliveries_unstarted() == 0


def test_an_endpoint_is_sent_nothing_that_happened_before_it_was_made(world):
    world.harness.engine = world.harness.build()
    run = world.refund_ended()
    endpoint, _ = world.endpoint()
    assert events_missed() == 0
    assert event_raise(run_fact(run)) is None
    # What happens after it was made is sent.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    assert events_missed() == 1


def test_the_hook_of_a_tenant_without_an_active_endpoint_is_one_read(world, other_tenant):
    """Most tenants have no endpoint: the hook reads neither the run nor the endpoints
    apart, and a disabled endpoint or another tenant's counts for nothing."""
    world.endpoint("theirs", tenant=other_tenant)
    mine, _ = world.endpoint()
    WebhookEndpoint.objects.filter(pk=mine.pk).update(is_active=False)
    run = world.refund_ended()
    with CaptureQueriesContext(connection) as queries:
        run_ended_hook(run.pk)
    assert len(queries) == 1
    assert WebhookEvent.objects.count() == 0


def test_another_tenants_endpoints_get_none_of_this_tenants_events(world, other_tenant):
    make = world.endpoint
    theirs, _ = make("theirs", EVERYTHING, tenant=other_tenant)
    world.refund_ended()
    assert WebhookEvent.objects.count() == 0
    assert events_missed() == 0
    assert not WebhookDelivery.objects.filter(endpoint=theirs).exists()


def test_approvals_requested_and_decided_raise_their_events(world, make_operator):
    world.endpoint("approvals", [EventType.APPROVAL_REQUESTED, EventType.APPROVAL_DECIDED])
    ann = make_operator(world.tenant, "approver", username="ann")
    from django.contrib.auth.models import Group

    ApprovalAuthority.objects.create(
        tenant=world.tenant, group=Group.objects.get(name="approver"), currency="eur"
    )
    run = world.harness.start(
        "refund_support", {"order_id": "ord_1001", "amount": OVER_LIMIT}, requested_by="user:bo"
    )
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = Approval.objects.get(run=run)
    [requested] = _events()
    assert requested.type == "approval.requested"
    assert requested.payload["data"] == {
        "object": "approval",
        "id": str(approval.pk),
        "status": "pending",
        "run_id": str(run.pk),
        "tool": "issue_refund",
        "url": f"http://127.0.0.1:8000/api/v1/approvals/{approval.pk}",
    }
    approval_decide(
        approval=approval, user=ann, decision="approve", seen_args_hash=approval.args_hash
    )
    decided = _events("approval.decided")
    assert [e.payload["data"]["status"] for e in decided] == ["approved"]
    # Asked again by the step after a crash: nothing new.
    from webhooks.services import approval_decided_hook, approval_requested_hook

    approval.refresh_from_db()
    approval_requested_hook(approval)
    approval_decided_hook(approval)
    assert WebhookEvent.objects.count() == 2
    assert WebhookDelivery.objects.count() == 2


def test_a_case_opened_and_resolved_raises_its_events(world):
    world.endpoint("cases", [EventType.CASE_OPENED, EventType.CASE_RESOLVED])
    world.sandbox.arm("error_before", count=10)
    world.sandbox.arm("error_before", path="/v1/refunds", method="GET", count=50)
    run = world.harness.start("refund_support", {"order_id": "ord_1001", "amount": 700})
    for _ in range(30):
        run.refresh_from_db()
        if run.status in ("waiting_for_retry", "sleeping"):
            world.harness.backdate_sends(run, 120)
            world.harness.make_due(run)
        elif run.status not in ("queued", "running"):
            break
        world.harness.advance(run)
    assert run.status == "effect_unknown_reconciliation_required"
    assert world.sandbox.delete("/_sandbox/faults").status_code == 200
    case = ReconciliationCase.objects.get(run=run)
    [opened] = _events()
    assert (opened.type, opened.topic) == ("case.opened", f"case:{case.pk}:opened:0")
    assert opened.payload["data"]["status"] == "open"
    assert opened.payload["data"]["url"].endswith(f"/api/v1/cases/{case.pk}")
    # A conclusive lookup finds nothing: the case settles itself (send it again).
    case_lookup_now(case=case, actor="user:rita")
    case.refresh_from_db()
    assert case.status == "resolved"
    [resolved] = _events("case.resolved")
    assert resolved.payload["data"]["status"] == "resolved"
    assert resolved.payload["data"]["resolution"] == "retry"
    assert events_missed() == 0


def test_the_sweeper_duty_repairs_at_most_once_per_interval(world, monkeypatch):
    from webhooks import services

    world.endpoint()
    world.harness.engine = world.harness.build()
    first = world.refund_ended()
    clock = [1_000.0]
    monkeypatch.setattr(services.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(services, "_last_repair", 0.0)
    services.webhooks_duty(None)
    assert [e.object_id for e in _events()] == [str(first.pk)]
    # Another fact missed its hook: not looked for again within the interval.
    second = world.refund_ended()
    clock[0] += services.REPAIR_INTERVAL_SECONDS - 1
    services.webhooks_duty(None)
    assert len(_events()) == 1
    clock[0] += 1
    services.webhooks_duty(None)
    assert {e.object_id for e in _events()} == {str(first.pk), str(second.pk)}
    assert all(d.run_id for d in WebhookDelivery.objects.all())
