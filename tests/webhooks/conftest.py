from __future__ import annotations

from dataclasses import dataclass

import pytest

from agentruns.models import Run
from tests.harness import AMOUNT, ORDER, Harness, point_at_sandbox, refund_harness
from webhooks.agents import WEBHOOK_DELIVER, webhook_deliver
from webhooks.models import EventType, WebhookDelivery, WebhookEndpoint
from webhooks.services import endpoint_create, run_ended_hook


@dataclass
class World:
    """The refund agent and the delivery agent in-process, the sandbox as receiver."""

    harness: Harness
    sandbox: object
    tenant: object
    admin: object

    def endpoint(
        self, channel: str = "acme", events=(EventType.RUN_ENDED,), *, tenant=None, url=None
    ) -> tuple[WebhookEndpoint, str]:
        return endpoint_create(
            tenant=tenant or self.tenant,
            url=url or f"{self.sandbox.url}/hooks/{channel}",
            description=f"{channel} receiver",
            events=list(events),
            user=self.admin,
        )

    def refund_ended(self, amount: int = AMOUNT, **kwargs) -> Run:
        """A refund run driven to its end (under the auto-approval amount)."""
        run = self.harness.start("refund_support", {"order_id": ORDER, "amount": amount}, **kwargs)
        run = self.harness.drive(run)
        assert run.is_terminal, run.status
        return run

    def delivery_runs(self) -> list[Run]:
        return list(Run.objects.filter(agent_name=WEBHOOK_DELIVER).order_by("created_at", "id"))

    def deliver_all(self) -> list[Run]:
        return [self.harness.drive(run) for run in self.delivery_runs()]

    def received(self) -> list[dict]:
        return self.sandbox.get("/_sandbox/webhooks").json()["deliveries"]

    def only_delivery(self) -> WebhookDelivery:
        [delivery] = WebhookDelivery.objects.select_related("event", "endpoint", "run")
        return delivery


@pytest.fixture
def world(sandbox, settings, tenant, make_operator) -> World:
    point_at_sandbox(settings, sandbox)
    # The sandbox's receiver listens on 127.0.0.1.
    settings.HOLDFAST_WEBHOOK_ALLOW_PRIVATE = True
    harness = refund_harness(tenant, webhook_deliver)
    # The engine's ending path tells webhooks, as config/wiring.py installs it.
    harness.engine = harness.build(ended=run_ended_hook)
    return World(harness, sandbox, tenant, make_operator(tenant, "admin", username="ada"))
