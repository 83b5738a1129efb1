from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from approvals.models import ApprovalAuthority
from reconciliation.services import case_record_lookup
from tests.agentruns.runtime import agents
from tests.evidence.scenarios import approved_refund
from tests.harness import (
    ORDER,
    Harness,
    ReconciliationWorld,
    point_at_sandbox,
    refund_harness,
    resolve_as_seen,
)


@pytest.fixture
def world(sandbox, settings, tenant) -> ReconciliationWorld:
    """The refund agent in-process against the sandbox."""
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return ReconciliationWorld(harness, sandbox, order, settings)


@pytest.fixture
def harness(tenant) -> Harness:
    """The test agents, no provider but the in-process fake."""
    agents.PROVIDER.reset()
    yield Harness(tenant)
    agents.PROVIDER.reset()


@pytest.fixture
def approver(tenant, make_operator):
    """An approver who may approve up to 500.00 EUR."""
    user = make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.update_or_create(
        tenant=tenant,
        group=Group.objects.get(name="approver"),
        currency="eur",
        defaults={"max_amount": 50_000},
    )
    return user


@pytest.fixture
def reconciler(tenant, make_operator):
    return make_operator(tenant, "reconciler", username="rita")


@pytest.fixture
def approved_run(world, approver):
    """A refund of 60.00 EUR, approved by ann with a note, sent and completed."""
    return approved_refund(
        world.harness, approver, note="the customer bob@example.com sent the receipt"
    )


@pytest.fixture
def reconciled_run(world, reconciler):
    """A refund whose answers were lost and whose lookup failed; a reconciler found it
    missing in the provider's dashboard and had it sent again."""
    world.sandbox.arm("error_before", count=10)
    world.lookups_unavailable()
    run = world.until_unknown(world.start())
    assert run.status == "effect_unknown_reconciliation_required"
    world.clear_faults()
    case = world.case_of(run)
    case_record_lookup(
        case=case,
        user=reconciler,
        outcome="not_found",
        note="not in the dashboard; asked carol@example.com",
    )
    resolve_as_seen(case, reconciler, "retry", note="send it")
    assert world.harness.advance(run) == "finished:completed"
    run.refresh_from_db()
    return run
