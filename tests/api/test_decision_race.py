"""A decision through the API racing one through the inbox: exactly one counts."""

from __future__ import annotations

import json
import threading

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client

from accounts.models import ApiToken, AuditEntry
from approvals.models import Approval, ApprovalAuthority
from tests.approvals.conftest import World
from tests.harness import ORDER, point_at_sandbox, refund_harness

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture
def world(sandbox, settings, tenant) -> World:
    point_at_sandbox(settings, sandbox)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return World(refund_harness(tenant), sandbox, order, tenant)


# Rejecting reads nothing first, approving reads the resource from its provider: both
# at once is the tightest race, the others race a provider read.
@pytest.mark.parametrize(
    ("by_api", "by_inbox"), [("reject", "reject"), ("approve", "reject"), ("reject", "approve")]
)
def test_the_api_and_the_inbox_at_once_yield_one_decision(
    world, tenant, make_operator, by_api, by_inbox
):
    ann = make_operator(tenant, "approver", username="ann")
    bea = make_operator(tenant, "approver", username="bea")
    ApprovalAuthority.objects.update_or_create(
        tenant=tenant,
        group=Group.objects.get(name="approver"),
        currency="eur",
        defaults={"max_amount": 50_000},
    )
    secret = ApiToken.issue(owner=ann, name="chat")[1]
    run = world.start_refund(requested_by="user:requester")
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    barrier = threading.Barrier(2)
    answers: dict[str, tuple[int, str]] = {}

    def through_the_api() -> None:
        try:
            client = Client()
            body = {"decision": by_api, "args_hash": approval.args_hash, "note": "by ann"}
            barrier.wait(timeout=10)
            response = client.post(
                f"/api/v1/approvals/{approval.pk}/decision",
                data=json.dumps(body),
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Bearer {secret}",
            )
            answers["api"] = (response.status_code, response.content.decode())
        finally:
            connection.close()

    def through_the_inbox() -> None:
        try:
            client = Client()
            client.force_login(bea)
            form = {"decision": by_inbox, "args_hash": approval.args_hash, "note": "by bea"}
            barrier.wait(timeout=10)
            response = client.post(f"/approvals/{approval.pk}/decide", form)
            answers["inbox"] = (response.status_code, response.content.decode())
        finally:
            connection.close()

    threads = [threading.Thread(target=through_the_api), threading.Thread(target=through_the_inbox)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert sorted(answers) == ["api", "inbox"], answers
    decided = Approval.objects.get(pk=approval.pk)
    assert decided.status in ("approved", "rejected")
    # The winner's answer is a success; the loser's a 409 naming the winner.
    already = f"{decided.decided_by_name} already {decided.status} it"
    if decided.decided_by_name == "user:ann":
        assert decided.status == {"approve": "approved", "reject": "rejected"}[by_api]
        assert answers["api"][0] == 200
        assert answers["inbox"][0] == 409
        assert already in answers["inbox"][1]
    else:
        assert decided.decided_by_name == "user:bea"
        assert decided.status == {"approve": "approved", "reject": "rejected"}[by_inbox]
        assert answers["inbox"][0] == 302
        assert answers["api"][0] == 409
        assert json.loads(answers["api"][1])["error"] == f"not decided: {already}"
    decisions = AuditEntry.objects.filter(action__in=["approval.approve", "approval.reject"])
    assert decisions.count() == 1
    assert decisions.get().actor == decided.decided_by_name
