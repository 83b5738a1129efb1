from __future__ import annotations

from dataclasses import dataclass

import pytest

from agentruns.models import Run, Step
from reconciliation.models import ReconciliationCase
from reconciliation.services import case_resolve, newest_lookup
from tests.agentruns.conftest import Harness
from tests.support.world import point_at_sandbox, refund_harness

ORDER = "ord_1001"
AMOUNT = 700  # under the auto-approval amount: no approval in the way


@dataclass
class World:
    harness: Harness
    sandbox: object
    order: dict
    settings: object

    def refunds(self) -> dict:
        return self.sandbox.stats()["refunds"]["by_payment_intent"].get(
            self.order["payment_intent"], {"count": 0, "amount": 0}
        )

    def listed_refunds(self) -> list:
        page = self.sandbox.client().v1.refunds.list(
            params={"payment_intent": self.order["payment_intent"], "limit": 100}
        )
        return list(page.data)

    def start(self, amount: int = AMOUNT, **extra):
        return self.harness.start("refund_support", {"order_id": ORDER, "amount": amount, **extra})

    def clear_faults(self) -> None:
        assert self.sandbox.delete("/_sandbox/faults").status_code == 200

    def lookups_unavailable(self) -> None:
        """The payments provider's listing of refunds answers 500 before doing anything."""
        self.sandbox.arm("error_before", path="/v1/refunds", method="GET", count=50)

    def until_unknown(self, run) -> Run:
        """Advance, making every wait due at once (sends backdated so absence could be
        judged), until the run needs a person or ends."""
        for _ in range(30):
            run.refresh_from_db()
            if run.status in ("waiting_for_retry", "sleeping"):
                self.harness.backdate_sends(run, 120)
                self.harness.make_due(run)
            elif run.status not in ("queued", "running"):
                return run
            self.harness.advance(run)
        run.refresh_from_db()
        return run

    def case_of(self, run, tool: str = "issue_refund") -> ReconciliationCase:
        step = Step.objects.get(run=run, name=tool)
        return ReconciliationCase.objects.get(step_id=step.pk)


def resolve_as_seen(case, user, resolution, note="checked"):
    """Resolve the case the way an operator who just loaded it does: naming the
    version and the newest observation on the page."""
    case.refresh_from_db()
    newest = newest_lookup(case)
    return case_resolve(
        case=case,
        user=user,
        resolution=resolution,
        seen_version=case.version,
        seen_lookup_id=newest.pk if newest else None,
        note=note,
    )


@pytest.fixture
def world(sandbox, settings, tenant) -> World:
    point_at_sandbox(settings, sandbox)
    harness = refund_harness(tenant)
    order = sandbox.get(f"/shop/orders/{ORDER}").json()
    return World(harness, sandbox, order, settings)


@pytest.fixture
def reconciler(tenant, make_operator):
    return make_operator(tenant, "reconciler", username="rita")
