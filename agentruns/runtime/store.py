"""The engine's writes: one commit per transition, its RunEvent in the same commit.

Each transition is a compare-and-set on the run row plus at most one step write
and one event. On PostgreSQL it is a single statement (data-modifying CTEs) in
autocommit, server-side prepared; on SQLite it is ``BEGIN IMMEDIATE``, the
statements, ``COMMIT`` on the raw connection. Both skip the ORM's query
building, which costs more than the commit itself (see
shared/reference/step-write-cost.md and benchmarks/step_overhead.py).

Times in WHERE clauses and in written timestamps are always the database's
clock (DESIGN §12.10): ``statement_timestamp()`` on PostgreSQL, ``'now'`` on SQLite.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import connections
from django.db.backends.utils import typecast_timestamp
from django.utils import timezone

from agentruns.dbclock import POSTGRES_NOW, SQLITE_NOW, SQLITE_NOW_PLUS
from agentruns.runtime.approval import Guard


class _Now:
    def __repr__(self) -> str:
        return "NOW"


NOW = _Now()


@dataclass(frozen=True)
class NowPlus:
    seconds: float


@dataclass(frozen=True)
class Sql:
    """A literal SQL expression over the row's own columns, e.g. ``attempts + 1``."""

    expression: str


@dataclass(frozen=True)
class Json:
    value: Any


@dataclass(frozen=True)
class Fence:
    """Who may decide for a run: the version it claimed, the owner, an unexpired lease."""

    run_id: uuid.UUID
    version: int
    owner: str


@dataclass
class StepInsert:
    values: dict[str, Any]


@dataclass
class StepUpdate:
    pk: int
    values: dict[str, Any]
    # Only update when the step is in one of these statuses (a fact never
    # overwrites a settled step).
    only_if_status: tuple[str, ...] = ()


@dataclass
class Event:
    type: str
    step_id: str = ""
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Committed:
    fenced: bool  # the run's compare-and-set matched
    state_version: int | None
    cancel_requested: bool
    step_pk: int | None  # the inserted or updated step's id, if any row was written
    # A guard was given and matched no row: nothing was written.
    guard_failed: bool = False


class _GuardedRollback(Exception):
    """A later statement did not match: undo what the guards before it wrote."""

    def __init__(self, *, guard_failed: bool = False):
        super().__init__()
        self.guard_failed = guard_failed


# Every other step column has a database default (see Step), so an insert names
# only the columns it sets: fewer parameters to render and to send.
STEP_JSON_COLUMNS = frozenset(
    {"recovery", "input", "request", "result", "validation", "recovery_log"}
)


class Store:
    def __init__(self, alias: str = "default"):
        self.alias = alias
        # The backend never changes for an alias; looking it up per value is costly.
        self.vendor: str = connections[alias].vendor

    @property
    def connection(self):
        return connections[self.alias]

    # --- SQL fragments ---------------------------------------------------------

    def _value(self, value: Any, params: list[Any], *, json_column: bool = False) -> str:
        pg = self.vendor == "postgresql"
        if value is NOW:
            return POSTGRES_NOW if pg else SQLITE_NOW
        if isinstance(value, NowPlus):
            if pg:
                params.append(float(value.seconds))
                return "(statement_timestamp() + make_interval(secs => %s))"
            params.append(f"{value.seconds:+.3f} seconds")
            return SQLITE_NOW_PLUS.format(modifier="%s")
        if isinstance(value, Sql):
            return value.expression
        if isinstance(value, Json) or (json_column and value is not None):
            payload = value.value if isinstance(value, Json) else value
            if payload is None:
                return "NULL"
            if pg:
                from psycopg.types.json import Jsonb

                params.append(Jsonb(payload))
                return "%s"
            params.append(json.dumps(payload))
            return "%s"
        if isinstance(value, uuid.UUID):
            params.append(value if pg else value.hex)
            return "%s"
        if isinstance(value, datetime):
            params.append(value if pg else timezone.make_naive(value, UTC).isoformat(" "))
            return "%s"
        params.append(value)
        return "%s"

    def _assignments(self, values: dict[str, Any], params: list[Any], json_columns=()) -> str:
        return ", ".join(
            f"{column} = {self._value(v, params, json_column=column in json_columns)}"
            for column, v in values.items()
        )

    def _fence_where(self, fence: Fence, lease_margin: float | None, params: list[Any]) -> str:
        run_id = self._value(fence.run_id, params)
        params.extend([fence.version, fence.owner])
        expiry = self._value(NOW if lease_margin is None else NowPlus(lease_margin), params)
        return (
            f"id = {run_id} AND state_version = %s AND lease_owner = %s "
            f"AND lease_expires_at > {expiry}"
        )

    # --- transitions -------------------------------------------------------------

    def transition(
        self,
        *,
        fence: Fence | None,
        run_where: tuple[str, list[Any]] | None = None,
        run_set: dict[str, Any],
        step: StepInsert | StepUpdate | None = None,
        event: Event | None = None,
        step_is_fact: bool = False,
        lease_margin: float | None = None,
        bump_version: bool = True,
        unless_cancelled: bool = False,
        guard: Guard | list[Guard] | None = None,
    ) -> Committed:
        """Write one transition in one commit.

        A decision (the default) writes nothing unless the run's compare-and-set
        matches. A fact (``step_is_fact``: what a provider answered) is written
        to its step whatever happened to the lease; only the run's part is fenced.
        ``unless_cancelled`` also refuses the decision once a cancel was requested
        (a new effect is never sent after that); the result then says so.
        ``guard`` (a decision only) is one more statement (or several) in the same
        commit that must each write exactly one row, or the whole transition is
        undone: how an approval is consumed in the commit that clears its send, and
        how a reconciliation case and its step are settled together.
        """
        assert guard is None or not step_is_fact
        run_params: list[Any] = []
        assignments = dict(run_set)
        if bump_version:
            assignments = {"state_version": Sql("state_version + 1"), **assignments}
        assignments.setdefault("updated_at", NOW)
        set_sql = self._assignments(assignments, run_params)
        if fence is not None:
            where_sql = self._fence_where(fence, lease_margin, run_params)
        else:
            assert run_where is not None
            where_sql, where_params = run_where
            run_params.extend(where_params)
        if unless_cancelled:
            where_sql += " AND cancel_requested_at IS NULL"
        run_sql = (
            f"UPDATE agentruns_run SET {set_sql} WHERE {where_sql} "
            "RETURNING id, state_version, cancel_requested_at"
        )
        run_id = fence.run_id if fence is not None else None
        if guard is not None:
            committed = self._guarded(guard, run_sql, run_params, step, event)
        elif self.vendor == "postgresql":
            committed = self._transition_pg(run_sql, run_params, step, event, step_is_fact, run_id)
        else:
            committed = self._transition_sqlite(
                run_sql, run_params, step, event, step_is_fact, run_id
            )
        if (
            unless_cancelled
            and not committed.fenced
            and not committed.guard_failed
            and run_id is not None
        ):
            return Committed(False, None, self.cancel_requested(run_id), committed.step_pk)
        return committed

    def _guarded(self, guard: Guard | list[Guard], run_sql, run_params, step, event) -> Committed:
        """The guard, then the fenced transition, in one explicit transaction.

        Both backends run the guard first: when it matches no row nothing else
        is tried. When it matches and the run's compare-and-set then fails (the
        lease is gone), the transaction is rolled back, so a guard's write never
        outlives the decision it was part of.
        """
        pg = self.vendor == "postgresql"
        conn = self.connection
        conn.ensure_connection()
        if conn.in_atomic_block:
            raise RuntimeError("engine transitions must not run inside transaction.atomic()")
        raw = conn.connection
        try:
            if pg:
                import psycopg

                with raw.transaction(), psycopg.Cursor(raw) as cursor:
                    return self._guarded_statements(
                        lambda sql, params: cursor.execute(sql, params).fetchone(),
                        guard,
                        run_sql,
                        run_params,
                        step,
                        event,
                    )
            with self._sqlite_transaction() as sqlite:
                return self._guarded_statements(
                    lambda sql, params: sqlite.execute(_qmark(sql), params).fetchone(),
                    guard,
                    run_sql,
                    run_params,
                    step,
                    event,
                )
        except _GuardedRollback as rollback:
            return Committed(False, None, False, None, guard_failed=rollback.guard_failed)

    def _guarded_statements(self, execute, guard, run_sql, run_params, step, event) -> Committed:
        guards = guard if isinstance(guard, list) else [guard]
        for index, each in enumerate(guards):
            if execute(each.sql, each.params) is None:
                if index:
                    raise _GuardedRollback(guard_failed=True)  # undo the earlier guards
                return Committed(False, None, False, None, guard_failed=True)
        row = execute(run_sql, run_params)
        if row is None:
            raise _GuardedRollback()
        _, version, cancel_requested = row
        step_pk = None
        if step is not None:
            params: list[Any] = []
            written = execute(self._step_sql(step, params, source=None), params)
            step_pk = written[0] if written else None
        if event is not None:
            params = []
            run_value = self._value(row[0], params)
            params.extend([event.type, version, event.step_id])
            payload = self._value(Json(event.payload), params)
            execute(
                "INSERT INTO agentruns_runevent "
                "(run_id, type, state_version, step_id, payload, created_at) "
                f"VALUES ({run_value}, %s, %s, %s, {payload}, "
                f"{POSTGRES_NOW if self.vendor == 'postgresql' else SQLITE_NOW}) RETURNING id",
                params,
            )
        return Committed(True, version, bool(cancel_requested), step_pk)

    def step_guard(
        self, pk: int, values: dict[str, Any], *, only_if_status: tuple[str, ...]
    ) -> Guard:
        """A step write as a guard: it must match (the step still in one of the
        statuses) for the transition it is part of to commit."""
        params: list[Any] = []
        sql = self._step_sql(StepUpdate(pk, values, only_if_status), params, source=None)
        return Guard(sql, params)

    def cancel_requested(self, run_id: uuid.UUID) -> bool:
        params: list[Any] = []
        sql = (
            "SELECT cancel_requested_at IS NOT NULL FROM agentruns_run "
            f"WHERE id = {self._value(run_id, params)}"
        )
        if self.vendor == "postgresql":
            row = self._execute_pg(sql, params)
        else:
            self.connection.ensure_connection()
            row = self.connection.connection.execute(_qmark(sql), params).fetchone()
        return bool(row and row[0])

    def _step_sql(self, step: StepInsert | StepUpdate, params: list[Any], *, source: str | None):
        """SQL writing the step; ``source`` is the CTE that must have matched (PostgreSQL)."""
        if isinstance(step, StepInsert):
            values = dict(step.values)
            values.setdefault("created_at", NOW)
            columns = ", ".join(values)
            rendered = ", ".join(
                self._value(v, params, json_column=c in STEP_JSON_COLUMNS)
                for c, v in values.items()
            )
            if source is None:
                return f"INSERT INTO agentruns_step ({columns}) VALUES ({rendered}) RETURNING id"
            return (
                f"INSERT INTO agentruns_step ({columns}) SELECT {rendered} FROM {source} "
                "RETURNING id"
            )
        set_sql = self._assignments(step.values, params, STEP_JSON_COLUMNS)
        params.append(step.pk)
        where = "id = %s"
        if step.only_if_status:
            where += f" AND status IN ({', '.join('%s' for _ in step.only_if_status)})"
            params.extend(step.only_if_status)
        if source is not None:
            where += f" AND EXISTS (SELECT 1 FROM {source})"
        return f"UPDATE agentruns_step SET {set_sql} WHERE {where} RETURNING id"

    def _transition_pg(self, run_sql, run_params, step, event, step_is_fact, run_id):
        import psycopg

        params: list[Any] = []
        ctes = []
        if step is not None and step_is_fact:
            ctes.append(f"s AS ({self._step_sql(step, params, source=None)})")
            ctes.append(f"r AS ({run_sql})")
            params.extend(run_params)
        else:
            ctes.append(f"r AS ({run_sql})")
            params.extend(run_params)
            if step is not None:
                ctes.append(f"s AS ({self._step_sql(step, params, source='r')})")
        if event is not None:
            if step_is_fact:
                version_sql = (
                    "COALESCE((SELECT state_version FROM r), "
                    "(SELECT state_version FROM agentruns_run WHERE id = %s))"
                )
                ctes.append(
                    "e AS (INSERT INTO agentruns_runevent "
                    "(run_id, type, state_version, step_id, payload, created_at) "
                    f"VALUES (%s, %s, {version_sql}, %s, %s, statement_timestamp()))"
                )
                params.extend(
                    [
                        run_id,
                        event.type,
                        run_id,
                        event.step_id,
                        psycopg.types.json.Jsonb(event.payload),
                    ]
                )
            else:
                ctes.append(
                    "e AS (INSERT INTO agentruns_runevent "
                    "(run_id, type, state_version, step_id, payload, created_at) "
                    "SELECT r.id, %s, r.state_version, %s, %s, statement_timestamp() FROM r)"
                )
                params.extend([event.type, event.step_id, psycopg.types.json.Jsonb(event.payload)])
        step_select = "(SELECT id FROM s)" if step is not None else "NULL"
        sql = (
            f"WITH {', '.join(ctes)} SELECT (SELECT state_version FROM r), "
            f"(SELECT cancel_requested_at FROM r) IS NOT NULL, "
            f"(SELECT count(*) FROM r), {step_select}"
        )
        row = self._execute_pg(sql, params)
        version, cancel_requested, matched, step_pk = row
        return Committed(bool(matched), version, bool(cancel_requested), step_pk)

    def _execute_pg(self, sql: str, params: list[Any]):
        import psycopg

        conn = self.connection
        conn.ensure_connection()
        # The engine's own statements are server-side prepared on the raw psycopg
        # connection (Django's cursors bind client-side). Autocommit: each
        # statement is its own transaction, never part of a caller's atomic().
        if conn.in_atomic_block:
            raise RuntimeError("engine transitions must not run inside transaction.atomic()")
        raw = conn.connection
        if raw.prepare_threshold is None:
            # Django turns preparation off for the connection; a threshold no query
            # reaches keeps Django's own statements unprepared while the engine's,
            # which ask for it explicitly, are prepared once per connection.
            raw.prepare_threshold = 2**31 - 1
        with psycopg.Cursor(raw) as cursor:
            cursor.execute(sql, params, prepare=True)
            return cursor.fetchone()

    @contextmanager
    def _sqlite_transaction(self) -> Iterator[Any]:
        """BEGIN IMMEDIATE on the raw connection: the write lock is taken at BEGIN,
        so a writer waits its busy timeout instead of failing mid-transaction."""
        conn = self.connection
        conn.ensure_connection()
        if conn.in_atomic_block:
            raise RuntimeError("engine transitions must not run inside transaction.atomic()")
        raw = conn.connection
        raw.execute("BEGIN IMMEDIATE")
        try:
            yield raw
            raw.execute("COMMIT")
        except BaseException:
            if raw.in_transaction:
                raw.execute("ROLLBACK")
            raise

    def _transition_sqlite(self, run_sql, run_params, step, event, step_is_fact, run_id):
        with self._sqlite_transaction() as raw:
            row = raw.execute(_qmark(run_sql), run_params).fetchone()
            fenced = row is not None
            if not fenced and not step_is_fact:
                # Nothing was written; the empty transaction commits as a no-op.
                return Committed(False, None, False, None)
            version = row[1] if fenced else None
            cancel_requested = bool(row[2]) if fenced else False
            step_pk = None
            if step is not None:
                params: list[Any] = []
                written = raw.execute(_qmark(self._step_sql(step, params, source=None)), params)
                step_row = written.fetchone()
                step_pk = step_row[0] if step_row else None
            if event is not None:
                if version is None:
                    current = raw.execute(
                        "SELECT state_version FROM agentruns_run WHERE id = ?", [run_id.hex]
                    ).fetchone()
                    event_version = current[0] if current else -1
                else:
                    event_version = version
                event_run = row[0] if fenced else run_id.hex
                raw.execute(
                    "INSERT INTO agentruns_runevent "
                    "(run_id, type, state_version, step_id, payload, created_at) "
                    f"VALUES (?, ?, ?, ?, ?, {SQLITE_NOW})",
                    [
                        event_run,
                        event.type,
                        event_version,
                        event.step_id,
                        json.dumps(event.payload),
                    ],
                )
        return Committed(fenced, version, cancel_requested, step_pk)

    def record_fact(self, run_id: uuid.UUID, step: StepUpdate, event: Event) -> bool:
        """Record what a provider answered, with its event, touching nothing of the run.

        No decision is made here, so nothing is fenced: the worker's next decision
        is. Returns whether the step was still unsettled and so was written. An
        answer that arrives after the step was settled (by an operator, say) is not
        written over it; its event says so (``late_answer_ignored``) instead of
        claiming a change that did not happen.
        """
        pg = self.vendor == "postgresql"
        step_params: list[Any] = []
        step_sql = self._step_sql(step, step_params, source=None)
        ignored = Event(
            "late_answer_ignored", event.step_id, {**event.payload, "answer": event.type}
        )

        def event_sql(chosen: Event, params: list[Any], *, when: str = "") -> str:
            run_sql = self._value(run_id, params)
            params.append(chosen.type)
            version_sql = f"(SELECT state_version FROM agentruns_run WHERE id = {run_sql})"
            self._value(run_id, params)
            params.append(chosen.step_id)
            payload_sql = self._value(Json(chosen.payload), params)
            return (
                "INSERT INTO agentruns_runevent "
                "(run_id, type, state_version, step_id, payload, created_at) "
                f"SELECT {run_sql}, %s, {version_sql}, %s, {payload_sql}, "
                f"{POSTGRES_NOW if pg else SQLITE_NOW}{when}"
            )

        if pg:
            written_params: list[Any] = []
            written_sql = event_sql(event, written_params, when=" WHERE EXISTS (SELECT 1 FROM s)")
            ignored_params: list[Any] = []
            ignored_sql = event_sql(
                ignored, ignored_params, when=" WHERE NOT EXISTS (SELECT 1 FROM s)"
            )
            row = self._execute_pg(
                f"WITH s AS ({step_sql}), e AS ({written_sql}), i AS ({ignored_sql}) "
                "SELECT count(*) FROM s",
                [*step_params, *written_params, *ignored_params],
            )
            return bool(row[0])
        with self._sqlite_transaction() as raw:
            written = raw.execute(_qmark(step_sql), step_params).fetchone()
            params: list[Any] = []
            sql = event_sql(event if written is not None else ignored, params)
            raw.execute(_qmark(sql), params)
        return written is not None

    # --- reads -------------------------------------------------------------------

    def db_now(self) -> datetime:
        if self.vendor == "postgresql":
            row = self._execute_pg("SELECT statement_timestamp()", [])
            return row[0]
        raw = self.connection
        raw.ensure_connection()
        value = raw.connection.execute(f"SELECT {SQLITE_NOW}").fetchone()[0]
        return timezone.make_aware(typecast_timestamp(value), UTC)


def _qmark(sql: str) -> str:
    return sql.replace("%s", "?")
