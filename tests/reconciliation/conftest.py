from __future__ import annotations

import pytest

from tests.harness import ORDER, ReconciliationWorld, point_at_sandbox, refund_harness


@pytest.fixture
def world(sandbox, settings, tenant) -> ReconciliationWorld:
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return ReconciliationWorld(harness, sandbox, order, settings)


@pytest.fixture
def reconciler(tenant, make_operator):
    return make_operator(tenant, "reconciler", username="rita")
