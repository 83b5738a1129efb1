"""Advancing a run by replay (DESIGN §6), effects and their recovery (§7).

One call to ``Engine.advance`` claims a run with a compare-and-set on its
``state_version``, replays the agent's code from the top against the recorded
steps, performs the first unrecorded step(s), and stops when the run suspends,
finishes, or its time slice ends. Every decision is fenced by the claimed
version, the owner and an unexpired lease; a worker that lost its lease fails
its next write and stops without acting.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import connections
from pydantic import ValidationError

from agentruns.llm.base import ModelError, ModelReply, ModelRequest, ModelUnavailable
from agentruns.models import (
    RUNNABLE_STATUSES,
    TERMINAL_STATUSES,
    Blob,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from agentruns.runtime import faults as fault_points
from agentruns.runtime.approval import (
    ApprovalGate,
    ApprovalRequest,
    ApprovalState,
    Guard,
    NoApprovals,
)
from agentruns.runtime.context import (
    AgentUsageError,
    ModelResponse,
    ModelToolCall,
    RunContext,
)
from agentruns.runtime.control import (
    Abandon,
    Blocked,
    Divergence,
    Finish,
    LeaseLost,
    Stop,
    Suspend,
)
from agentruns.runtime.desk import NoDesk, ReconciliationDesk
from agentruns.runtime.effects import canonical_json, content_hash, make_effect_key
from agentruns.runtime.faults import FaultPoints
from agentruns.runtime.outcomes import (
    EffectFact,
    Ending,
    NotSettled,
    Verdict,
    classify,
    derive_terminal_state,
)
from agentruns.runtime.registry import Agent, Registry
from agentruns.runtime.retry import RetryPolicy
from agentruns.runtime.store import (
    NOW,
    Event,
    Fence,
    Json,
    NowPlus,
    Sql,
    StepInsert,
    StepUpdate,
    Store,
)
from agentruns.runtime.tools import (
    NON_RETRYABLE,
    CallInfo,
    LookupResult,
    Recovery,
    Tool,
    ToolResult,
)

log = logging.getLogger("holdfast.engine")

UNSETTLED = (StepStatus.RUNNING, StepStatus.UNKNOWN)
# How an unknown effect can be settled (reconciliation, DESIGN §9).
SETTLE_RESOLUTIONS = ("happened", "retry", "cancel", "differently")
MODEL_RETRY = RetryPolicy(max_attempts=5, initial_delay=1.0, max_delay=30.0, deadline=300.0)


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


ProviderFactory = Callable[[dict[str, Any], Agent], Any]


def new_owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:10]}"


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
    ):
        self.registry = registry
        self.approvals: ApprovalGate = approvals or NoApprovals()
        self.desk: ReconciliationDesk = desk or NoDesk()
        self.settings = settings or EngineSettings()
        self.enqueue = enqueue or (lambda run_id: None)
        self.faults = faults or FaultPoints()
        self.providers = providers or default_providers
        self.store = store or Store()
        self.monotonic = monotonic

    # --- the entry point -------------------------------------------------------

    def advance(self, run_id: uuid.UUID | str, *, owner: str | None = None) -> str:
        """Advance one run as far as it goes now. Returns what happened, for logs and tests."""
        run_id = uuid.UUID(str(run_id))
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            return "missing"
        if run.status not in RUNNABLE_STATUSES:
            return "not_runnable"
        owner = owner or new_owner_id()
        claim = self._claim(run, owner)
        if claim is None:
            return "not_claimed"
        advance = _Advance(self, run, owner, claim)
        return advance.execute()

    def _claim(self, run: Run, owner: str, *, for_cancel: bool = False, for_settle: bool = False):
        """Take the run's lease.

        The compare-and-set on state_version makes two workers that read the
        same row race on one UPDATE: exactly one matches. Due time and lease
        expiry are compared with the database's clock, never a worker's.
        """
        s = self.store
        params: list[Any] = []
        run_id_sql = s._value(run.id, params)
        params.append(run.state_version)
        statuses = (
            [
                RunStatus.QUEUED,
                RunStatus.SLEEPING,
                RunStatus.WAITING_FOR_RETRY,
                RunStatus.BLOCKED,
                RunStatus.WAITING_FOR_APPROVAL,
                RunStatus.RUNNING,
                RunStatus.COMPENSATING,
            ]
            if for_cancel
            else [RunStatus.EFFECT_UNKNOWN]
            if for_settle
            else sorted(RUNNABLE_STATUSES)
        )
        status_sql = ", ".join("%s" for _ in statuses)
        params.extend(str(x) for x in statuses)
        now_sql = s._value(NOW, params)
        due_sql = ""
        if not (for_cancel or for_settle):
            due_sql = (
                f" AND (next_attempt_at IS NULL OR next_attempt_at <= {s._value(NOW, params)})"
            )
        where = (
            f"id = {run_id_sql} AND state_version = %s AND status IN ({status_sql}) "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < {now_sql}){due_sql}"
        )
        status_after = (
            Sql("status")
            if run.status == RunStatus.COMPENSATING or for_cancel or for_settle
            else RunStatus.RUNNING.value
        )
        committed = s.transition(
            fence=None,
            run_where=(where, params),
            run_set={
                "lease_owner": owner,
                "lease_expires_at": NowPlus(self.settings.lease_seconds),
                "claim_count": Sql("claim_count + 1"),
                "status": status_after,
                "next_attempt_at": None,
            },
            event=Event(
                "claimed",
                payload={"owner": owner, "for_cancel": for_cancel, "for_settle": for_settle},
            ),
        )
        if not committed.fenced:
            return None
        return committed

    # --- services the dashboard and the sweeper call ----------------------------

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
        params: list[Any] = []
        where = f"id = {self.store._value(run_id, params)} AND cancel_requested_at IS NULL"
        self.store.transition(
            fence=None,
            run_where=(where, params),
            run_set={"cancel_requested_at": NOW, "cancel_requested_by": by},
            bump_version=False,
            event=Event("cancel_requested", payload={"by": by}),
        )
        run.refresh_from_db()
        if run.status in TERMINAL_STATUSES:
            return run
        owner = new_owner_id()
        claim = self._claim(run, owner, for_cancel=True)
        if claim is not None:
            # The cancel request is committed either way; a worker that takes the
            # run over (a decision woke it) honours it at its next boundary.
            with suppress(LeaseLost):
                _Advance(self, run, owner, claim).finish_cancelled()
        run.refresh_from_db()
        return run

    def wake_now(self, run_id: uuid.UUID | str, *, by: str) -> bool:
        """Make a run waiting to retry due now and enqueue it (an operator's "retry now")."""
        run_id = uuid.UUID(str(run_id))
        params: list[Any] = []
        where = f"id = {self.store._value(run_id, params)} AND status IN (%s, %s)"
        params.extend([RunStatus.WAITING_FOR_RETRY.value, RunStatus.SLEEPING.value])
        committed = self.store.transition(
            fence=None,
            run_where=(where, params),
            run_set={"next_attempt_at": NOW, "enqueued_at": NOW},
            event=Event("woken", payload={"by": by}),
        )
        if committed.fenced:
            self.enqueue(run_id)
        return committed.fenced

    def settle_unknown(
        self,
        run_id: uuid.UUID | str,
        step_pk: int,
        *,
        resolution: str,
        by: str,
        guard: Guard,
        observed: dict[str, Any] | None = None,
        reference: str = "",
        note: str = "",
    ) -> str:
        """Settle an ``unknown`` effect step as an operator (or a conclusive lookup) found it.

        ``resolution`` is one of ``SETTLE_RESOLUTIONS``. ``guard`` is the caller's
        compare-and-set on its own record (the reconciliation case); it, the step's
        own ``status = unknown`` check and the run's fence commit together or not at
        all, so a late provider answer and a resolution cannot both win.
        Returns "refused" when a guard did not match (nothing was written), "busy"
        when the run could not be claimed, or what the run did next.
        """
        if resolution not in SETTLE_RESOLUTIONS:
            raise ValueError(f"unknown resolution {resolution!r}")
        run_id = uuid.UUID(str(run_id))
        run = Run.objects.get(pk=run_id)
        if run.status != RunStatus.EFFECT_UNKNOWN:
            return "refused"
        owner = new_owner_id()
        claim = self._claim(run, owner, for_settle=True)
        if claim is None:
            return "busy"
        advance = _Advance(self, run, owner, claim)
        try:
            return advance.settle(
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
        params: list[Any] = []
        run_sql = self.store._value(run_id, params)
        params.append(RunStatus.EFFECT_UNKNOWN.value)
        step_run_sql = self.store._value(run_id, params)
        params.extend([StepStatus.RUNNING.value, StepStatus.UNKNOWN.value])
        now_sql = self.store._value(NOW, params)
        where = (
            f"id = {run_sql} AND status = %s AND NOT EXISTS (SELECT 1 FROM agentruns_step "
            f"WHERE run_id = {step_run_sql} AND is_effect AND status IN (%s, %s)) "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < {now_sql})"
        )
        committed = self.store.transition(
            fence=None,
            run_where=(where, params),
            run_set={"status": RunStatus.QUEUED.value, "next_attempt_at": None, "enqueued_at": NOW},
            event=Event("resumed", payload={"by": by, "reason": "effects settled"}),
        )
        if committed.fenced:
            self.enqueue(run_id)
        return committed.fenced

    def resume_after_approval(self, run_id: uuid.UUID | str, *, by: str) -> bool:
        """Make a run waiting for approval runnable again (a decision was recorded,
        or an expired approval is to be requested again) and enqueue it."""
        run_id = uuid.UUID(str(run_id))
        params: list[Any] = []
        run_sql = self.store._value(run_id, params)
        params.append(RunStatus.WAITING_FOR_APPROVAL.value)
        now_sql = self.store._value(NOW, params)
        # Not while someone holds the run (a canceller finishing it, say).
        where = (
            f"id = {run_sql} AND status = %s "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < {now_sql})"
        )
        committed = self.store.transition(
            fence=None,
            run_where=(where, params),
            run_set={"status": RunStatus.QUEUED.value, "next_attempt_at": None, "enqueued_at": NOW},
            event=Event("resumed", payload={"by": by}),
        )
        if committed.fenced:
            self.enqueue(run_id)
        return committed.fenced


class CancelRefused(Exception):
    pass


def default_providers(spec: dict[str, Any], agent: Agent):
    provider = spec.get("provider", "scripted")
    if provider == "scripted":
        from agentruns.llm.scripted import ScriptedProvider

        name = spec.get("scenario")
        if name is None or name not in agent.scenarios:
            known = ", ".join(sorted(agent.scenarios)) or "none"
            raise ModelConfigurationError(
                f"scripted model: agent {agent.name!r} has no scenario {name!r} (known: {known})"
            )
        return ScriptedProvider(agent.scenarios[name], model=spec.get("model", "scripted-1"))
    if provider == "openai":
        from django.core.exceptions import ImproperlyConfigured

        from agentruns.llm.openai_compat import OpenAICompatibleProvider

        try:
            return OpenAICompatibleProvider.from_settings()
        except ImproperlyConfigured as exc:
            raise ModelConfigurationError(str(exc)) from exc
    raise ModelConfigurationError(f"unknown model provider {provider!r}")


class ModelConfigurationError(Exception):
    pass


class _Advance:
    """One claim of one run: replay, new steps, and the final write."""

    def __init__(self, engine: Engine, run: Run, owner: str, claim):
        self.engine = engine
        self.settings = engine.settings
        self.store = engine.store
        self.run_id: uuid.UUID = run.id
        self.run = run
        self.snapshot: dict[str, Any] = run.agent_snapshot or {}
        self.fence = Fence(run.id, claim.state_version, owner)
        self.cancel_requested = claim.cancel_requested
        self.started = engine.monotonic()
        # This worker's own estimate of its lease; the database's check is the truth.
        self.lease_valid_until = self.started + engine.settings.lease_seconds
        self.steps: dict[int, Step] = {}
        self.next_seq = 0
        self.wrote_step = False
        # Whether this claim has reset the run's crash-loop counter yet.
        self.progress_reset = False
        self.cancel_unseen = False
        self.agent: Agent | None = None
        run.refresh_from_db()
        self.counters = {
            "steps": run.steps_used,
            "model_calls": run.model_calls_used,
            "tokens": run.tokens_used,
            "cost_micros": run.cost_micros,
        }

    # --- the advance loop -------------------------------------------------------------

    def execute(self) -> str:
        try:
            try:
                return self._run()
            except Stop:
                raise
            except Exception as exc:  # the engine's own failure, not the agent's
                raise Abandon(exc) from exc
        except Suspend as suspend:
            if not suspend.already_written:
                self._write_suspend(suspend)
            if suspend.requeue:
                self.engine.enqueue(self.run_id)
            return f"suspended:{suspend.status}"
        except Finish as finish:
            return self._finish(finish)
        except Blocked as blocked:
            self._write_blocked(blocked)
            return "blocked"
        except LeaseLost:
            log.info("run %s: lease lost by %s", self.run_id, self.fence.owner)
            return "lease_lost"
        except Abandon as abandon:
            log.exception(
                "run %s: abandoned by %s", self.run_id, self.fence.owner, exc_info=abandon.cause
            )
            return "abandoned"

    def _run(self) -> str:
        run = self.run
        if run.claim_count > self.settings.max_claims_without_progress:
            raise Blocked(
                f"crash loop: claimed {run.claim_count} times without completing a step",
                {"claim_count": run.claim_count},
            )
        agent = self.engine.registry.get(run.agent_name, run.agent_version)
        if agent is None:
            raise Blocked(
                f"agent {run.agent_name!r} version {run.agent_version} is not registered "
                "in this deployment; the run waits for that version to be deployed again",
                {"agent": run.agent_name, "version": run.agent_version},
            )
        self.agent = agent
        self.steps = {step.seq: step for step in Step.objects.filter(run_id=self.run_id)}
        if run.status == RunStatus.COMPENSATING:
            self._compensate()
        ctx = RunContext(self)
        try:
            output = agent.fn(ctx, run.input)
        except Stop:
            raise
        except Exception as exc:
            raise Finish(Ending.FAILED, f"agent code raised {type(exc).__name__}: {exc}") from exc
        leftover = [
            s
            for seq, s in self.steps.items()
            if seq >= self.next_seq and s.kind != StepKind.COMPENSATION
        ]
        if leftover:
            first = min(leftover, key=lambda s: s.seq)
            raise Divergence(
                f"replay diverged: the code finished at step {self.next_seq} but "
                f"{first.step_id} is recorded",
                {
                    "recorded": _describe(first),
                    "requested": {"seq": self.next_seq, "finished": True},
                },
            )
        raise Finish(Ending.COMPLETED, "", output=_json_safe(output))

    # --- step identity and replay ---------------------------------------------------

    def _position(self, kind: str, name: str, input_hash: str) -> tuple[int, str, Step | None]:
        seq = self.next_seq
        self.next_seq += 1
        step_id = f"{seq:04d}.{kind}.{name}"
        recorded = self.steps.get(seq)
        if recorded is not None and (
            recorded.kind != kind or recorded.name != name or recorded.input_hash != input_hash
        ):
            raise Divergence(
                f"replay diverged at step {seq}: recorded {recorded.step_id}, "
                f"code now asks for {step_id}",
                {
                    "recorded": _describe(recorded),
                    "requested": {"seq": seq, "kind": kind, "name": name, "input_hash": input_hash},
                },
            )
        return seq, step_id, recorded

    def _boundary(self, *, forward: bool, model: bool = False, effect: bool = False) -> None:
        """Checks before a new step: cancellation, time slice, budgets (forward steps only)."""
        if self.cancel_unseen and not effect:
            # A recorded answer did not read the run; look once before spending more.
            # (A new effect needs no look: its clearing commit refuses after a cancel.)
            self.cancel_requested = self.store.cancel_requested(self.run_id)
            self.cancel_unseen = False
        if self.cancel_requested:
            raise Finish(Ending.CANCELLED, "cancelled by request")
        # Every claim makes progress on at least one step before the slice can end.
        if self.wrote_step and (
            self.engine.monotonic() - self.started > self.settings.time_slice_seconds
        ):
            raise Suspend(RunStatus.QUEUED, "time slice used up", requeue=True)
        if not forward:
            return
        budget = self.snapshot.get("budget", {})
        exceeded = None
        if self.counters["steps"] >= budget.get("max_steps", 10**9):
            exceeded = f"max_steps ({budget['max_steps']})"
        elif model and self.counters["model_calls"] >= budget.get("max_model_calls", 10**9):
            exceeded = f"max_model_calls ({budget['max_model_calls']})"
        elif model and self.counters["tokens"] >= budget.get("max_tokens", 10**12):
            exceeded = f"max_tokens ({budget['max_tokens']})"
        elif model and self.counters["cost_micros"] >= budget.get("max_cost_micros", 10**15):
            exceeded = f"max_cost ({Decimal(budget['max_cost_micros']) / 1_000_000} USD)"
        if exceeded:
            raise Finish(Ending.FAILED, f"budget exhausted: {exceeded}")

    def _reach(self, point: str, name: str) -> None:
        self.engine.faults.reach(point, name)

    # --- writes ---------------------------------------------------------------------

    def _commit(
        self,
        *,
        run_set: dict[str, Any] | None = None,
        step=None,
        event=None,
        fact: bool = False,
        lease_margin: float | None = None,
        unless_cancelled: bool = False,
        guard: Guard | None = None,
    ):
        run_set = dict(run_set or {})
        # A fenced write renews the lease when a third of it is used up. Not on
        # every step: an unchanged lease column lets PostgreSQL update the run
        # row in place (HOT), which halves what each step writes.
        lease = self.settings.lease_seconds
        renewing = "lease_expires_at" not in run_set and (
            self.lease_valid_until - self.engine.monotonic() < lease * 2 / 3
        )
        if renewing:
            run_set["lease_expires_at"] = NowPlus(lease)
            renewed_at = self.engine.monotonic()
        committed = self.store.transition(
            fence=self.fence,
            run_set=run_set,
            step=step,
            event=event,
            step_is_fact=fact,
            lease_margin=lease_margin,
            unless_cancelled=unless_cancelled,
            guard=guard,
        )
        if committed.fenced:
            self.cancel_unseen = False
            if run_set.get("claim_count") == 0:
                self.progress_reset = True
            if renewing:
                self.lease_valid_until = renewed_at + lease
            if step is not None:
                self.wrote_step = True
            self.fence = Fence(self.fence.run_id, committed.state_version, self.fence.owner)
            self.cancel_requested = committed.cancel_requested
        return committed

    def _decide(self, **kwargs):
        committed = self._commit(**kwargs)
        if not committed.fenced:
            if kwargs.get("unless_cancelled") and committed.cancel_requested:
                raise Finish(Ending.CANCELLED, "cancelled by request")
            raise LeaseLost()
        return committed

    def _progress(self, step_id: str, *, new_step: bool = True, **extra) -> dict[str, Any]:
        run_set: dict[str, Any] = {"claim_count": 0, "current_step": step_id}
        if new_step:
            run_set["steps_used"] = Sql("steps_used + 1")
        run_set.update(extra)
        return run_set

    def _result_columns(self, value: Any) -> dict[str, Any]:
        text = canonical_json(value)
        digest = content_hash(value)
        if len(text.encode()) <= self.settings.inline_result_limit:
            return {"result": Json(value), "result_hash": digest}
        blob_name = f"blobs/{digest[:2]}/{digest}.json"
        if not Blob.objects.filter(pk=digest).exists():
            if not default_storage.exists(blob_name):
                blob_name = default_storage.save(blob_name, ContentFile(text.encode()))
            Blob.objects.get_or_create(
                sha256=digest, defaults={"size": len(text.encode()), "storage_name": blob_name}
            )
        return {"result": None, "result_blob_id": digest, "result_hash": digest}

    def _load_result(self, step: Step) -> Any:
        if step.result_blob_id:
            blob = Blob.objects.get(pk=step.result_blob_id)
            with default_storage.open(blob.storage_name) as fh:
                return json.loads(fh.read())
        return step.result

    def _reload(self, seq: int) -> Step:
        step = Step.objects.get(run_id=self.run_id, seq=seq)
        self.steps[seq] = step
        return step

    # --- simple recorded values ----------------------------------------------------

    def clock_step(self) -> datetime:
        seq, step_id, recorded = self._position(StepKind.CLOCK, "now", "")
        if recorded is not None:
            return datetime.fromisoformat(recorded.result["now"])
        self._boundary(forward=True)
        self._reach(fault_points.BEFORE_STEP_RECORDED, "now")
        value = self.store.db_now()
        self._insert_succeeded(seq, step_id, StepKind.CLOCK, "now", "", {"now": value.isoformat()})
        return value

    def random_step(self) -> float:
        seq, step_id, recorded = self._position(StepKind.RANDOM, "random", "")
        if recorded is not None:
            return float(recorded.result["value"])
        self._boundary(forward=True)
        self._reach(fault_points.BEFORE_STEP_RECORDED, "random")
        value = random.random()
        self._insert_succeeded(seq, step_id, StepKind.RANDOM, "random", "", {"value": value})
        return value

    def _insert_succeeded(self, seq, step_id, kind, name, input_hash, result, **values):
        self._decide(
            run_set=self._progress(step_id),
            step=StepInsert(
                {
                    "run_id": self.run_id,
                    "seq": seq,
                    "step_id": step_id,
                    "kind": kind,
                    "name": name,
                    "status": StepStatus.SUCCEEDED,
                    "input_hash": input_hash,
                    "attempts": 1,
                    "started_at": NOW,
                    "completed_at": NOW,
                    **self._result_columns(result),
                    **values,
                }
            ),
            event=Event("step_succeeded", step_id),
        )
        self._reach(fault_points.AFTER_RESULT_RECORDED, name)

    def wait_step(self, seconds: float) -> None:
        input_hash = content_hash({"seconds": seconds})
        seq, step_id, recorded = self._position(StepKind.WAIT, "sleep", input_hash)
        if recorded is not None:
            if recorded.status == StepStatus.SUCCEEDED:
                return
            # The run was claimed, so its wake time (next_attempt_at) has come.
            self._decide(
                run_set=self._progress(step_id, new_step=False),
                step=StepUpdate(recorded.pk, {"status": StepStatus.SUCCEEDED, "completed_at": NOW}),
                event=Event("woke", step_id),
            )
            return
        self._boundary(forward=True)
        self._reach(fault_points.BEFORE_STEP_RECORDED, "sleep")
        self._decide(
            run_set=self._suspend_set(RunStatus.SLEEPING, seconds, new_step=True, step_id=step_id),
            step=StepInsert(
                {
                    "run_id": self.run_id,
                    "seq": seq,
                    "step_id": step_id,
                    "kind": StepKind.WAIT,
                    "name": "sleep",
                    "status": StepStatus.RUNNING,
                    "input": {"seconds": seconds},
                    "input_hash": input_hash,
                    "attempts": 1,
                    "started_at": NOW,
                    "result": {"seconds": seconds},
                }
            ),
            event=Event("sleeping", step_id, {"seconds": seconds}),
        )
        raise Suspend(RunStatus.SLEEPING, f"sleeping {seconds}s", already_written=True)

    # --- model steps ---------------------------------------------------------------

    def model_step(self, messages, *, tools=None, temperature=None) -> ModelResponse:
        spec = self.snapshot.get("model", {})
        all_tools = self.snapshot.get("tools", {})
        # Sorted: the snapshot's key order is not kept by every database (jsonb).
        tool_names = sorted(all_tools) if tools is None else list(tools)
        unknown = [n for n in tool_names if n not in all_tools]
        if unknown:
            raise AgentUsageError(f"ctx.model: tools not declared by the agent: {unknown}")
        step_input = {
            "provider": spec.get("provider"),
            "model": spec.get("model"),
            "prompt_version": spec.get("prompt_version"),
            "tool_schema_version": self.snapshot.get("tool_schema_version"),
            "messages": messages,
            "tools": tool_names,
            "temperature": temperature,
        }
        input_hash = content_hash(step_input)
        seq, step_id, recorded = self._position(StepKind.MODEL, "chat", input_hash)
        if recorded is not None and recorded.status == StepStatus.SUCCEEDED:
            # The accepted output is reused; the model is never asked twice.
            return ModelResponse.from_recorded(self._load_result(recorded), step_id)
        if recorded is not None and recorded.status == StepStatus.FAILED:
            raise Finish(Ending.FAILED, f"model call failed: {recorded.last_error}")
        self._boundary(forward=recorded is None, model=recorded is None)
        if recorded is None:
            self._reach(fault_points.BEFORE_STEP_RECORDED, "chat")
        try:
            provider = self.engine.providers(spec, self.agent)
        except ModelConfigurationError as exc:
            raise Finish(Ending.FAILED, f"model configuration: {exc}") from exc
        request = ModelRequest(
            model=spec.get("model", ""),
            messages=messages,
            tools=[all_tools[n]["schema"] for n in tool_names],
            temperature=temperature,
        )
        timeout = float(spec.get("timeout", 20.0))
        error: ModelError | None = None
        reply: ModelReply | None = None
        called_at = self.engine.monotonic()
        try:
            with self._heartbeat(timeout):
                reply = provider.complete(request, timeout=timeout)
        except ModelError as exc:
            error = exc
        except Exception as exc:  # an adapter bug: nothing usable came back
            error = ModelUnavailable(f"{type(exc).__name__}: {exc}")
        self._reach(fault_points.AFTER_CALL_RETURNED, "chat")
        evidence = {
            "model_provider": spec.get("provider", ""),
            "model_id": spec.get("model", ""),
            "prompt_version": str(spec.get("prompt_version", "")),
            "tool_schema_version": self.snapshot.get("tool_schema_version", ""),
        }
        if error is not None:
            self._model_failed(seq, step_id, step_input, input_hash, recorded, error, evidence)
        assert reply is not None
        response, validation = self._validate(reply, tool_names, step_id)
        pricing = spec.get("pricing_per_million", ["0", "0"])
        cost = int(
            Decimal(reply.input_tokens) * Decimal(pricing[0])
            + Decimal(reply.output_tokens) * Decimal(pricing[1])
        )
        result = {
            "content": response.content,
            "finish_reason": response.finish_reason,
            "tool_calls": [call.__dict__ for call in response.tool_calls],
            "model": reply.model,
        }
        evidence.update(
            {
                "model_id": reply.model or evidence["model_id"],
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                "cost_micros": cost,
                "validation": Json(validation),
            }
        )
        tokens = reply.input_tokens + reply.output_tokens
        run_set = self._progress(
            step_id,
            new_step=recorded is None,
            model_calls_used=Sql("model_calls_used + 1"),
            tokens_used=Sql(f"tokens_used + {int(tokens)}"),
            cost_micros=Sql(f"cost_micros + {int(cost)}"),
        )
        values = {
            "status": StepStatus.SUCCEEDED,
            "completed_at": NOW,
            **self._result_columns(result),
            **evidence,
        }
        if recorded is None:
            step = StepInsert(
                {
                    "run_id": self.run_id,
                    "seq": seq,
                    "step_id": step_id,
                    "kind": StepKind.MODEL,
                    "name": "chat",
                    "input": Json(step_input),
                    "input_hash": input_hash,
                    "attempts": 1,
                    # Recorded after the call: its start is now less the call's length.
                    "started_at": NowPlus(called_at - self.engine.monotonic()),
                    **values,
                }
            )
        else:
            step = StepUpdate(recorded.pk, {"attempts": Sql("attempts + 1"), **values})
        self._decide(run_set=run_set, step=step, event=Event("step_succeeded", step_id))
        self.counters["model_calls"] += 1
        self.counters["tokens"] += tokens
        self.counters["cost_micros"] += cost
        if recorded is None:
            self.counters["steps"] += 1
        self._reach(fault_points.AFTER_RESULT_RECORDED, "chat")
        return response

    def _validate(self, reply: ModelReply, tool_names: list[str], step_id: str):
        calls = []
        validation = []
        for raw in reply.tool_calls:
            arguments = None
            error = None
            tool = self.agent.tool(raw.name) if raw.name in tool_names else None
            if tool is None:
                error = f"unknown tool {raw.name!r}; available: {', '.join(tool_names) or 'none'}"
            else:
                try:
                    parsed = json.loads(raw.arguments or "{}")
                    if not isinstance(parsed, dict):
                        raise ValueError("arguments must be a JSON object")
                    arguments = tool.args_model.model_validate(parsed).model_dump(mode="json")
                except json.JSONDecodeError as exc:
                    error = f"arguments are not valid JSON: {exc.msg} at position {exc.pos}"
                except ValidationError as exc:
                    error = "invalid arguments: " + "; ".join(
                        f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                        for e in exc.errors()
                    )
                except ValueError as exc:
                    error = f"invalid arguments: {exc}"
            calls.append(
                ModelToolCall(
                    id=raw.id,
                    name=raw.name,
                    raw_arguments=raw.arguments,
                    arguments=arguments,
                    valid=error is None,
                    error=error,
                )
            )
            validation.append(
                {"id": raw.id, "name": raw.name, "valid": error is None, "error": error}
            )
        response = ModelResponse(reply.content, calls, reply.finish_reason, step_id)
        return response, validation

    def _model_failed(self, seq, step_id, step_input, input_hash, recorded, error, evidence):
        attempts = (recorded.attempts if recorded else 0) + 1
        retry_after = getattr(error, "retry_after", None)
        message = f"{type(error).__name__}: {error}"
        values = {
            "last_error_class": error.error_class,
            "last_error": message,
            "provider_retry_after": retry_after,
            **evidence,
        }
        give_up = not error.retryable or error.error_class in NON_RETRYABLE
        if not give_up:
            give_up = attempts >= MODEL_RETRY.max_attempts or self._past_deadline(recorded)
        if give_up:
            values.update({"status": StepStatus.FAILED, "completed_at": NOW})
            self._write_attempt(
                seq,
                step_id,
                StepKind.MODEL,
                "chat",
                step_input,
                input_hash,
                recorded,
                values,
                run_set=self._progress(step_id, new_step=recorded is None),
            )
            raise Finish(Ending.FAILED, f"model call failed after {attempts} attempt(s): {message}")
        delay = MODEL_RETRY.delay(attempts, retry_after=retry_after)
        values.update({"status": StepStatus.PLANNED})
        if recorded is None:
            values["retry_deadline"] = NowPlus(MODEL_RETRY.deadline)
        self._write_attempt(
            seq,
            step_id,
            StepKind.MODEL,
            "chat",
            step_input,
            input_hash,
            recorded,
            values,
            run_set=self._suspend_set(
                RunStatus.WAITING_FOR_RETRY, delay, new_step=recorded is None, step_id=step_id
            ),
        )
        raise Suspend(RunStatus.WAITING_FOR_RETRY, message, already_written=True)

    def _write_attempt(
        self, seq, step_id, kind, name, step_input, input_hash, recorded, values, *, run_set
    ):
        if recorded is None:
            step = StepInsert(
                {
                    "run_id": self.run_id,
                    "seq": seq,
                    "step_id": step_id,
                    "kind": kind,
                    "name": name,
                    "input": Json(step_input),
                    "input_hash": input_hash,
                    "attempts": 1,
                    "started_at": NOW,
                    **values,
                }
            )
        else:
            step = StepUpdate(recorded.pk, {"attempts": Sql("attempts + 1"), **values})
        event = Event(
            "step_" + str(values["status"]), step_id, {"error": values.get("last_error", "")}
        )
        self._decide(run_set=run_set, step=step, event=event)

    def _past_deadline(self, recorded: Step | None) -> bool:
        if recorded is None or recorded.retry_deadline is None:
            return False
        return self.store.db_now() >= recorded.retry_deadline

    def _suspend_set(self, status, delay: float | None, *, new_step: bool, step_id: str):
        run_set = {
            "status": status,
            "lease_owner": "",
            "lease_expires_at": None,
            "claim_count": 0,
            "next_attempt_at": None if delay is None else NowPlus(delay),
            "current_step": step_id,
        }
        if new_step:
            run_set["steps_used"] = Sql("steps_used + 1")
        return run_set

    @contextmanager
    def _heartbeat(self, timeout: float) -> Iterator[None]:
        """Renew the lease while a call is within its timeout, and not a moment longer.

        The thread stops renewing once the call has outlived its timeout: a
        worker that cannot prove progress must let its lease expire.
        """
        interval = self.settings.lease_seconds / 3
        if timeout <= interval:
            yield
            return
        stop = threading.Event()
        deadline = self.engine.monotonic() + timeout
        fence = self.fence
        store = self.store
        lease = self.settings.lease_seconds

        def renew() -> None:
            try:
                while not stop.wait(interval) and self.engine.monotonic() < deadline:
                    committed = store.transition(
                        fence=fence,
                        run_set={"lease_expires_at": NowPlus(lease)},
                        bump_version=False,
                    )
                    if not committed.fenced:
                        return
            except Exception:
                log.exception("run %s: lease heartbeat failed", fence.run_id)
            finally:
                connections[store.alias].close()

        thread = threading.Thread(target=renew, name=f"lease-{fence.run_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    # --- tool steps ----------------------------------------------------------------

    def tool_step(self, name: str, args: dict[str, Any]) -> ToolResult:
        tool = self.agent.tool(name)
        if tool is None:
            raise AgentUsageError(f"ctx.tool: agent {self.agent.name!r} declares no tool {name!r}")
        try:
            canonical = tool.args_model.model_validate(args).model_dump(mode="json")
        except ValidationError as exc:
            return ToolResult(
                status="invalid_arguments",
                error="invalid arguments: "
                + "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                    for e in exc.errors()
                ),
                error_class="invalid_arguments",
            )
        input_hash = content_hash({"tool": name, "args": canonical})
        seq, step_id, recorded = self._position(StepKind.TOOL, name, input_hash)
        return self._perform(seq, step_id, StepKind.TOOL, tool, canonical, input_hash, recorded)

    def _perform(
        self,
        seq,
        step_id,
        kind,
        tool: Tool,
        canonical,
        input_hash,
        recorded,
        *,
        compensates: int | None = None,
    ) -> ToolResult:
        if recorded is not None and recorded.status == StepStatus.SUCCEEDED:
            return ToolResult("succeeded", self._load_result(recorded), step_id=step_id)
        if recorded is not None and recorded.status == StepStatus.FAILED:
            return ToolResult(
                "failed",
                error=recorded.last_error,
                error_class=recorded.last_error_class,
                step_id=step_id,
            )
        forward = recorded is None and kind != StepKind.COMPENSATION
        if recorded is None:
            self._boundary(forward=forward, effect=not tool.recovery.read_only)
            self._reach(fault_points.BEFORE_STEP_RECORDED, tool.name)
        if tool.recovery.read_only:
            return self._read_only(seq, step_id, kind, tool, canonical, input_hash, recorded)
        return self._effect(
            seq, step_id, kind, tool, canonical, input_hash, recorded, compensates=compensates
        )

    def _call_info(self, step_id, effect_key, attempt, timeout, approval_id=None) -> CallInfo:
        return CallInfo(
            run_id=str(self.run_id),
            step_id=step_id,
            effect_key=effect_key,
            attempt=attempt,
            timeout=timeout,
            config=self.snapshot.get("config", {}),
            approval_id=approval_id,
        )

    def _read_only(self, seq, step_id, kind, tool, canonical, input_hash, recorded):
        attempt = (recorded.attempts if recorded else 0) + 1
        info = self._call_info(step_id, None, attempt, tool.timeout)
        error: BaseException | None = None
        value = None
        called_at = self.engine.monotonic()
        try:
            with self._heartbeat(tool.timeout):
                value = tool.call(canonical, info)
        except Exception as exc:
            error = exc
        self._reach(fault_points.AFTER_CALL_RETURNED, tool.name)
        verdict = classify(error)
        if verdict.verdict is Verdict.SUCCEEDED:
            value = _json_safe(value)
            values = {
                "status": StepStatus.SUCCEEDED,
                "completed_at": NOW,
                **self._result_columns(value),
            }
            if recorded is None:
                step = StepInsert(
                    {
                        "run_id": self.run_id,
                        "seq": seq,
                        "step_id": step_id,
                        "kind": kind,
                        "name": tool.name,
                        "input": Json(canonical),
                        "input_hash": input_hash,
                        "recovery": Json(tool.recovery.as_json()),
                        "attempts": 1,
                        # Recorded after the call: its start is now less the call's length.
                        "started_at": NowPlus(called_at - self.engine.monotonic()),
                        **values,
                    }
                )
            else:
                step = StepUpdate(recorded.pk, {"attempts": Sql("attempts + 1"), **values})
            self._decide(
                run_set=self._progress(step_id, new_step=recorded is None),
                step=step,
                event=Event("step_succeeded", step_id),
            )
            if recorded is None:
                self.counters["steps"] += 1
            self._reach(fault_points.AFTER_RESULT_RECORDED, tool.name)
            return ToolResult("succeeded", value, step_id=step_id)
        # Nothing a read-only tool does can have taken effect: any error is retried
        # unless it is a definite refusal or a class no retry cures.
        policy = tool.retry
        values = {
            "last_error_class": verdict.error_class,
            "last_error": verdict.message,
            "provider_retry_after": verdict.retry_after,
            "recovery": Json(tool.recovery.as_json()),
        }
        give_up = (
            verdict.verdict is Verdict.REFUSED
            or verdict.error_class in NON_RETRYABLE
            or attempt >= policy.max_attempts
            or self._past_deadline(recorded)
        )
        if give_up:
            values.update({"status": StepStatus.FAILED, "completed_at": NOW})
            self._write_attempt(
                seq,
                step_id,
                kind,
                tool.name,
                canonical,
                input_hash,
                recorded,
                values,
                run_set=self._progress(step_id, new_step=recorded is None),
            )
            if recorded is None:
                self.counters["steps"] += 1
            return ToolResult(
                "failed", error=verdict.message, error_class=verdict.error_class, step_id=step_id
            )
        delay = policy.delay(attempt, retry_after=verdict.retry_after)
        values["status"] = StepStatus.PLANNED
        if recorded is None:
            values["retry_deadline"] = NowPlus(policy.deadline)
        self._write_attempt(
            seq,
            step_id,
            kind,
            tool.name,
            canonical,
            input_hash,
            recorded,
            values,
            run_set=self._suspend_set(
                RunStatus.WAITING_FOR_RETRY, delay, new_step=recorded is None, step_id=step_id
            ),
        )
        raise Suspend(RunStatus.WAITING_FOR_RETRY, verdict.message, already_written=True)

    # --- approvals (DESIGN §8) ----------------------------------------------------------

    def _needs_approval(self, tool: Tool, args: dict[str, Any]) -> bool:
        # Decided from the run's pinned configuration, so a deploy that changes the
        # threshold never changes what an already-started run needs.
        return tool.approval is not None and bool(
            tool.approval.required(args, self.snapshot.get("config", {}))
        )

    def _plan(self, tool: Tool, step_id: str, insert: dict[str, Any]) -> Step:
        """Record a new gated effect as ``planned``: effect key and request fixed, not sent."""
        write = StepInsert({**insert, "status": StepStatus.PLANNED})
        committed = self._decide(
            run_set=self._progress(step_id),
            step=write,
            event=Event("step_planned", step_id, {"tool": tool.name, "needs": "approval"}),
            unless_cancelled=True,
        )
        self.counters["steps"] += 1
        return self._reload_pk(committed.step_pk)

    def _reload_pk(self, pk: int) -> Step:
        step = Step.objects.get(pk=pk)
        self.steps[step.seq] = step
        return step

    def _approval_consumed(self, tool: Tool, step: Step) -> bool:
        return (
            tool.approval is not None
            and self.engine.approvals.approval_for_effect(step.effect_key) is not None
        )

    def _gated_send(self, tool: Tool, step: Step) -> Step:
        """Send a planned effect once an approval bound to it still holds, or wait for one.

        Only ``planned`` steps come here: a step that is ``running`` or ``unknown``
        is settled first and never gated again (our own refund changes the
        resource fingerprint, so a check then would be wrong).
        """
        gate = self.engine.approvals
        latest = gate.latest(str(self.run_id), step.step_id)
        # Decided when the step was recorded: once an approval exists for it, the
        # gate holds whatever a later deploy's policy would say.
        if latest is None and not self._needs_approval(tool, step.input):
            return self._send(tool, step.step_id, step=step)
        if latest is None:
            raise self._request_approval(tool, step)
        if latest.status == "pending":
            raise self._await_approval(step, latest.id, "waiting for an operator's decision")
        if latest.status == "expired":
            if latest.rerequested:
                raise self._request_approval(
                    tool, step, previous=latest, changes=["the earlier request expired"]
                )
            raise self._await_approval(
                step,
                latest.id,
                "the approval request expired; an operator may request it again or cancel",
            )
        if latest.status == "rejected":
            reason = f"rejected by {latest.decided_by}" + (
                f": {latest.note}" if latest.note else ""
            )
            values = {
                "status": StepStatus.FAILED,
                "completed_at": NOW,
                "last_error_class": "approval_rejected",
                "last_error": reason,
            }
            self._decide(
                run_set=self._progress(step.step_id, new_step=False),
                step=StepUpdate(step.pk, values, only_if_status=(StepStatus.PLANNED,)),
                event=Event("step_failed", step.step_id, {"reason": "approval_rejected"}),
            )
            return _known(step, values)
        reusable = latest.status == "approved" or (
            latest.status == "consumed" and latest.consumed_by_effect_key == step.effect_key
        )
        if not reusable:
            # invalidated (the new request did not get written), or consumed by
            # another send: ask again.
            raise self._request_approval(tool, step, previous=latest)
        state = self._resource_state(tool, step)
        fingerprint = content_hash(state)
        args_hash = content_hash(step.input)
        guard = gate.consume_guard(
            latest.id,
            vendor=self.store.vendor,
            tenant_id=self.run.tenant_id,
            args_hash=args_hash,
            resource_fingerprint=fingerprint,
            effect_key=step.effect_key,
        )
        try:
            return self._send(tool, step.step_id, step=step, guard=guard, approval_id=latest.id)
        except _ApprovalRefused:
            pass
        reason = gate.explain(
            latest.id,
            tenant_id=self.run.tenant_id,
            args_hash=args_hash,
            resource_fingerprint=fingerprint,
        )
        gate.invalidate(latest.id, reason)
        raise self._request_approval(tool, step, previous=latest, changes=[reason], state=state)

    def _resource_state(self, tool: Tool, step: Step) -> dict[str, Any]:
        """Read the resource the decision depends on, from its provider."""
        info = self._call_info(step.step_id, step.effect_key, step.attempts, tool.timeout)
        try:
            with self._heartbeat(tool.timeout):
                return _json_safe(tool.approval.resource_state(step.input, info))
        except Exception as exc:
            # A read changes nothing: wait and read again.
            delay = tool.retry.delay(max(1, self.run.claim_count))
            reason = f"could not read {tool.approval.resource(step.input)}: {exc}"
            self._decide(
                run_set=self._suspend_set(
                    RunStatus.WAITING_FOR_RETRY, delay, new_step=False, step_id=step.step_id
                ),
                event=Event("waiting_for_retry", step.step_id, {"reason": reason, "delay": delay}),
            )
            raise Suspend(RunStatus.WAITING_FOR_RETRY, reason, already_written=True) from None

    def _request_approval(
        self,
        tool: Tool,
        step: Step,
        *,
        previous: ApprovalState | None = None,
        changes: list[str] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Suspend:
        policy = tool.approval
        args = step.input
        if state is None:
            state = self._resource_state(tool, step)
        changes = list(changes or [])
        if previous is not None:
            for name in sorted(set(previous.resource_state) | set(state)):
                before, after = previous.resource_state.get(name), state.get(name)
                if before != after:
                    changes.append(f"{name}: {before} → {after}")
        money = policy.amount(args) if policy.amount is not None else None
        approval_id = self.engine.approvals.request(
            ApprovalRequest(
                run_id=str(self.run_id),
                tenant_id=self.run.tenant_id,
                step_id=step.step_id,
                tool=tool.name,
                args=args,
                args_hash=content_hash(args),
                requested_by=self.run.requested_by,
                resource=policy.resource(args),
                resource_state=state,
                resource_fingerprint=content_hash(state),
                preview=policy.preview(args),
                amount=money[0] if money else None,
                currency=money[1] if money else "",
                expires_after=policy.expires_after,
                effect_key=step.effect_key,
                replaces=previous.id if previous is not None else None,
                changes=changes,
            )
        )
        return self._await_approval(step, approval_id, "waiting for an operator's decision")

    def _await_approval(self, step: Step, approval_id: int, reason: str) -> Suspend:
        """Release the run until a decision; nothing is held but a row."""
        self._decide(
            run_set=self._suspend_set(
                RunStatus.WAITING_FOR_APPROVAL, None, new_step=False, step_id=step.step_id
            ),
            event=Event(
                "waiting_for_approval", step.step_id, {"approval": approval_id, "reason": reason}
            ),
        )
        # A decision recorded while this worker was still suspending found the run
        # not yet waiting and could not resume it; look once more, after our write.
        latest = self.engine.approvals.latest(str(self.run_id), step.step_id)
        if latest is not None and (
            latest.status in ("approved", "rejected")
            or (latest.status == "expired" and latest.rerequested)
        ):
            self.engine.resume_after_approval(self.run_id, by="engine")
        return Suspend(RunStatus.WAITING_FOR_APPROVAL, reason, already_written=True)

    # --- effects -------------------------------------------------------------------

    def _send_budget(self, tool: Tool) -> float:
        return min(
            tool.timeout + self.settings.send_margin_seconds, self.settings.max_send_budget_seconds
        )

    def _effect(
        self, seq, step_id, kind, tool: Tool, canonical, input_hash, recorded, *, compensates=None
    ) -> ToolResult:
        if recorded is None:
            effect_key = make_effect_key(str(self.run_id), step_id, canonical)
            request = _json_safe(tool.request_for(canonical, self.snapshot.get("config", {})))
            insert = {
                "run_id": self.run_id,
                "seq": seq,
                "step_id": step_id,
                "kind": kind,
                "name": tool.name,
                "input": Json(canonical),
                "input_hash": input_hash,
                "recovery": Json(tool.recovery.as_json()),
                "effect_key": effect_key,
                "is_effect": True,
                "request": Json(request),
                "started_at": NOW,
                "compensates_id": compensates,
                "retry_deadline": NowPlus(tool.retry.deadline),
            }
            if kind != StepKind.COMPENSATION and self._needs_approval(tool, canonical):
                step = self._plan(tool, step_id, insert)
            else:
                step = self._send(
                    tool, step_id, insert=insert, new_step=kind != StepKind.COMPENSATION, seq=seq
                )
        else:
            step = recorded
        while True:
            if step.status == StepStatus.SUCCEEDED:
                return ToolResult("succeeded", self._load_result(step), step_id=step_id)
            if step.status == StepStatus.FAILED:
                return ToolResult(
                    "failed",
                    error=step.last_error,
                    error_class=step.last_error_class,
                    step_id=step_id,
                )
            step = self._settle(tool, step)

    def _settle(self, tool: Tool, step: Step) -> Step:
        """Take one recovery action on a step that is planned, running or unknown."""
        recovery = Recovery.from_json(step.recovery or {})
        policy = tool.retry
        if step.status == StepStatus.PLANNED:
            return self._gated_send(tool, step)
        if step.status == StepStatus.RUNNING and not step.in_flight:
            # The last answer was 409/429: the provider did not act on it.
            if self._past_deadline(step):
                if step.ambiguous_attempts == 0:
                    return self._record(
                        tool,
                        step,
                        {
                            "status": StepStatus.FAILED,
                            "completed_at": NOW,
                            "last_error": f"gave up after {step.attempts} busy answer(s): "
                            f"{step.last_error}",
                        },
                        log_entry={"action": "gave_up", "reason": "deadline"},
                    )
                return self._recover_ambiguous(tool, step, recovery, policy)
            return self._send(tool, step.step_id, step=step)
        # RUNNING and in flight (interrupted mid-call), or UNKNOWN.
        return self._recover_ambiguous(tool, step, recovery, policy)

    def _recover_ambiguous(
        self, tool: Tool, step: Step, recovery: Recovery, policy: RetryPolicy
    ) -> Step:
        interrupted = step.status == StepStatus.RUNNING and step.in_flight
        now = self.store.db_now()
        budget = self._send_budget(tool)
        within_window = (
            recovery.idempotency_window is not None
            and step.first_sent_at is not None
            and (now - step.first_sent_at).total_seconds() + budget
            < recovery.idempotency_window.total_seconds()
        )
        ambiguous = step.ambiguous_attempts + (1 if interrupted else 0)
        if within_window and ambiguous <= policy.max_ambiguous_resends:
            # The provider honours the key: the resend returns what happened.
            return self._send(tool, step.step_id, step=step, interrupted=interrupted)
        if recovery.lookup:
            # Asking is always safe; only a second send after absence is not
            # (see the absent answer in _lookup).
            if step.last_sent_at is not None:
                # A send could still land until its budget has passed: only then
                # can "not found" mean "did not happen" (DESIGN §12.1).
                landed_by = (now - step.last_sent_at).total_seconds()
                if landed_by < budget:
                    raise self._wait_for_retry(
                        step,
                        budget - landed_by,
                        interrupted,
                        reason="waiting for the last send to land",
                    )
            return self._lookup(tool, step, interrupted=interrupted)
        return self._unknown(
            step,
            interrupted=interrupted,
            reason="no idempotency window left and no lookup",
        )

    def _wait_for_retry(self, step: Step, delay: float, interrupted: bool, *, reason: str):
        values: dict[str, Any] = {"status": StepStatus.UNKNOWN, "in_flight": False}
        if interrupted:
            values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
        self._decide(
            run_set=self._suspend_set(
                RunStatus.WAITING_FOR_RETRY, delay, new_step=False, step_id=step.step_id
            ),
            step=StepUpdate(step.pk, values),
            event=Event("waiting_for_retry", step.step_id, {"reason": reason, "delay": delay}),
        )
        return Suspend(RunStatus.WAITING_FOR_RETRY, reason, already_written=True)

    def _lookup(self, tool: Tool, step: Step, *, interrupted: bool) -> Step:
        info = self._call_info(step.step_id, step.effect_key, step.attempts, tool.timeout)
        try:
            with self._heartbeat(tool.timeout):
                found: LookupResult = tool.find(step.request, info)
        except Exception as exc:
            found = LookupResult(
                "inconclusive", detail=f"lookup failed: {type(exc).__name__}: {exc}"
            )
        entry = {
            "action": "lookup",
            "outcome": found.outcome,
            "conclusive": found.conclusive,
            "detail": found.detail,
        }
        if found.outcome == "found":
            value = _json_safe(found.result or {})
            return self._record(
                tool,
                step,
                {
                    "status": StepStatus.SUCCEEDED,
                    "completed_at": NOW,
                    "in_flight": False,
                    "provider_reference": _reference(value),
                    **self._result_columns(value),
                },
                log_entry=entry,
                ambiguous=interrupted,
            )
        if found.outcome == "absent" and found.conclusive and step.resent_after_absence:
            # Sent once more after an earlier absence, and absent again: a person
            # looks before anything is sent a third time.
            return self._unknown(
                step,
                interrupted=interrupted,
                reason="absent again after the one resend that absence allows",
                log_entry=entry,
            )
        if found.outcome == "absent" and found.conclusive and self._approval_consumed(tool, step):
            # Proven absent: a new send needs a valid approval again (DESIGN §8).
            # Planned, the step goes through the gate before it is sent. A decision,
            # not a fact: a worker whose lease lapsed while it looked must not turn
            # another worker's send in flight back into "planned".
            values = {
                "status": StepStatus.PLANNED,
                "in_flight": False,
                "resent_after_absence": True,
                "recovery_log": Json([*(step.recovery_log or []), entry]),
            }
            if interrupted:
                values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
            self._decide(
                run_set=self._progress(step.step_id, new_step=False),
                step=StepUpdate(step.pk, values, only_if_status=(step.status,)),
                event=Event("step_planned", step.step_id, {"reason": "proven absent"}),
            )
            return self._reload(step.seq)
        if found.outcome == "absent" and found.conclusive:
            step = self._record(
                tool,
                step,
                {"status": StepStatus.UNKNOWN, "in_flight": False, "resent_after_absence": True},
                log_entry=entry,
                ambiguous=interrupted,
                progress=False,
            )
            return self._send(tool, step.step_id, step=step)
        return self._unknown(
            step,
            interrupted=interrupted,
            reason=found.detail or "the lookup could not tell",
            log_entry=entry,
        )

    def _unknown(
        self, step: Step, *, interrupted: bool, reason: str, log_entry: dict | None = None
    ) -> Step:
        values: dict[str, Any] = {
            "status": StepStatus.UNKNOWN,
            "in_flight": False,
            "recovery_log": Json(
                [
                    *(step.recovery_log or []),
                    *([log_entry] if log_entry else []),
                    {"action": "needs_operator", "reason": reason},
                ]
            ),
        }
        if interrupted:
            values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
        self._decide(
            run_set=self._suspend_set(
                RunStatus.EFFECT_UNKNOWN, None, new_step=False, step_id=step.step_id
            ),
            step=StepUpdate(step.pk, values),
            event=Event(
                "effect_unknown", step.step_id, {"reason": reason, "effect_key": step.effect_key}
            ),
        )
        self.engine.desk.open_case(str(self.run_id), step.pk, reason)
        raise Suspend(RunStatus.EFFECT_UNKNOWN, reason, already_written=True)

    def _send(
        self,
        tool: Tool,
        step_id: str,
        *,
        insert: dict | None = None,
        step: Step | None = None,
        new_step: bool = False,
        seq: int | None = None,
        interrupted: bool = False,
        guard: Guard | None = None,
        approval_id: int | None = None,
    ) -> Step:
        """Clear one send, make it, and record what came back.

        With ``guard`` (an approval to consume), the clearing commit writes
        nothing unless the guard matches; ``_ApprovalRefused`` then says so.
        """
        budget = self._send_budget(tool)
        arm = {"status": StepStatus.RUNNING, "in_flight": True, "last_sent_at": NOW}
        # The clearing commit extends the lease past the send budget, so no other
        # worker can claim the run while this send may still be in flight.
        run_set = {"lease_expires_at": NowPlus(budget + self.settings.lease_seconds)}
        if insert is not None:
            write = StepInsert(
                {
                    **insert,
                    **arm,
                    "first_sent_at": NOW,
                    "attempts": 1,
                    "recovery_log": Json([{"action": "send", "attempt": 1}]),
                }
            )
            if new_step:
                run_set["steps_used"] = Sql("steps_used + 1")
        else:
            assert step is not None
            values = {
                **arm,
                "attempts": Sql("attempts + 1"),
                "recovery_log": Json(
                    [
                        *(step.recovery_log or []),
                        {
                            "action": "resend" if step.first_sent_at else "send",
                            "attempt": step.attempts + 1,
                            "after": "interrupted"
                            if interrupted
                            else step.last_error_class or "planned",
                        },
                    ]
                ),
            }
            if step.first_sent_at is None:
                values["first_sent_at"] = NOW
            if interrupted:
                values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
            write = StepUpdate(step.pk, values)
        # A new effect is never sent once a cancel was requested; a resend of an
        # unsettled one is, because its outcome must be settled first.
        # A planned step is never in flight (not sent yet, or proven absent).
        first_send = insert is not None or step.status == StepStatus.PLANNED
        payload = {"tool": tool.name}
        if approval_id is not None:
            payload["approval"] = approval_id
        decision = {
            "run_set": {**run_set, "current_step": step_id},
            "step": write,
            "event": Event("effect_sent", step_id, payload),
            "unless_cancelled": first_send,
        }
        if guard is not None:
            committed = self._commit(**decision, guard=guard)
            if committed.guard_failed:
                raise _ApprovalRefused()
            if not committed.fenced:
                if committed.cancel_requested:
                    raise Finish(Ending.CANCELLED, "cancelled by request")
                raise LeaseLost()
        else:
            committed = self._decide(**decision)
        armed_at = self.engine.monotonic()
        self.lease_valid_until = armed_at + budget + self.settings.lease_seconds
        if insert is not None:
            if new_step:
                self.counters["steps"] += 1
            # What was just written, without reading it back: only the database's
            # timestamps are missing, and nothing on the way to an answer needs them.
            step = _known(_new_step_view(committed.step_pk), write.values)
        else:
            step = self._reload(step.seq)
        self._reach(fault_points.AFTER_STEP_RUNNING, tool.name)
        # Send only while the cleared budget still covers the whole call: a worker
        # that stalled here (paused, swapped) past its budget must not send.
        elapsed = self.engine.monotonic() - armed_at
        if elapsed + tool.timeout > budget:
            log.warning(
                "run %s: %s not sent; %.1fs passed since it was cleared",
                self.run_id,
                step_id,
                elapsed,
            )
            raise LeaseLost()
        if approval_id is None and tool.approval is not None:
            # A resend carries the approval its first send consumed, unchanged.
            approval_id = self.engine.approvals.approval_for_effect(step.effect_key)
        info = self._call_info(step_id, step.effect_key, step.attempts, tool.timeout, approval_id)
        error: BaseException | None = None
        value = None
        try:
            value = tool.call(step.request, info)
        except Exception as exc:
            error = exc
        self._reach(fault_points.AFTER_CALL_RETURNED, tool.name)
        verdict = classify(error)
        entry = {
            "action": "answer",
            "verdict": verdict.verdict.value,
            "error_class": verdict.error_class,
            "message": verdict.message[:500],
        }
        if verdict.verdict is Verdict.SUCCEEDED:
            value = _json_safe(value)
            return self._record(
                tool,
                step,
                {
                    "status": StepStatus.SUCCEEDED,
                    "completed_at": NOW,
                    "in_flight": False,
                    "provider_reference": _reference(value),
                    **self._result_columns(value),
                },
                log_entry=entry,
            )
        if verdict.verdict is Verdict.REFUSED:
            return self._record(
                tool,
                step,
                {
                    "status": StepStatus.FAILED,
                    "completed_at": NOW,
                    "in_flight": False,
                    "last_error_class": verdict.error_class,
                    "last_error": verdict.message,
                },
                log_entry=entry,
            )
        if verdict.verdict is Verdict.BUSY:
            delay = tool.retry.delay(step.attempts, retry_after=verdict.retry_after)
            values = {
                "status": StepStatus.RUNNING,
                "in_flight": False,
                "last_error_class": verdict.error_class,
                "last_error": verdict.message,
                "provider_retry_after": verdict.retry_after,
            }
            in_use = error is not None and getattr(error, "may_be_in_flight", False)
            if in_use:
                values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
            self._record(
                tool,
                step,
                values,
                log_entry=entry,
                progress=False,
                run_set=self._suspend_set(
                    RunStatus.WAITING_FOR_RETRY, delay, new_step=False, step_id=step_id
                ),
            )
            raise Suspend(RunStatus.WAITING_FOR_RETRY, verdict.message, already_written=True)
        # Ambiguous: it may have happened. Record that, then recover.
        step = self._record(
            tool,
            step,
            {
                "status": StepStatus.UNKNOWN,
                "in_flight": False,
                "ambiguous_attempts": Sql("ambiguous_attempts + 1"),
                "last_error_class": verdict.error_class,
                "last_error": verdict.message,
            },
            log_entry=entry,
            progress=False,
        )
        recovery = Recovery.from_json(step.recovery or {})
        if (
            recovery.idempotency_window is not None
            and step.ambiguous_attempts <= tool.retry.max_ambiguous_resends
            and not self._past_deadline(step)
        ):
            delay = tool.retry.delay(step.attempts)
            raise self._wait_for_retry(step, delay, False, reason=verdict.message)
        return step

    def _record(
        self,
        tool: Tool,
        step: Step,
        values: dict[str, Any],
        *,
        log_entry: dict | None = None,
        ambiguous: bool = False,
        progress: bool = True,
        run_set: dict | None = None,
    ) -> Step:
        """Record what a provider answered: a fact, written even if the lease is gone."""
        values = dict(values)
        if log_entry is not None:
            values["recovery_log"] = Json([*(step.recovery_log or []), log_entry])
        if ambiguous:
            values["ambiguous_attempts"] = Sql("ambiguous_attempts + 1")
        event = Event(
            "step_" + str(values.get("status", step.status)), step.step_id, {"tool": tool.name}
        )
        step_write = StepUpdate(
            step.pk,
            values,
            only_if_status=(StepStatus.PLANNED, StepStatus.RUNNING, StepStatus.UNKNOWN),
        )
        if run_set is None and (self.progress_reset or not progress):
            # Nothing to decide and nothing to reset on the run: the answer and its
            # event alone. The next decision is fenced as always.
            self.store.record_fact(self.run_id, step_write, event)
            self.cancel_unseen = True
            return self._after_record(tool, step, values)
        if run_set is None:
            run_set = self._progress(step.step_id, new_step=False)
        committed = self._commit(run_set=run_set, step=step_write, event=event, fact=True)
        if not committed.fenced:
            # The answer is on record; the decision to go on belongs to the new owner.
            raise LeaseLost()
        return self._after_record(tool, step, values)

    def _after_record(self, tool: Tool, step: Step, values: dict[str, Any]) -> Step:
        # The send's long lease is no longer needed: the next commit brings it back to
        # the normal length, so a worker that dies now is replaced in seconds.
        self.lease_valid_until = 0.0
        self._reach(fault_points.AFTER_RESULT_RECORDED, tool.name)
        if values.get("status") in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            # Settled: status, result and error are all the caller reads.
            return _known(step, values)
        # Still unsettled: recovery decisions need the database's own timestamps.
        return self._reload(step.seq)

    # --- endings ---------------------------------------------------------------------

    def _effect_facts(self) -> list[EffectFact]:
        effects = list(
            Step.objects.filter(run_id=self.run_id, is_effect=True).values_list(
                "pk", "kind", "status", "compensates_id"
            )
        )
        undone = {
            compensates
            for _, kind, status, compensates in effects
            if kind == StepKind.COMPENSATION and status == StepStatus.SUCCEEDED
        }
        return [
            EffectFact(status, compensated=pk in undone)
            for pk, kind, status, _ in effects
            if kind == StepKind.TOOL
        ]

    def _finish(self, finish: Finish) -> str:
        try:
            if finish.ending is Ending.FAILED and self._needs_compensation():
                self._decide(
                    run_set={"status": RunStatus.COMPENSATING, "outcome_detail": finish.reason},
                    event=Event("compensation_started", payload={"reason": finish.reason}),
                )
                self._compensate(reason=finish.reason)
            return self._write_end(finish)
        except Finish as inner:
            return self._write_end(inner)
        except Suspend as suspend:
            if not suspend.already_written:
                self._write_suspend(suspend)
            return f"suspended:{suspend.status}"
        except LeaseLost:
            return "lease_lost"

    def _write_end(self, finish: Finish) -> str:
        if finish.ending is Ending.CANCELLED:
            # Effects planned and never sent (waiting for approval) end with the run.
            for step in Step.objects.filter(
                run_id=self.run_id, is_effect=True, status=StepStatus.PLANNED
            ):
                self._close_cancelled(step, "cancelled before it was sent")
        try:
            status = derive_terminal_state(finish.ending, self._effect_facts())
        except NotSettled as exc:
            # Never end with an effect unsettled (DESIGN §5): wait for an operator.
            self._decide(
                run_set=self._suspend_set(
                    RunStatus.EFFECT_UNKNOWN, None, new_step=False, step_id=self.run.current_step
                ),
                event=Event("effect_unknown", payload={"reason": str(exc)}),
            )
            for pk in Step.objects.filter(
                run_id=self.run_id, is_effect=True, status__in=UNSETTLED
            ).values_list("pk", flat=True):
                self.engine.desk.open_case(str(self.run_id), pk, str(exc))
            return f"suspended:{RunStatus.EFFECT_UNKNOWN}"
        self._decide(
            run_set={
                "status": status,
                "outcome_detail": finish.reason,
                "output": Json(finish.output) if finish.output is not None else None,
                "lease_owner": "",
                "lease_expires_at": None,
                "next_attempt_at": None,
                "finished_at": NOW,
                "claim_count": 0,
            },
            event=Event("finished", payload={"status": str(status), "reason": finish.reason}),
        )
        self.engine.approvals.withdraw(str(self.run_id), f"the run ended as {status}")
        return f"finished:{status}"

    def finish_cancelled(self) -> str:
        """Finish a run the canceller claimed while it was idle."""
        steps = list(Step.objects.filter(run_id=self.run_id))
        for step in steps:
            if step.is_effect and step.status == StepStatus.PLANNED:
                continue  # never sent: closed with the run's end (_write_end)
            if step.status not in UNSETTLED:
                continue
            never_executed = (
                step.status == StepStatus.RUNNING
                and not step.in_flight
                and step.ambiguous_attempts == 0
            )
            if never_executed:
                # Its only answers were 429s: the provider never acted. Close it.
                self._close_cancelled(step, "cancelled before the provider accepted it")
                continue
            # An effect may be in flight or unknown: the worker settles it and then
            # honours the cancel at its next step boundary. Hand the run back, due now.
            self._decide(
                run_set={
                    "status": RunStatus.QUEUED,
                    "lease_owner": "",
                    "lease_expires_at": None,
                    "next_attempt_at": None,
                    "enqueued_at": NOW,
                }
            )
            self.engine.enqueue(self.run_id)
            return "handed_back"
        return self._write_end(
            Finish(Ending.CANCELLED, f"cancelled by {self.run.cancel_requested_by or 'request'}")
        )

    def _close_cancelled(self, step: Step, why: str) -> None:
        """Mark a step the provider never acted on as failed: the run was cancelled."""
        self._decide(
            run_set={},
            step=StepUpdate(
                step.pk,
                {
                    "status": StepStatus.FAILED,
                    "completed_at": NOW,
                    "last_error_class": "cancelled",
                    "last_error": why,
                },
                only_if_status=(step.status,),
            ),
            event=Event("step_failed", step.step_id, {"reason": "cancelled"}),
        )

    def _needs_compensation(self) -> bool:
        return any(True for _ in self._pending_undos())

    def _pending_undos(self):
        steps = list(Step.objects.filter(run_id=self.run_id, is_effect=True).order_by("-seq"))
        compensations = {s.compensates_id: s for s in steps if s.kind == StepKind.COMPENSATION}
        for step in steps:
            if step.kind != StepKind.TOOL or step.status != StepStatus.SUCCEEDED:
                continue
            tool = self.agent.tool(step.name) if self.agent else None
            if tool is None or tool.undo is None:
                continue
            done = compensations.get(step.pk)
            if done is not None and done.status in (StepStatus.SUCCEEDED, StepStatus.FAILED):
                continue
            yield step, tool, done

    def _compensate(self, reason: str | None = None) -> None:
        """Run the undo of every succeeded effect that has one, newest first."""
        reason = reason or self.run.outcome_detail
        for step, tool, existing in list(self._pending_undos()):
            undo_tool = self.agent.tool(tool.undo.tool)
            undo_args = undo_tool.args_model.model_validate(
                tool.undo.args(step.input, self._load_result(step))
            ).model_dump(mode="json")
            input_hash = content_hash(
                {"tool": undo_tool.name, "args": undo_args, "compensates": step.step_id}
            )
            if existing is None:
                seq = (
                    max(
                        Step.objects.filter(run_id=self.run_id).values_list("seq", flat=True),
                        default=-1,
                    )
                    + 1
                )
                step_id = f"{seq:04d}.{StepKind.COMPENSATION}.{undo_tool.name}"
            else:
                seq, step_id = existing.seq, existing.step_id
            self._perform(
                seq,
                step_id,
                StepKind.COMPENSATION,
                undo_tool,
                undo_args,
                input_hash,
                existing,
                compensates=step.pk,
            )
        raise Finish(Ending.FAILED, reason)

    # --- reconciliation (DESIGN §9) ----------------------------------------------------

    def settle(
        self,
        step_pk: int,
        resolution: str,
        *,
        by: str,
        guard: Guard,
        observed: dict[str, Any] | None,
        reference: str,
        note: str,
    ) -> str:
        step = Step.objects.get(pk=step_pk, run_id=self.run_id)
        agent = self.engine.registry.get(self.run.agent_name, self.run.agent_version)
        tool = agent.tool(step.name) if agent is not None else None
        entry = {"action": "settled", "resolution": resolution, "by": by, "note": note[:500]}
        values: dict[str, Any] = {
            "in_flight": False,
            "recovery_log": Json([*(step.recovery_log or []), entry]),
        }
        released = {
            "status": RunStatus.QUEUED,
            "lease_owner": "",
            "lease_expires_at": None,
            "next_attempt_at": None,
            "enqueued_at": NOW,
            "claim_count": 0,
        }
        reason = f"{step.step_id} settled by {by}: {resolution}"
        if resolution in ("happened", "differently"):
            value = _json_safe(observed or {})
            values.update(
                status=StepStatus.SUCCEEDED,
                completed_at=NOW,
                provider_reference=reference[:200],
                **self._result_columns(value),
            )
        elif resolution == "retry":
            # Back to planned: the gate checks any approval it needs again before
            # the send, which goes out under the same effect key (DESIGN §8, §9).
            values.update(
                status=StepStatus.PLANNED,
                resent_after_absence=True,
                # A fresh start for the resend: a 429 on it waits and tries again,
                # it does not count as the earlier sends' ambiguity.
                ambiguous_attempts=0,
                retry_deadline=NowPlus(tool.retry.deadline if tool is not None else 300.0),
            )
        else:  # cancel
            values.update(
                status=StepStatus.FAILED,
                completed_at=NOW,
                last_error_class="did_not_happen",
                last_error=f"settled by {by}: it did not happen",
            )
        if resolution in ("happened", "retry"):
            run_set = released
            if step.kind == StepKind.COMPENSATION:
                # An undo settled: the run goes on compensating, not forward.
                run_set = {**released, "status": RunStatus.COMPENSATING}
        elif resolution == "cancel":
            run_set = {"cancel_requested_at": NOW, "cancel_requested_by": by}
        elif tool is not None and tool.undo is not None:
            run_set = {**released, "status": RunStatus.COMPENSATING, "outcome_detail": reason}
        else:
            run_set = {}
        step_guard = self.store.step_guard(step.pk, values, only_if_status=(StepStatus.UNKNOWN,))
        committed = self._commit(
            run_set=run_set,
            event=Event("effect_settled", step.step_id, {"resolution": resolution, "by": by}),
            guard=[guard, step_guard],
        )
        if committed.guard_failed:
            # Someone else settled it first, or newer evidence arrived: nothing was
            # written. Give the run back as it was.
            # (A refused settle is no crash: its claim does not count toward the
            # crash-loop limit.)
            with suppress(LeaseLost):
                self._decide(
                    run_set={
                        "lease_owner": "",
                        "lease_expires_at": None,
                        "claim_count": Sql("claim_count - 1"),
                    }
                )
            return "refused"
        if not committed.fenced:
            raise LeaseLost()
        if resolution == "cancel":
            self.run.cancel_requested_by = by
            return self.finish_cancelled()
        if run_set.get("status") in (RunStatus.QUEUED, RunStatus.COMPENSATING):
            self.engine.enqueue(self.run_id)
            return f"settled:{run_set['status']}"
        # It happened differently and nothing undoes it: what remains true is that
        # an effect happened and the run cannot go on as planned.
        return self._write_end(Finish(Ending.FAILED, reason))

    def _write_suspend(self, suspend: Suspend) -> None:
        run_set = {
            "status": suspend.status,
            "lease_owner": "",
            "lease_expires_at": None,
            "claim_count": 0,
            "next_attempt_at": None if suspend.delay is None else NowPlus(suspend.delay),
        }
        if suspend.requeue:
            run_set["enqueued_at"] = NOW
        try:
            self._decide(
                run_set=run_set,
                event=Event(
                    "suspended", payload={"status": str(suspend.status), "reason": suspend.reason}
                ),
            )
        except LeaseLost:
            suspend.requeue = False

    def _write_blocked(self, blocked: Blocked) -> None:
        # A worker that lost its lease leaves the decision to the new owner.
        with suppress(LeaseLost):
            self._decide(
                run_set={
                    "status": RunStatus.BLOCKED,
                    "outcome_detail": blocked.reason,
                    "lease_owner": "",
                    "lease_expires_at": None,
                    "next_attempt_at": None,
                },
                event=Event(
                    "blocked",
                    payload={"reason": blocked.reason, "detail": _json_safe(blocked.detail)},
                ),
            )


_STEP_DEFAULTS: dict[str, Any] | None = None


class _ApprovalRefused(Exception):
    """The approval's guard matched no row: some check failed; nothing was written."""


def _new_step_view(pk: int) -> Any:
    """A step as plain attributes: a model instance costs more to build than a commit."""
    global _STEP_DEFAULTS
    if _STEP_DEFAULTS is None:
        _STEP_DEFAULTS = {f.attname: f.get_default() for f in Step._meta.concrete_fields}
    return SimpleNamespace(**{**_STEP_DEFAULTS, "id": pk, "pk": pk})


def _known(step: Step, values: dict[str, Any]) -> Step:
    """Apply written values to an in-memory step; database-side expressions are skipped."""
    for column, value in values.items():
        if isinstance(value, Json):
            value = value.value
        elif value is NOW or isinstance(value, (NowPlus, Sql)):
            continue
        setattr(step, column, value)
    return step


def _describe(step: Step) -> dict[str, Any]:
    return {
        "seq": step.seq,
        "step_id": step.step_id,
        "kind": step.kind,
        "name": step.name,
        "input_hash": step.input_hash,
        "status": step.status,
    }


def _reference(value: Any) -> str:
    if isinstance(value, dict):
        for key in ("id", "reference", "provider_reference"):
            if isinstance(value.get(key), str):
                return value[key][:200]
    return ""


def _json_safe(value: Any) -> Any:
    """Round-trip through JSON so what is recorded is exactly what replay returns."""
    if value is None:
        return None
    return json.loads(json.dumps(value, default=str))
