"""The few named functions the rest of the project uses to drive runs.

Views, commands and the sweeper call these; they never reach into the engine.
"""

from __future__ import annotations

import importlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from accounts.models import DEFAULT_TENANT_SLUG, Tenant
from agentruns import shutdown
from agentruns.broker import announce
from agentruns.doorbell import doorbell_ring
from agentruns.models import Run
from agentruns.runtime import (
    ApprovalGate,
    CredentialSource,
    Engine,
    EngineSettings,
    FaultPoints,
    QueuedTask,
    ReconciliationDesk,
    Registry,
    start_run,
)
from agentruns.sweeper import advance_row, push_advance

log = logging.getLogger("holdfast.services")


@cache
def get_registry() -> Registry:
    """The agents this deployment runs: every ``Agent`` listed in ``AGENTS`` of each
    module named by ``HOLDFAST["AGENT_MODULES"]``."""
    registry = Registry()
    for module_name in settings.HOLDFAST["AGENT_MODULES"]:
        module = importlib.import_module(module_name)
        for agent in getattr(module, "AGENTS", ()):
            registry.register(agent)
    return registry


def engine_settings() -> EngineSettings:
    conf = settings.HOLDFAST
    return EngineSettings(
        lease_seconds=conf["LEASE_SECONDS"],
        max_send_budget_seconds=conf["SEND_BUDGET_SECONDS"],
        time_slice_seconds=conf["TIME_SLICE_SECONDS"],
        max_claims_without_progress=conf["MAX_CLAIMS_WITHOUT_PROGRESS"],
        inline_result_limit=conf["INLINE_RESULT_LIMIT"],
        reconnect_seconds=conf["RECONNECT_SECONDS"],
        prepared_statements=conf["PREPARED_STATEMENTS"],
    )


@cache
def _process_faults() -> FaultPoints:
    # Armed once per process from HOLDFAST_FAULTS, so a point fires once per process.
    return FaultPoints.from_env()


@dataclass(frozen=True)
class EngineParts:
    """What the composition root (config/wiring.py) plugs into every engine built here."""

    approvals: Callable[[], ApprovalGate]
    desk: Callable[[], ReconciliationDesk]
    credentials: Callable[[], CredentialSource]
    # Told of each run that ended, after its terminal commit.
    ended: Callable[[uuid.UUID], None] | None = None


_parts: EngineParts | None = None


def install_engine_parts(
    *,
    approvals: Callable[[], ApprovalGate],
    desk: Callable[[], ReconciliationDesk],
    credentials: Callable[[], CredentialSource],
    ended: Callable[[uuid.UUID], None] | None = None,
) -> None:
    global _parts
    _parts = EngineParts(approvals=approvals, desk=desk, credentials=credentials, ended=ended)


def _installed_parts() -> EngineParts:
    # Never a bare engine by accident: without its gate a gated effect could only
    # be refused, without its desk an unknown effect would open no case, and
    # without provider accounts no tool could act as its tenant.
    if _parts is None:
        raise ImproperlyConfigured(
            "the engine's parts are not installed: add config.apps.HoldfastConfig to "
            "INSTALLED_APPS (it runs config.wiring.install())"
        )
    return _parts


def credential_source() -> CredentialSource:
    """The tenants' provider accounts, for a tool called outside a worker (an
    approval card's live reading, a reconciliation lookup)."""
    return _installed_parts().credentials()


def build_engine(*, enqueue: Callable[[uuid.UUID], None] | None = None) -> Engine:
    parts = _installed_parts()
    return Engine(
        registry=get_registry(),
        settings=engine_settings(),
        enqueue=enqueue or run_enqueue,
        faults=_process_faults(),
        approvals=parts.approvals(),
        desk=parts.desk(),
        credentials=parts.credentials(),
        stopping=shutdown.stopping,
        ended=parts.ended,
        committed=doorbell_ring,
    )


def run_enqueue(run_id: uuid.UUID) -> None:
    """Ask a worker to advance the run. A wake-up only: the lease decides who runs it.

    Callers stamp ``Run.enqueued_at`` in the same write that makes the run due,
    so the sweeper knows it was knocked on.
    """
    try:
        push_advance(str(run_id))
    except Exception:
        # The run is committed and stamped; the sweeper re-enqueues a queued run
        # nobody picked up. A busy queue must not turn a started run into an error.
        log.warning("run %s: could not enqueue; the sweeper will", run_id, exc_info=True)


def run_queued_task(run_id: uuid.UUID) -> QueuedTask | None:
    """A new run's first wake-up as a queue row admission writes with the run, in one
    statement (PostgreSQL); None on SQLite, where ``run_enqueue`` knocks after the commit."""
    row = advance_row(str(run_id))
    return QueuedTask(row=row, announce=announce) if row is not None else None


def tenant_by_slug(slug: str | None) -> Tenant:
    return Tenant.objects.get(slug=slug or DEFAULT_TENANT_SLUG)


def run_start(
    *,
    tenant: Tenant,
    agent_name: str,
    input: dict[str, Any],
    request_id: str | None = None,
    dedupe_key: str | None = None,
    requested_by: str = "",
) -> tuple[Run, bool]:
    run, created = start_run(
        registry=get_registry(),
        tenant=tenant,
        agent_name=agent_name,
        input=input,
        request_id=request_id,
        dedupe_key=dedupe_key,
        requested_by=requested_by,
        enqueue=run_enqueue,
        queued_task=run_queued_task,
        # The tenant's own settings for this agent (an auto-approval amount, say),
        # pinned into the run with the agent's configuration.
        config_overrides=(tenant.agent_config or {}).get(agent_name),
    )
    if created:
        # Once its "created" event is committed (now, or with the caller's transaction),
        # the tenant's live pages are told.
        transaction.on_commit(lambda: doorbell_ring(run.id), robust=True)
    return run, created


def run_cancel(run_id: uuid.UUID | str, *, by: str) -> Run:
    return build_engine().request_cancel(run_id, by=by)


def run_wake(run_id: uuid.UUID | str, *, by: str) -> bool:
    return build_engine().wake_now(run_id, by=by)


def run_resume(
    run_id: uuid.UUID | str, *, by: str, enqueue: Callable[[uuid.UUID], None] | None = None
) -> bool:
    """Wake a run waiting for approval: a decision was recorded, or a request renewed."""
    return build_engine(enqueue=enqueue).resume_after_approval(run_id, by=by)


def step_settle(
    run_id: uuid.UUID | str,
    step_pk: int,
    *,
    resolution: str,
    by: str,
    guard,
    observed: dict[str, Any] | None = None,
    reference: str = "",
    note: str = "",
) -> str:
    """Settle an unknown effect step the way reconciliation decided (Engine.settle_unknown)."""
    return build_engine().settle_unknown(
        run_id,
        step_pk,
        resolution=resolution,
        by=by,
        guard=guard,
        observed=observed,
        reference=reference,
        note=note,
    )


def run_requeue_settled(
    run_id: uuid.UUID | str, *, by: str, enqueue: Callable[[uuid.UUID], None] | None = None
) -> bool:
    """Give a run waiting for reconciliation back to the workers once nothing is unknown."""
    return build_engine(enqueue=enqueue).requeue_settled(run_id, by=by)
