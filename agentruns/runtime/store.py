"""The engine's writes: one commit per transition, its RunEvent in the same commit.

Each transition is a compare-and-set on the run row plus at most one step write
and one event. On PostgreSQL it is a single statement (data-modifying CTEs) in
autocommit, server-side prepared; on SQLite it is ``BEGIN IMMEDIATE``, the
statements, ``COMMIT`` on the raw connection. Both skip the ORM's query
building, which costs more than the commit itself (see
shared/reference/step-write-cost.md and benchmarks/step_overhead.py).

The Store composes each transition; its pieces of SQL come from
agentruns/runtime/fragments.py, and agentruns/runtime/raw_connection.py runs them.

Times in WHERE clauses and in written timestamps are always the database's
clock (DESIGN §12.10): ``statement_timestamp()`` on PostgreSQL, ``'now'`` on SQLite.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from agentruns.models import Run, RunStatus, Step, StepStatus
from agentruns.runtime.approval import Guard
from agentruns.runtime.fragments import Fragments, sqlite_columns
from agentruns.runtime.raw_connection import RawConnection
from agentruns.runtime.reads import compiled_read
from agentruns.runtime.writes import (
    NOW,
    Committed,
    Event,
    Fence,
    NowPlus,
    Sql,
    StepInsert,
    StepUpdate,
)


class _GuardedRollback(Exception):
    """A later statement did not match: undo what the guards before it wrote."""

    def __init__(self, *, guard_failed: bool = False):
        super().__init__()
        self.guard_failed = guard_failed


# What a claim returns beside the version and whether a cancel was requested: every
# column it writes, and the cancel request's author (written without a new version).
# With the compare-and-set on the version the worker read, the row it read plus
# these is the row as claimed, so the worker does not read the run again
# (docs/architecture.md §3.1).
CLAIMED_COLUMNS = (
    "lease_owner",
    "lease_expires_at",
    "claim_count",
    "status",
    "next_attempt_at",
    "recovered",
    "updated_at",
    "cancel_requested_by",
)


class Store:
    def __init__(
        self,
        alias: str = "default",
        *,
        reconnect_seconds: float = 15.0,
        prepare: bool = True,
        committed: Callable[[uuid.UUID], None] | None = None,
    ):
        self.alias = alias
        # Told the run's id after each commit that wrote one of its events (the live
        # pages' doorbell, agentruns/doorbell.py). It must never raise or wait: the
        # commit is made whatever it does.
        self.committed: Callable[[uuid.UUID], None] = committed or (lambda run_id: None)
        # Where the statements run: preparation (off behind a pooler that cannot keep
        # it) and how long one is retried while the connection is lost.
        self.db = RawConnection(alias, prepare=prepare, reconnect_seconds=reconnect_seconds)
        self.vendor = self.db.vendor
        # The statements' pieces, in this database's dialect (agentruns/runtime/fragments.py).
        self.sql = Fragments(self.vendor)
        self.now_sql = self.sql.now_sql

    # --- the engine's writes for a claimed run -------------------------------------
    #
    # A decision writes nothing unless the run's compare-and-set (the fence: the
    # claimed version, the owner, an unexpired lease) matches. A fact, what a
    # provider answered, is written to its step whatever happened to the lease.

    def decide(
        self,
        fence: Fence,
        run_set: dict[str, Any],
        *,
        step: StepInsert | StepUpdate | None = None,
        event: Event | None = None,
        unless_cancelled: bool = False,
    ) -> Committed:
        """A decision in one commit: the run's fenced update, its step, its event.

        ``unless_cancelled`` also refuses the decision once a cancel was requested
        (a new effect is never sent after that); the result then says so.
        """
        run_sql, run_params = self._run_update(
            run_set, *self._fenced(fence), unless_cancelled=unless_cancelled
        )
        return self._transition(
            run_sql, run_params, step, event, run_id=fence.run_id, unless_cancelled=unless_cancelled
        )

    def record(
        self, fence: Fence, run_set: dict[str, Any], *, step: StepUpdate, event: Event
    ) -> Committed:
        """A fact and the decision beside it: the step is written whatever happened
        to the lease; only the run's part (``run_set``) is fenced."""
        run_sql, run_params = self._run_update(run_set, *self._fenced(fence))
        return self._transition(run_sql, run_params, step, event, run_id=fence.run_id, fact=True)

    def decide_guarded(
        self,
        fence: Fence,
        run_set: dict[str, Any],
        *,
        guards: list[Guard],
        step: StepInsert | StepUpdate | None = None,
        event: Event | None = None,
        unless_cancelled: bool = False,
    ) -> Committed:
        """A decision with guards: statements in the same commit that must each write
        exactly one row, or nothing is written. How an approval is consumed in the
        commit that clears its send, and how a reconciliation case and its step are
        settled together. ``guard_failed`` in the result says a guard matched nothing.
        """
        run_sql, run_params = self._run_update(
            run_set, *self._fenced(fence), unless_cancelled=unless_cancelled
        )
        committed = self._guarded(guards, run_sql, run_params, step, event)
        if event is not None and committed.fenced:
            self.committed(fence.run_id)
        if unless_cancelled and not committed.fenced and not committed.guard_failed:
            return replace(committed, cancel_requested=self.cancel_requested(fence.run_id))
        return committed

    def renew_lease(self, fence: Fence, seconds: float) -> bool:
        """Extend the lease under the same version: a heartbeat decides nothing."""
        run_sql, run_params = self._run_update(
            {"lease_expires_at": NowPlus(seconds)}, *self._fenced(fence), bump_version=False
        )
        # Not retried: a renewal that misses is the heartbeat's to try next time, and
        # the call it renews for must not wait on an outage to finish.
        return self._transition(
            run_sql, run_params, None, None, run_id=fence.run_id, reconnect_seconds=0
        ).fenced

    # --- claims and wake-ups: each its own compare-and-set, no fence -----------------

    def claim(
        self,
        run_id: uuid.UUID,
        *,
        version: int,
        owner: str,
        lease_seconds: float,
        statuses: list[str],
        due_only: bool,
        keep_status: bool,
        payload: dict[str, Any],
    ) -> Committed:
        """Take a run's lease: ``fenced`` says whether this caller got it.

        The compare-and-set on ``state_version`` makes two workers that read the
        same row race on one UPDATE: exactly one matches. Due time and lease
        expiry are compared with the database's clock, never a worker's.
        """
        params: list[Any] = []
        where = (
            f"id = {self.sql.value(run_id, params)} AND state_version = %s "
            f"AND status IN ({', '.join('%s' for _ in statuses)}) "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < {self.now_sql})"
        )
        params.extend([version, *statuses])
        if due_only:
            where += f" AND (next_attempt_at IS NULL OR next_attempt_at <= {self.now_sql})"
        run_set = {
            "lease_owner": owner,
            "lease_expires_at": NowPlus(lease_seconds),
            "claim_count": Sql("claim_count + 1"),
            "status": Sql("status") if keep_status else RunStatus.RUNNING.value,
            "next_attempt_at": None,
            # Every release empties lease_owner; a claim that finds it set takes the run
            # over from a holder whose lease expired (it died, stalled or gave up).
            "recovered": Sql("recovered OR lease_owner <> ''"),
        }
        run_sql, run_params = self._run_update(run_set, where, params, returning=CLAIMED_COLUMNS)
        return self._transition(
            run_sql,
            run_params,
            None,
            Event("claimed", payload=payload),
            returning=CLAIMED_COLUMNS,
            run_id=run_id,
        )

    def mark_cancel_requested(self, run_id: uuid.UUID, *, by: str) -> bool:
        """Record a cancel request once; the run's holder honours it at its next boundary."""
        params: list[Any] = []
        where = f"id = {self.sql.value(run_id, params)} AND cancel_requested_at IS NULL"
        run_sql, run_params = self._run_update(
            {"cancel_requested_at": NOW, "cancel_requested_by": by},
            where,
            params,
            bump_version=False,
        )
        event = Event("cancel_requested", payload={"by": by})
        return self._transition(run_sql, run_params, None, event, run_id=run_id).fenced

    def mark_due(self, run_id: uuid.UUID, *, statuses: list[str], by: str) -> bool:
        """Make a waiting run due now (an operator's "retry now"); True if it was waiting."""
        params: list[Any] = []
        where = (
            f"id = {self.sql.value(run_id, params)} "
            f"AND status IN ({', '.join('%s' for _ in statuses)})"
        )
        params.extend(statuses)
        run_sql, run_params = self._run_update(
            {"next_attempt_at": NOW, "enqueued_at": NOW, "retried": True}, where, params
        )
        event = Event("woken", payload={"by": by})
        return self._transition(run_sql, run_params, None, event, run_id=run_id).fenced

    def requeue_if_settled(self, run_id: uuid.UUID, *, by: str) -> bool:
        """Queue a run waiting for reconciliation once none of its effects is unsettled
        and nobody holds it; True if it was queued."""
        params: list[Any] = []
        run_sql = self.sql.value(run_id, params)
        params.append(RunStatus.EFFECT_UNKNOWN.value)
        step_run_sql = self.sql.value(run_id, params)
        params.extend([StepStatus.RUNNING.value, StepStatus.UNKNOWN.value])
        where = (
            f"id = {run_sql} AND status = %s AND NOT EXISTS (SELECT 1 FROM agentruns_step "
            f"WHERE run_id = {step_run_sql} AND is_effect AND status IN (%s, %s)) "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < {self.now_sql})"
        )
        # Its unknown effects were settled (a late answer, the case closed): reconciled.
        return self._queue(
            run_id,
            where,
            params,
            Event("resumed", payload={"by": by, "reason": "effects settled"}),
            reconciled=True,
        )

    def resume_waiting_for_approval(self, run_id: uuid.UUID, *, by: str) -> bool:
        """Queue a run waiting for approval unless someone holds it (a canceller
        finishing it, say); True if it was queued."""
        params: list[Any] = []
        where = (
            f"id = {self.sql.value(run_id, params)} AND status = %s "
            f"AND (lease_expires_at IS NULL OR lease_expires_at < {self.now_sql})"
        )
        params.append(RunStatus.WAITING_FOR_APPROVAL.value)
        return self._queue(run_id, where, params, Event("resumed", payload={"by": by}))

    def _queue(
        self, run_id: uuid.UUID, where: str, params: list[Any], event: Event, **marks: bool
    ) -> bool:
        run_set = {
            "status": RunStatus.QUEUED.value,
            "next_attempt_at": None,
            "enqueued_at": NOW,
            **marks,
        }
        run_sql, run_params = self._run_update(run_set, where, params)
        return self._transition(run_sql, run_params, None, event, run_id=run_id).fenced

    # --- how a transition is written ------------------------------------------------

    def _fenced(self, fence: Fence) -> tuple[str, list[Any]]:
        params: list[Any] = []
        return self.sql.fence_where(fence, params), params

    def _run_update(
        self,
        run_set: dict[str, Any],
        where_sql: str,
        where_params: list[Any],
        *,
        bump_version: bool = True,
        unless_cancelled: bool = False,
        returning: tuple[str, ...] = (),
    ) -> tuple[str, list[Any]]:
        params: list[Any] = []
        assignments = dict(run_set)
        if bump_version:
            assignments = {"state_version": Sql("state_version + 1"), **assignments}
        assignments.setdefault("updated_at", NOW)
        set_sql = self.sql.assignments(assignments, params)
        params.extend(where_params)
        if unless_cancelled:
            where_sql += " AND cancel_requested_at IS NULL"
        sql = (
            f"UPDATE agentruns_run SET {set_sql} WHERE {where_sql} "
            "RETURNING id, state_version, cancel_requested_at"
            + "".join(f", {column}" for column in returning)
        )
        return sql, params

    def _transition(
        self,
        run_sql: str,
        run_params: list[Any],
        step: StepInsert | StepUpdate | None,
        event: Event | None,
        *,
        run_id: uuid.UUID | None = None,
        fact: bool = False,
        unless_cancelled: bool = False,
        reconnect_seconds: float | None = None,
        returning: tuple[str, ...] = (),
    ) -> Committed:
        if self.vendor == "postgresql":
            committed = self._transition_pg(
                run_sql, run_params, step, event, fact, run_id, reconnect_seconds, returning
            )
        else:
            committed = self._transition_sqlite(
                run_sql, run_params, step, event, fact, run_id, returning
            )
        if event is not None and committed.fenced and run_id is not None:
            self.committed(run_id)
        if unless_cancelled and not committed.fenced and run_id is not None:
            return replace(committed, cancel_requested=self.cancel_requested(run_id))
        return committed

    def _guarded(self, guards: list[Guard], run_sql, run_params, step, event) -> Committed:
        return self.db.retried(lambda: self._guarded_once(guards, run_sql, run_params, step, event))

    def _guarded_once(self, guards: list[Guard], run_sql, run_params, step, event) -> Committed:
        """The guards, then the fenced transition, in one explicit transaction.

        Both backends run the guards first: when one matches no row nothing else
        is tried. When they match and the run's compare-and-set then fails (the
        lease is gone), the transaction is rolled back, so a guard's write never
        outlives the decision it was part of.
        """
        try:
            with self.db.transaction() as execute:
                return self._guarded_statements(
                    lambda sql, params: execute(sql, params).fetchone(),
                    guards,
                    run_sql,
                    run_params,
                    step,
                    event,
                )
        except _GuardedRollback as rollback:
            return Committed(False, None, False, None, guard_failed=rollback.guard_failed)

    def _guarded_statements(self, execute, guards, run_sql, run_params, step, event) -> Committed:
        for index, guard in enumerate(guards):
            if execute(guard.sql, guard.params) is None:
                if index:
                    raise _GuardedRollback(guard_failed=True)  # undo the earlier guards
                return Committed(False, None, False, None, guard_failed=True)
        row = execute(run_sql, run_params)
        if row is None:
            raise _GuardedRollback()
        run_value, version, cancel_requested = row
        step_pk = None
        if step is not None:
            params: list[Any] = []
            written = execute(self.sql.step_sql(step, params, source=None), params)
            step_pk = written[0] if written else None
        if event is not None:
            params = []
            sql = self.sql.event_sql(
                event,
                params,
                run=run_value,
                version_sql="%s",
                version_params=(version,),
                tail=" RETURNING id",
            )
            execute(sql, params)
        return Committed(True, version, bool(cancel_requested), step_pk)

    def step_guard(
        self, pk: int, values: dict[str, Any], *, only_if_status: tuple[str, ...]
    ) -> Guard:
        """A step write as a guard: it must match (the step still in one of the
        statuses) for the transition it is part of to commit."""
        params: list[Any] = []
        sql = self.sql.step_sql(StepUpdate(pk, values, only_if_status), params, source=None)
        return Guard(sql, params)

    def cancel_requested(self, run_id: uuid.UUID) -> bool:
        params: list[Any] = []
        sql = (
            "SELECT cancel_requested_at IS NOT NULL FROM agentruns_run "
            f"WHERE id = {self.sql.value(run_id, params)}"
        )
        row = self.db.fetch_one(sql, params)
        return bool(row and row[0])

    def _transition_pg(
        self, run_sql, run_params, step, event, fact, run_id, reconnect_seconds, returning=()
    ):
        params: list[Any] = []
        ctes = []
        if step is not None and fact:
            ctes.append(f"s AS ({self.sql.step_sql(step, params, source=None)})")
            ctes.append(f"r AS ({run_sql})")
            params.extend(run_params)
        else:
            ctes.append(f"r AS ({run_sql})")
            params.extend(run_params)
            if step is not None:
                ctes.append(f"s AS ({self.sql.step_sql(step, params, source='r')})")
        if event is not None and fact:
            # Written whether or not the run's part matched, under the version then.
            event_sql = self.sql.event_sql(
                event,
                params,
                run=run_id,
                version_sql=(
                    "COALESCE((SELECT state_version FROM r), "
                    "(SELECT state_version FROM agentruns_run WHERE id = %s))"
                ),
                version_params=(run_id,),
            )
            ctes.append(f"e AS ({event_sql})")
        elif event is not None:
            event_sql = self.sql.event_sql(
                event, params, run=Sql("r.id"), version_sql="r.state_version", tail=" FROM r"
            )
            ctes.append(f"e AS ({event_sql})")
        step_select = "(SELECT id FROM s)" if step is not None else "NULL"
        sql = (
            f"WITH {', '.join(ctes)} SELECT (SELECT state_version FROM r), "
            f"(SELECT cancel_requested_at FROM r) IS NOT NULL, "
            f"(SELECT count(*) FROM r), {step_select}"
            + "".join(f", (SELECT {column} FROM r)" for column in returning)
        )
        row = self.db.fetch_one(sql, params, reconnect_seconds=reconnect_seconds)
        version, cancel_requested, matched, step_pk = row[:4]
        claimed = dict(zip(returning, row[4:], strict=True)) if returning and matched else None
        return Committed(bool(matched), version, bool(cancel_requested), step_pk, claimed=claimed)

    def _transition_sqlite(self, run_sql, run_params, step, event, fact, run_id, returning=()):
        with self.db.transaction() as execute:
            row = execute(run_sql, run_params).fetchone()
            fenced = row is not None
            if not fenced and not fact:
                # Nothing was written; the empty transaction commits as a no-op.
                return Committed(False, None, False, None)
            version = row[1] if fenced else None
            cancel_requested = bool(row[2]) if fenced else False
            claimed = sqlite_columns(returning, row[3:]) if returning and fenced else None
            step_pk = None
            if step is not None:
                params: list[Any] = []
                written = execute(self.sql.step_sql(step, params, source=None), params)
                step_row = written.fetchone()
                step_pk = step_row[0] if step_row else None
            if event is not None:
                if version is None:
                    current = execute(
                        "SELECT state_version FROM agentruns_run WHERE id = %s",
                        [self.sql.bind(run_id)],
                    ).fetchone()
                    event_version = current[0] if current else -1
                else:
                    event_version = version
                params = []
                sql = self.sql.event_sql(
                    event,
                    params,
                    run=row[0] if fenced else run_id,
                    version_sql="%s",
                    version_params=(event_version,),
                )
                execute(sql, params)
        return Committed(fenced, version, cancel_requested, step_pk, claimed=claimed)

    def record_fact(self, run_id: uuid.UUID, step: StepUpdate, event: Event) -> bool:
        """Record what a provider answered, with its event, touching nothing of the run.

        No decision is made here, so nothing is fenced: the worker's next decision
        is. Returns whether the step was still unsettled and so was written. An
        answer that arrives after the step was settled (by an operator, say) is not
        written over it; its event says so (``late_answer_ignored``) instead of
        claiming a change that did not happen.
        """
        step_params: list[Any] = []
        step_sql = self.sql.step_sql(step, step_params, source=None)
        ignored = Event(
            "late_answer_ignored", event.step_id, {**event.payload, "answer": event.type}
        )
        version_sql = "(SELECT state_version FROM agentruns_run WHERE id = %s)"
        version_params = (self.sql.bind(run_id),)
        if self.vendor == "postgresql":
            written_params: list[Any] = []
            written_sql = self.sql.event_sql(
                event,
                written_params,
                run=run_id,
                version_sql=version_sql,
                version_params=version_params,
                tail=" WHERE EXISTS (SELECT 1 FROM s)",
            )
            ignored_params: list[Any] = []
            ignored_sql = self.sql.event_sql(
                ignored,
                ignored_params,
                run=run_id,
                version_sql=version_sql,
                version_params=version_params,
                tail=" WHERE NOT EXISTS (SELECT 1 FROM s)",
            )
            row = self.db.fetch_one(
                f"WITH s AS ({step_sql}), e AS ({written_sql}), i AS ({ignored_sql}) "
                "SELECT count(*) FROM s",
                [*step_params, *written_params, *ignored_params],
            )
            return bool(row[0])
        with self.db.transaction() as execute:
            written = execute(step_sql, step_params).fetchone()
            params: list[Any] = []
            sql = self.sql.event_sql(
                event if written is not None else ignored,
                params,
                run=run_id,
                version_sql=version_sql,
                version_params=version_params,
            )
            execute(sql, params)
        return written is not None

    # --- reads -------------------------------------------------------------------

    def run_read(self, run_id: uuid.UUID) -> Run | None:
        """The run, as a worker reads it before its claim."""
        read = compiled_read("run", lambda some_id: Run.objects.filter(pk=some_id), self.alias)
        found = read.models(self.db.fetch_all(read.sql, read.params_for(run_id)))
        return found[0] if found else None

    def steps_read(self, run_id: uuid.UUID) -> list[Step]:
        """The run's recorded steps, as a claim replays them."""
        read = compiled_read(
            "steps", lambda some_id: Step.objects.filter(run_id=some_id), self.alias
        )
        return read.models(self.db.fetch_all(read.sql, read.params_for(run_id)))

    def db_now(self) -> datetime:
        return self.db.db_now()
