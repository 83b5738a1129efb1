from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Group

from agentruns.models import Run
from approvals.models import Approval, ApprovalAuthority
from notifications.agents import notify, notify_digest
from tests.harness import ORDER, OVER_LIMIT, Harness, point_at_sandbox, refund_harness


@dataclass
class World:
    harness: Harness
    sandbox: object
    tenant: object

    def pending_approval(self, amount: int = OVER_LIMIT, order_id: str = ORDER) -> Approval:
        """A refund waiting for approval, asked for by the user ``requester``."""
        run = self.harness.start(
            "refund_support",
            {"order_id": order_id, "amount": amount},
            requested_by="user:requester",
        )
        assert self.harness.advance(run) == "suspended:waiting_for_approval"
        return Approval.objects.get(run=run, status="pending")

    def notify_runs(self) -> list[Run]:
        return list(Run.objects.filter(agent_name__in=["notify", "notify_digest"]).order_by("id"))

    def drive_notifications(self) -> list[Run]:
        runs = self.notify_runs()
        for run in runs:
            self.harness.drive(run)
        return [Run.objects.get(pk=run.pk) for run in runs]

    def messages(self) -> list[dict]:
        return self.sandbox.get("/_sandbox/messages").json()["messages"]

    def recipients(self) -> list[str]:
        return sorted(address for m in self.messages() for address in m["rcpt_tos"])

    def deliveries(self) -> list[dict]:
        return self.sandbox.get("/_sandbox/webhooks").json()["deliveries"]


@pytest.fixture
def world(sandbox, settings, tenant) -> World:
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant, notify, notify_digest)
    return World(harness, sandbox, tenant)


def _role(name: str, like: str = "approver") -> Group:
    """A role with the permissions of ``like`` (so its authority can differ)."""
    group, _ = Group.objects.get_or_create(name=name)
    group.permissions.set(Group.objects.get(name=like).permissions.all())
    return group


@pytest.fixture
def people(tenant, other_tenant, make_operator):
    """Who may decide a 60.00 EUR refund of ``tenant`` and who may not, each with an address."""
    made = {}

    def operator(name, tenant, *groups, email=True):
        user = make_operator(tenant, *groups, username=name)
        if email:
            user.email = f"{name}@ops.example"
            user.save(update_fields=["email"])
        made[name] = user
        return user

    # The approver role (ann's) may approve up to 500.00 EUR here and in the other tenant.
    operator("ann", tenant, "approver")
    operator("reconciler-rita", tenant, "reconciler")
    operator("viewer-vic", tenant, "viewer")
    operator("requester", tenant, "approver")
    gone = operator("gone-gus", tenant, "approver")
    gone.is_active = False
    gone.save(update_fields=["is_active"])
    operator("no-address-nina", tenant, "approver", email=False)
    for currency_role, currency, limit in (("usd-only", "usd", None), ("small", "eur", 1000)):
        user = operator(f"{currency_role}-sam", tenant)
        group = _role(currency_role)
        user.groups.add(group)
        ApprovalAuthority.objects.create(
            tenant=tenant, group=group, currency=currency, max_amount=limit
        )
    operator("other-otto", other_tenant, "approver")
    approver = Group.objects.get(name="approver")
    for each in (tenant, other_tenant):
        ApprovalAuthority.objects.update_or_create(
            tenant=each, group=approver, currency="eur", defaults={"max_amount": 50_000}
        )
    return made
