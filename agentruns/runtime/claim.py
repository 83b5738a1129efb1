"""One claim of one run: the replay loop, the position, the boundary checks, the commits.

A ``Claim`` exists while a worker holds a run's lease. It replays the agent's
code from the top against the recorded steps (each ``ctx.*`` call takes the
next position), lets the step kinds (``values``, ``model_steps``,
``tool_steps``) perform the first unrecorded step(s), and writes every
transition through its fence: a worker that lost its lease fails its next
decision and stops without acting. The step kinds are plain functions over a
claim; what they share lives here.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NoReturn

from agentruns.models import Run, RunStatus, Step, StepKind
from agentruns.runtime import endings, observe
from agentruns.runtime.context import RunContext
from agentruns.runtime.control import (
    Abandon,
    Blocked,
    Divergence,
    Finish,
    LeaseLost,
    Stop,
    Suspend,
)
from agentruns.runtime.heartbeat import HEARTBEAT
from agentruns.runtime.outcomes import Ending
from agentruns.runtime.results import describe, json_safe, result_columns
from agentruns.runtime.tools import CallInfo
from agentruns.runtime.writes import (
    NOW,
    Committed,
    Event,
    Fence,
    Json,
    NowPlus,
    Sql,
    StepInsert,
    StepUpdate,
)

if TYPE_CHECKING:
    from agentruns.runtime.approval import Guard
    from agentruns.runtime.engine import Engine
    from agentruns.runtime.registry import Agent

log = logging.getLogger("holdfast.engine")


class Claim:
    """A worker's hold on one run, from its claim to its last fenced write."""

    def __init__(self, engine: Engine, run: Run, owner: str, claimed: Committed):
        self.engine = engine
        self.settings = engine.settings
        self.store = engine.store
        self.run_id: uuid.UUID = run.id
        self.run = run
        self.snapshot: dict[str, Any] = run.agent_snapshot or {}
        self.fence = Fence(run.id, claimed.state_version, owner)
        self.cancel_requested = claimed.cancel_requested
        self.started = engine.monotonic()
        # This worker's own estimate of its lease; the database's check is the truth.
        self.lease_valid_until = self.started + engine.settings.lease_seconds
        self.steps: dict[int, Step] = {}
        # Whether ``steps`` holds every step the run had when claimed (the replay loads
        # them; a canceller or a settler does not), and whether this claim asked to
        # insert an effect step since: together they tell a run without effects.
        self.steps_loaded = False
        self.inserted_effect = False
        self.next_seq = 0
        self.wrote_step = False
        # Whether this claim has reset the run's crash-loop counter yet.
        self.progress_reset = False
        # A fact was recorded without reading the run: a cancel may be unseen.
        self.cancel_unseen = False
        self.agent: Agent | None = None
        # What the agent declared its ending means (ctx.outcome), replayed or new.
        self.declared_outcome: tuple[str, str] | None = None
        observe.claimed(run.agent_name, took_over=bool(run.lease_owner))  # read before the claim
        # The claim returned what it wrote; the rest of the row is as this worker read
        # it, since the claim's compare-and-set matched the version it read (§3.1).
        for column, value in claimed.claimed.items():
            setattr(run, column, value)
        run.state_version = claimed.state_version
        self.counters = {
            "steps": run.steps_used,
            "model_calls": run.model_calls_used,
            "tokens": run.tokens_used,
            "cost_micros": run.cost_micros,
        }

    # --- the replay loop ------------------------------------------------------------

    @observe.run_scoped
    def execute(self) -> str:
        """Advance the run until it suspends, finishes or is blocked; say which."""
        try:
            try:
                return self._replay()
            except Stop:
                raise
            except Exception as exc:  # the engine's own failure, not the agent's
                raise Abandon(exc) from exc
        except Suspend as suspend:
            return self.suspended(suspend)
        except Finish as finish:
            return endings.finish(self, finish)
        except Blocked as blocked:
            endings.write_blocked(self, blocked)
            return "blocked"
        except LeaseLost:
            log.info("run %s: lease lost by %s", self.run_id, self.fence.owner)
            return "lease_lost"
        except Abandon as abandon:
            log.exception(
                "run %s: abandoned by %s", self.run_id, self.fence.owner, exc_info=abandon.cause
            )
            return "abandoned"

    def _replay(self) -> NoReturn:
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
        self.steps = {step.seq: step for step in self.store.steps_read(self.run_id)}
        self.steps_loaded = True
        if run.status == RunStatus.COMPENSATING:
            endings.compensate(self)
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
                    "recorded": describe(first),
                    "requested": {"seq": self.next_seq, "finished": True},
                },
            )
        raise Finish(Ending.COMPLETED, "", output=json_safe(output))

    def suspended(self, suspend: Suspend) -> str:
        """The run was released (its suspension is already written)."""
        if suspend.requeue:
            self.engine.enqueue(self.run_id)
        return f"suspended:{suspend.status}"

    # --- step identity --------------------------------------------------------------

    def position(
        self, kind: str, name: str, input_hash: str, *, input: Any = None
    ) -> tuple[int, str, Step | None]:
        """Take the next position; return it, its step id and the step recorded there.

        ``input`` (what ``input_hash`` hashes) is shown beside the recorded step's
        input when the two differ, so the divergence shows both sides.
        """
        seq = self.next_seq
        self.next_seq += 1
        step_id = f"{seq:04d}.{kind}.{name}"
        recorded = self.steps.get(seq)
        if recorded is not None and (
            recorded.kind != kind or recorded.name != name or recorded.input_hash != input_hash
        ):
            asked = {"seq": seq, "kind": kind, "name": name, "input_hash": input_hash}
            was = describe(recorded)
            if input is not None:
                asked["input"] = json_safe(input)
                was["input"] = recorded.input
            same_call = recorded.kind == kind and recorded.name == name
            raise Divergence(
                f"replay diverged at step {seq}: recorded {recorded.step_id}, "
                f"code now asks for {step_id}{' with other input' if same_call else ''}",
                {"recorded": was, "requested": asked},
            )
        return seq, step_id, recorded

    def boundary(self, *, forward: bool, model: bool = False, effect: bool = False) -> None:
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
            self.suspend(RunStatus.QUEUED, "time slice used up", requeue=True)
        if forward and self.engine.stopping():
            # The worker is shutting down: another one continues the run at once.
            self.suspend(RunStatus.QUEUED, "the worker is shutting down", requeue=True)
        if forward:
            self._check_budget(model=model)

    def _check_budget(self, *, model: bool) -> None:
        # Every run's snapshot holds its whole budget (Budget.as_json, pinned at start).
        budget = self.snapshot["budget"]
        used = self.counters
        exceeded = None
        if used["steps"] >= budget["max_steps"]:
            exceeded = f"max_steps ({budget['max_steps']})"
        elif model and used["model_calls"] >= budget["max_model_calls"]:
            exceeded = f"max_model_calls ({budget['max_model_calls']})"
        elif model and used["tokens"] >= budget["max_tokens"]:
            exceeded = f"max_tokens ({budget['max_tokens']})"
        elif model and used["cost_micros"] >= budget["max_cost_micros"]:
            exceeded = f"max_cost ({Decimal(budget['max_cost_micros']) / 1_000_000} USD)"
        if exceeded:
            raise Finish(Ending.FAILED, f"budget exhausted: {exceeded}")

    def reach(self, point: str, name: str) -> None:
        self.engine.faults.reach(point, name)

    # --- commits ----------------------------------------------------------------------

    @staticmethod
    def _marked(run_set: dict[str, Any], step: StepInsert | StepUpdate | None) -> dict[str, Any]:
        """The run's part of a commit, with the marks its step write implies."""
        run_set = dict(run_set or {})
        if isinstance(step, StepUpdate) and step.another_attempt:
            run_set["retried"] = True
        return run_set

    def _renewal(self, run_set: dict[str, Any]) -> float | None:
        """Renew the lease with this write when a third of it is used up.

        Not on every step: an unchanged lease column lets PostgreSQL update the
        run row in place (HOT), which halves what each step writes. Returns when
        the renewal was asked for, or None.
        """
        lease = self.settings.lease_seconds
        if "lease_expires_at" in run_set:
            return None
        now = self.engine.monotonic()
        if self.lease_valid_until - now >= lease * 2 / 3:
            return None
        run_set["lease_expires_at"] = NowPlus(lease)
        return now

    def _committed(
        self, committed: Committed, run_set: dict[str, Any], wrote_step: bool, renewed_at
    ) -> Committed:
        if committed.fenced:
            self.cancel_unseen = False
            if run_set.get("claim_count") == 0:
                self.progress_reset = True
            if renewed_at is not None:
                self.lease_valid_until = renewed_at + self.settings.lease_seconds
            if wrote_step:
                self.wrote_step = True
            self.fence = Fence(self.fence.run_id, committed.state_version, self.fence.owner)
            self.cancel_requested = committed.cancel_requested
        return committed

    def decide(
        self,
        run_set: dict[str, Any] | None = None,
        *,
        step: StepInsert | StepUpdate | None = None,
        event: Event | None = None,
        unless_cancelled: bool = False,
    ) -> Committed:
        """A fenced decision; raises ``LeaseLost`` (or ``Finish`` on a cancel) if refused."""
        self._note_effect(step)
        run_set = self._marked(run_set, step)
        renewed_at = self._renewal(run_set)
        committed = self.store.decide(
            self.fence, run_set, step=step, event=event, unless_cancelled=unless_cancelled
        )
        self._committed(committed, run_set, step is not None, renewed_at)
        if not committed.fenced:
            if unless_cancelled and committed.cancel_requested:
                raise Finish(Ending.CANCELLED, "cancelled by request")
            raise LeaseLost()
        return committed

    def decide_guarded(
        self,
        run_set: dict[str, Any],
        *,
        guards: list[Guard],
        step: StepInsert | StepUpdate | None = None,
        event: Event | None = None,
        unless_cancelled: bool = False,
    ) -> Committed:
        """A fenced decision with guards. A guard that matched nothing comes back as
        ``guard_failed`` (nothing was written); a lost fence raises as ``decide`` does."""
        self._note_effect(step)
        run_set = self._marked(run_set, step)
        renewed_at = self._renewal(run_set)
        committed = self.store.decide_guarded(
            self.fence,
            run_set,
            guards=guards,
            step=step,
            event=event,
            unless_cancelled=unless_cancelled,
        )
        self._committed(committed, run_set, step is not None, renewed_at)
        if committed.guard_failed or committed.fenced:
            return committed
        if unless_cancelled and committed.cancel_requested:
            raise Finish(Ending.CANCELLED, "cancelled by request")
        raise LeaseLost()

    def record(self, run_set: dict[str, Any], *, step: StepUpdate, event: Event) -> Committed:
        """A fact with the decision beside it; the fact stays written if the fence fails."""
        run_set = self._marked(run_set, step)
        renewed_at = self._renewal(run_set)
        committed = self.store.record(self.fence, run_set, step=step, event=event)
        return self._committed(committed, run_set, True, renewed_at)

    def _note_effect(self, step: StepInsert | StepUpdate | None) -> None:
        # Noted before the commit, whether or not it matches: a run is only ever
        # taken for one without effects when it certainly is one.
        if isinstance(step, StepInsert) and step.values.get("is_effect"):
            self.inserted_effect = True

    def may_have_effects(self) -> bool:
        """False only when the run certainly has no effect step: none was recorded when
        it was claimed and this claim inserted none (only a lease holder inserts steps)."""
        if not self.steps_loaded or self.inserted_effect:
            return True
        return any(step.is_effect for step in self.steps.values())

    def release(self, suspend: Suspend) -> None:
        """Write a suspension: the lease released, the run in ``suspend.status``."""
        run_set = {
            "status": suspend.status,
            "lease_owner": "",
            "lease_expires_at": None,
            "claim_count": 0,
            "next_attempt_at": None,
        }
        if suspend.requeue:
            run_set["enqueued_at"] = NOW
        try:
            self.decide(
                run_set,
                event=Event(
                    "suspended", payload={"status": str(suspend.status), "reason": suspend.reason}
                ),
            )
        except LeaseLost:
            suspend.requeue = False

    def suspend(self, status: str, reason: str, *, requeue: bool = False) -> NoReturn:
        """Release the run now and stop."""
        suspend = Suspend(status, reason, requeue=requeue)
        self.release(suspend)
        raise suspend

    # --- what commits are made of -------------------------------------------------------

    def progress(self, step_id: str, *, new_step: bool = True, **extra: Any) -> dict[str, Any]:
        """The run's part of a step that moved forward: the crash-loop counter resets."""
        run_set: dict[str, Any] = {"claim_count": 0, "current_step": step_id}
        if new_step:
            run_set["steps_used"] = Sql("steps_used + 1")
        run_set.update(extra)
        return run_set

    def waiting(
        self, status: str, delay: float | None, *, new_step: bool, step_id: str
    ) -> dict[str, Any]:
        """The run's part of a step that suspends it: released, due after ``delay``."""
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

    def step_write(
        self,
        recorded: Step | None,
        values: dict[str, Any],
        *,
        seq: int,
        step_id: str,
        kind: str,
        name: str,
        input: Any = None,
        input_hash: str = "",
        started_at: Any = NOW,
    ) -> StepInsert | StepUpdate:
        """The one way a step's attempt is written: a new step, or one more attempt."""
        if recorded is not None:
            return StepUpdate(
                recorded.pk, {"attempts": Sql("attempts + 1"), **values}, another_attempt=True
            )
        insert = {
            "run_id": self.run_id,
            "seq": seq,
            "step_id": step_id,
            "kind": kind,
            "name": name,
            "input_hash": input_hash,
            "attempts": 1,
            "started_at": started_at,
            **values,
        }
        if input is not None:
            insert["input"] = Json(input)
        return StepInsert(insert)

    def result_columns(self, value: Any) -> dict[str, Any]:
        return result_columns(value, inline_limit=self.settings.inline_result_limit)

    def called_at(self, started: float) -> NowPlus:
        """When a call that started at monotonic ``started`` began, by the database's clock:
        steps recorded after their call are stamped with its real start."""
        return NowPlus(started - self.engine.monotonic())

    def reload(self, seq: int) -> Step:
        step = Step.objects.get(run_id=self.run_id, seq=seq)
        self.steps[seq] = step
        return step

    def reload_pk(self, pk: int) -> Step:
        step = Step.objects.get(pk=pk)
        self.steps[step.seq] = step
        return step

    def past_deadline(self, recorded: Step | None) -> bool:
        if recorded is None or recorded.retry_deadline is None:
            return False
        return self.store.db_now() >= recorded.retry_deadline

    def call_info(
        self,
        step_id: str,
        effect_key: str | None,
        attempt: int,
        timeout: float,
        approval_id: int | None = None,
    ) -> CallInfo:
        return CallInfo.for_run(
            self.run,
            step_id=step_id,
            effect_key=effect_key,
            attempt=attempt,
            timeout=timeout,
            credential_source=self.engine.credentials,
            approval_id=approval_id,
        )

    # --- while a call is out ----------------------------------------------------------

    @contextmanager
    def heartbeat(self, timeout: float) -> Iterator[None]:
        """Renew the lease while a call is within its timeout, and not a moment longer.

        Renewals stop once the call has outlived its timeout: a worker that
        cannot prove progress must let its lease expire. They are the process's
        heartbeat thread's (agentruns/runtime/heartbeat.py).
        """
        interval = self.settings.lease_seconds / 3
        if timeout <= interval:
            yield
            return
        with HEARTBEAT.covering(
            self.store,
            self.fence,
            lease=self.settings.lease_seconds,
            interval=interval,
            deadline=self.engine.monotonic() + timeout,
            monotonic=self.engine.monotonic,
        ):
            yield
