from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agentruns.models import Run
from agentruns.runtime import Engine, EngineSettings, start_run
from tests.agentruns.runtime import agents


class Harness:
    """Drives the engine in-process, the way a worker and a sweeper would."""

    def __init__(self, tenant, **settings):
        self.tenant = tenant
        self.enqueued: list = []
        self.registry = agents.registry()
        self.settings = EngineSettings(**{"lease_seconds": 30.0, **settings})
        self.engine = self.build()

    def build(self, **overrides) -> Engine:
        from approvals.gate import DatabaseApprovalGate
        from reconciliation.desk import DatabaseDesk

        return Engine(
            registry=overrides.pop("registry", self.registry),
            settings=overrides.pop("settings", self.settings),
            enqueue=self.enqueued.append,
            approvals=overrides.pop("approvals", DatabaseApprovalGate()),
            desk=overrides.pop("desk", DatabaseDesk()),
            **overrides,
        )

    def start(self, agent_name: str, input: dict | None = None, **kwargs) -> Run:
        # The tenant's own settings for the agent, as agentruns.services.run_start does.
        self.tenant.refresh_from_db()
        kwargs.setdefault("config_overrides", (self.tenant.agent_config or {}).get(agent_name))
        run, _ = start_run(
            registry=self.registry,
            tenant=self.tenant,
            agent_name=agent_name,
            input=input or {},
            enqueue=self.enqueued.append,
            **kwargs,
        )
        return run

    def advance(self, run: Run, engine: Engine | None = None) -> str:
        return (engine or self.engine).advance(run.id)

    def interrupt(self, run: Run, point: str, step_name: str) -> None:
        """Advance the run in a worker that dies at ``point`` of ``step_name``; then
        let its lease lapse, as if the process had been killed there."""
        engine = self.build()

        def die() -> None:
            raise SystemExit(f"worker killed at {point}@{step_name}")

        engine.faults.arm(point, die, step_name=step_name)
        with pytest.raises(SystemExit):
            engine.advance(run.id)
        self.expire_lease(run)

    def make_due(self, run: Run) -> None:
        """As if the run's wake time had come (the database clock cannot be moved)."""
        now = timezone.now()
        Run.objects.filter(pk=run.id).update(
            next_attempt_at=now - timedelta(seconds=1),
            enqueued_at=now - timedelta(seconds=30),
        )

    def expire_lease(self, run: Run) -> None:
        """As if the lease holder had vanished long enough ago for its lease to lapse."""
        Run.objects.filter(pk=run.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    def backdate_sends(self, run: Run, seconds: float) -> None:
        from agentruns.models import Step

        for step in Step.objects.filter(run=run, first_sent_at__isnull=False):
            step.first_sent_at -= timedelta(seconds=seconds)
            step.last_sent_at -= timedelta(seconds=seconds)
            step.save(update_fields=["first_sent_at", "last_sent_at"])

    def drive(self, run: Run, *, max_rounds: int = 20) -> Run:
        """Advance until the run stops needing a worker, making waits due at once."""
        for _ in range(max_rounds):
            run.refresh_from_db()
            if run.status in ("waiting_for_retry", "sleeping"):
                self.make_due(run)
            elif run.status not in ("queued", "running"):
                return run
            self.advance(run)
        run.refresh_from_db()
        return run


@pytest.fixture(autouse=True)
def reset_provider():
    agents.PROVIDER.reset()
    yield
    agents.PROVIDER.reset()


@pytest.fixture
def harness(tenant) -> Harness:
    return Harness(tenant)


@pytest.fixture
def provider():
    return agents.PROVIDER
