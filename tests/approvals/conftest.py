from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group

from approvals.models import Approval, ApprovalAuthority
from tests.harness import ORDER, OVER_LIMIT, Harness, point_at_sandbox, refund_harness


@dataclass
class World:
    harness: Harness
    sandbox: object
    order: dict
    tenant: object

    def refunds(self) -> dict:
        return self.sandbox.stats()["refunds"]["by_payment_intent"].get(
            self.order["payment_intent"], {"count": 0, "amount": 0}
        )

    def start_refund(self, amount: int = OVER_LIMIT, **kwargs):
        return self.harness.start("refund_support", {"order_id": ORDER, "amount": amount}, **kwargs)

    def waiting_approval(self, run) -> Approval:
        return Approval.objects.get(run=run, status="pending")


@pytest.fixture
def world(sandbox, settings, tenant) -> World:
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return World(harness, sandbox, order, tenant)


@pytest.fixture
def approver(tenant, make_operator):
    """An approver of the tenant whose role may approve up to 500.00 EUR."""
    user = make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.update_or_create(
        tenant=tenant,
        group=Group.objects.get(name="approver"),
        currency="eur",
        defaults={"max_amount": 50_000},
    )
    return user


@pytest.fixture
def pending(world):
    """A refund of 60.00 EUR waiting for approval, asked for by someone else."""
    run = world.start_refund(requested_by="user:requester")
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    return world.waiting_approval(run)


@pytest.fixture
def ann(client, approver):
    """The approver, logged in."""
    client.force_login(approver)
    return client
