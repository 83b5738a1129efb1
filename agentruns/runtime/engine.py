"""The engine: advancing runs by replay (DESIGN §6) and the few ways others act on them.

``Engine.advance`` claims a run with a compare-and-set on its ``state_version``
and hands it to a ``Claim``, which replays the agent's code against the
recorded steps and performs the first unrecorded one(s) until the run
suspends, finishes, or its time slice ends. The other entry points are what the
dashboard, the sweeper and reconciliation call: cancel a run, make a waiting
run due now, resume one whose approval was decided, requeue one whose effects
were settled, and settle an unknown effect as a person found it.

Where each part lives: ``claim`` (the replay loop and the commits), ``values``
(clock, random, wait), ``model_steps``, ``tool_steps``, ``gating`` (approvals),
``sending`` (one send and its answer), ``recovery`` (resend, lookup, unknown),
``endings`` (finish, cancel, compensation), ``settling`` (a person's
resolution), ``store`` (every SQL statement).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from agentruns.llm.providers import default_providers
from agentruns.models import RUNNABLE_STATUSES, TERMINAL_STATUSES, Run, RunStatus
from agentruns.runtime.approval import ApprovalGate, Guard, NoApprovals
from agentruns.runtime.claim import Claim
from agentruns.runtime.control import LeaseLost
from agentruns.runtime.credentials import CredentialSource, NoCredentials
from agentruns.runtime.desk import NoDesk, ReconciliationDesk
from agentruns.runtime.endings import finish_cancelled
from agentruns.runtime.faults import FaultPoints
from agentruns.runtime.registry import Agent, Registry
from agentruns.runtime.settling import Resolution, settle
from agentruns.runtime.store import Store
from agentruns.runtime.writes import Committed


@dataclass(frozen=True)
class EngineSettings:
    lease_seconds: float = 3.0
    # The longest an effect may be in flight: a send is cleared only with a lease
    # that outlives the tool's timeout plus this margin (DESIGN §12.1).
    send_margin_seconds: float = 1.0
    max_send_budget_seconds: float = 30.0
    time_slice_seconds: float = 30.0
    max_claims_without_progress: int = 5
    inline_result_limit: int = 256 * 1024
    # How long a write is retried while the database connection is lost. A fact (a
    # provider's answer) may be recorded after the lease is lost, so this may
    # outlive the lease; past it the run is recovered by the usual path.
    reconnect_seconds: float = 15.0
    # PostgreSQL: prepare the engine's statements on the server (once per connection).
    # Off behind a pooler that cannot keep them (docs/scaling.md).
    prepared_statements: bool = True


ProviderFactory = Callable[[dict[str, Any], Agent], Any]

# Which runs each kind of claim may take. A worker takes any runnable run that is
# due; a canceller takes any working run but one whose effect is unknown (that is
# settled first); a settler takes only a run waiting for reconciliation.
CANCELLABLE = sorted(
    [
        RunStatus.QUEUED,
        RunStatus.SLEEPING,
        RunStatus.WAITING_FOR_RETRY,
        RunStatus.BLOCKED,
        RunStatus.WAITING_FOR_APPROVAL,
        RunStatus.RUNNING,
        RunStatus.COMPENSATING,
    ]
)
WAITING_TO_RETRY = [RunStatus.WAITING_FOR_RETRY.value, RunStatus.SLEEPING.value]


def host_id() -> str:
    """This host's name in owner ids: ``HOLDFAST_HOST_ID``, else the machine's host name.

    Containers often share a generic host name; naming each host says, in a lease or
    a claim event, which one held a run or the sweeper's lease.
    """
    return (os.environ.get("HOLDFAST_HOST_ID") or socket.gethostname()).replace(":", "-")


def new_owner_id() -> str:
    """``host:pid:random``: who holds a lease (``agentruns.selectors`` reads the pid)."""
    return f"{host_id()}:{os.getpid()}:{uuid.uuid4().hex[:10]}"


class CancelRefused(Exception):
    pass


class Engine:
    def __init__(
        self,
        *,
        registry: Registry,
        settings: EngineSettings | None = None,
        enqueue: Callable[[uuid.UUID], None] | None = None,
        faults: FaultPoints | None = None,
        providers: ProviderFactory | None = None,
        store: Store | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        approvals: ApprovalGate | None = None,
        desk: ReconciliationDesk | None = None,
        credentials: CredentialSource | None = None,
        stopping: Callable[[], bool] | None = None,
        ended: Callable[[uuid.UUID], None] | None = None,
        committed: Callable[[uuid.UUID], None] | None = None,
    ):
        self.registry = registry
        # Told of each run after its terminal commit (the composition root's
        # listener: webhooks' "run ended"). It must never raise; the end is committed
        # whatever it does, and a listener that needs every end repairs what it missed.
        self.ended: Callable[[uuid.UUID], None] = ended or (lambda run_id: None)
        self.approvals: ApprovalGate = approvals or NoApprovals()
        self.desk: ReconciliationDesk = desk or NoDesk()
        self.credentials: CredentialSource = credentials or NoCredentials()
        # Whether the process was told to stop: a claim then hands its run back at the
        # next step boundary instead of taking another step.
        self.stopping: Callable[[], bool] = stopping or (lambda: False)
        self.settings = settings or EngineSettings()
        self.enqueue = enqueue or (lambda run_id: None)
        self.faults = faults or FaultPoints()
        self.providers = providers or default_providers
        # ``committed`` is told each run whose event a transition committed (the live
        # pages' doorbell); like ``ended`` it never raises.
        self.store = store or Store(
            reconnect_seconds=self.settings.reconnect_seconds,
            prepare=self.settings.prepared_statements,
            committed=committed,
        )
        self.monotonic = monotonic

    def advance(self, run_id: uuid.UUID | str, *, owner: str | None = None) -> str:
        """Advance one run as far as it goes now. Returns what happened, for logs and tests."""
        run_id = uuid.UUID(str(run_id))
        run = self.store.run_read(run_id)
        if run is None:
            return "missing"
        if run.status not in RUNNABLE_STATUSES:
            return "not_runnable"
        owner = owner or new_owner_id()
        claimed = self._claim(run, owner, statuses=sorted(RUNNABLE_STATUSES), due_only=True)
        if not claimed.fenced:
            return "not_claimed"
        return Claim(self, run, owner, claimed).execute()

    def _claim(
        self,
        run: Run,
        owner: str,
        *,
        statuses: list[str],
        due_only: bool = False,
        for_cancel: bool = False,
        for_settle: bool = False,
    ) -> Committed:
        return self.store.claim(
            run.id,
            version=run.state_version,
            owner=owner,
            lease_seconds=self.settings.lease_seconds,
            statuses=[str(s) for s in statuses],
            due_only=due_only,
            # A worker turns the run running; a canceller or settler leaves its state
            # as it was, and so does a worker resuming compensation.
            keep_status=run.status == RunStatus.COMPENSATING or not due_only,
            payload={"owner": owner, "for_cancel": for_cancel, "for_settle": for_settle},
        )

    def request_cancel(self, run_id: uuid.UUID | str, *, by: str) -> Run:
        """Ask a run to stop. An idle run is finished now; a running one stops at
        its next step boundary; an effect in flight is recorded first, never dropped.
        """
        run_id = uuid.UUID(str(run_id))
        run = Run.objects.get(pk=run_id)
        if run.status in TERMINAL_STATUSES:
            raise CancelRefused(f"the run already ended as {run.status}")
        if run.status == RunStatus.EFFECT_UNKNOWN:
            raise CancelRefused(
                "an effect's outcome is unknown; settle it before cancelling the run"
            )
        self.store.mark_cancel_requested(run_id, by=by)
        run.refresh_from_db()
        if run.status in TERMINAL_STATUSES:
            return run
        owner = new_owner_id()
        claimed = self._claim(run, owner, statuses=CANCELLABLE, for_cancel=True)
        if claimed.fenced:
            # The cancel request is committed either way; a worker that takes the
            # run over (a decision woke it) honours it at its next boundary.
            with suppress(LeaseLost):
                finish_cancelled(Claim(self, run, owner, claimed))
        run.refresh_from_db()
        return run

    def wake_now(self, run_id: uuid.UUID | str, *, by: str) -> bool:
        """Make a run waiting to retry due now and enqueue it (an operator's "retry now")."""
        run_id = uuid.UUID(str(run_id))
        woken = self.store.mark_due(run_id, statuses=WAITING_TO_RETRY, by=by)
        if woken:
            self.enqueue(run_id)
        return woken

    def settle_unknown(
        self,
        run_id: uuid.UUID | str,
        step_pk: int,
        *,
        resolution: Resolution | str,
        by: str,
        guard: Guard,
        observed: dict[str, Any] | None = None,
        reference: str = "",
        note: str = "",
    ) -> str:
        """Settle an ``unknown`` effect step as an operator (or a conclusive lookup) found it.

        ``guard`` is the caller's compare-and-set on its own record (the
        reconciliation case); it, the step's own ``status = unknown`` check and the
        run's fence commit together or not at all, so a late provider answer and a
        resolution cannot both win. Returns "refused" when a guard did not match
        (nothing was written), "busy" when the run could not be claimed, or what the
        run did next.
        """
        try:
            resolution = Resolution(resolution)
        except ValueError:
            raise ValueError(f"unknown resolution {resolution!r}") from None
        run_id = uuid.UUID(str(run_id))
        run = Run.objects.get(pk=run_id)
        if run.status != RunStatus.EFFECT_UNKNOWN:
            return "refused"
        owner = new_owner_id()
        claimed = self._claim(run, owner, statuses=[RunStatus.EFFECT_UNKNOWN], for_settle=True)
        if not claimed.fenced:
            return "busy"
        claim = Claim(self, run, owner, claimed)
        try:
            return settle(
                claim,
                step_pk,
                resolution,
                by=by,
                guard=guard,
                observed=observed,
                reference=reference,
                note=note,
            )
        except LeaseLost:
            return "lease_lost"

    def requeue_settled(self, run_id: uuid.UUID | str, *, by: str) -> bool:
        """Queue a run waiting for reconciliation whose effects are all settled now
        (a worker's late answer settled the step before anyone resolved its case)."""
        run_id = uuid.UUID(str(run_id))
        queued = self.store.requeue_if_settled(run_id, by=by)
        if queued:
            self.enqueue(run_id)
        return queued

    def resume_after_approval(self, run_id: uuid.UUID | str, *, by: str) -> bool:
        """Make a run waiting for approval runnable again (a decision was recorded,
        or an expired approval is to be requested again) and enqueue it."""
        run_id = uuid.UUID(str(run_id))
        queued = self.store.resume_waiting_for_approval(run_id, by=by)
        if queued:
            self.enqueue(run_id)
        return queued
