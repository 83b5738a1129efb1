"""A run started through the API is requested by the token's owner, who cannot approve it."""

from __future__ import annotations

import json

import pytest

from accounts.models import ApiToken
from agentruns.models import Run
from approvals.services import DecisionRefused, approval_decide
from tests.harness import ORDER, OVER_LIMIT

# A decision wakes the run through the task queue (its own database on SQLite).
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def ann(approver, make_operator, tenant):
    """An approver who may also start runs, holding a token of her own."""
    from django.contrib.auth.models import Group

    make_operator(tenant, "operator", username="groups-maker")  # the operator group
    approver.groups.add(Group.objects.get(name="operator"))
    return approver


def _start_through_the_api(client, secret) -> Run:
    response = client.post(
        "/api/runs",
        data=json.dumps(
            {
                "agent": "refund_support",
                "input": {"order_id": ORDER, "amount": OVER_LIMIT},
                "request_id": "ticket-1",
            }
        ),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )
    assert response.status_code == 201, response.content
    return Run.objects.get(pk=response.json()["id"])


def test_the_owner_of_the_token_cannot_approve_the_refund_it_started(client, world, ann):
    _, secret = ApiToken.issue(owner=ann, name="helpdesk")
    run = _start_through_the_api(client, secret)
    assert run.requested_by == "user:ann"
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval = world.waiting_approval(run)
    assert approval.requested_by == "user:ann"

    with pytest.raises(DecisionRefused, match="you asked for this action"):
        approval_decide(
            approval=approval, user=ann, decision="approve", seen_args_hash=approval.args_hash
        )
    client.force_login(ann)
    response = client.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "approve", "note": "", "args_hash": approval.args_hash},
    )
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == "pending"
    assert world.refunds()["count"] == 0


def test_another_approver_can_approve_the_run_a_token_started(
    client, world, ann, tenant, make_operator
):
    _, secret = ApiToken.issue(owner=ann, name="helpdesk")
    run = _start_through_the_api(client, secret)
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    bob = make_operator(tenant, "approver", username="bob")
    decided = approval_decide(
        approval=approval, user=bob, decision="approve", seen_args_hash=approval.args_hash
    )
    assert decided.status == "approved" and decided.decided_by_name == "user:bob"
