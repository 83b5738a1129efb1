"""The pieces the Store's statements are made of, in the running database's dialect.

A value becomes a placeholder and its parameter, or an expression the database
evaluates (its clock, an increment, a JSON document); a step write and an event insert
become statement text the Store composes into one transition (agentruns/runtime/store.py).
Nothing here touches a connection: it renders SQL and the parameters that go with it.

Placeholders are ``%s`` on both databases; ``qmark`` turns them into SQLite's ``?``.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from django.db.backends.utils import typecast_timestamp
from django.utils import timezone
from psycopg.types.json import Jsonb

from agentruns.dbclock import now_plus_sql, now_sql
from agentruns.runtime.writes import (
    NOW,
    Event,
    Fence,
    Increment,
    Json,
    NowPlus,
    Sql,
    StepInsert,
    StepUpdate,
)

# Every other step column has a database default (see Step), so an insert names
# only the columns it sets: fewer parameters to render and to send.
STEP_JSON_COLUMNS = frozenset(
    {"recovery", "input", "request", "result", "validation", "recovery_log"}
)
# Values bound as they are, on either database.
_PLAIN = frozenset({str, int, float, bool, type(None)})
# Run columns a claim returns that SQLite hands back as text or integers.
CLAIMED_BOOLEANS = frozenset({"recovered"})
CLAIMED_TIMESTAMPS = frozenset({"lease_expires_at", "next_attempt_at", "updated_at"})


class Fragments:
    """SQL for one database vendor; the Store holds one (``store.sql``)."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor
        self.now_sql = now_sql(vendor)

    def value(self, value: Any, params: list[Any], *, json_column: bool = False) -> str:
        if type(value) in _PLAIN and (not json_column or value is None):
            # Most of a step's values: bound as they are (25 a step, checked first).
            params.append(value)
            return "%s"
        pg = self.vendor == "postgresql"
        if value is NOW:
            return self.now_sql
        if isinstance(value, NowPlus):
            return now_plus_sql(self.vendor, value.seconds, params)
        if isinstance(value, Sql):
            return value.expression
        if isinstance(value, Json) or (json_column and value is not None):
            payload = value.value if isinstance(value, Json) else value
            if payload is None:
                return "NULL"
            if pg:
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

    def assignments(self, values: dict[str, Any], params: list[Any], json_columns=()) -> str:
        assignments = []
        for column, value in values.items():
            if isinstance(value, Increment):
                params.append(int(value.by))
                assignments.append(f"{column} = {column} + %s")
            else:
                rendered = self.value(value, params, json_column=column in json_columns)
                assignments.append(f"{column} = {rendered}")
        return ", ".join(assignments)

    def fence_where(self, fence: Fence, params: list[Any]) -> str:
        run_id = self.value(fence.run_id, params)
        params.extend([fence.version, fence.owner])
        return (
            f"id = {run_id} AND state_version = %s AND lease_owner = %s "
            f"AND lease_expires_at > {self.now_sql}"
        )

    def event_sql(
        self,
        event: Event,
        params: list[Any],
        *,
        run: Any,
        version_sql: str,
        version_params: tuple[Any, ...] = (),
        tail: str = "",
    ) -> str:
        """The one statement that writes a RunEvent; ``tail`` adds a FROM or a WHERE."""
        run_sql = self.value(run, params)
        params.append(event.type)
        params.extend(version_params)
        params.append(event.step_id)
        payload_sql = self.value(Json(event.payload), params)
        return (
            "INSERT INTO agentruns_runevent "
            "(run_id, type, state_version, step_id, payload, created_at) "
            f"SELECT {run_sql}, %s, {version_sql}, %s, {payload_sql}, {self.now_sql}{tail}"
        )

    def bind(self, value: uuid.UUID) -> Any:
        """A run id as the raw connection takes it."""
        return value if self.vendor == "postgresql" else value.hex

    def step_sql(self, step: StepInsert | StepUpdate, params: list[Any], *, source: str | None):
        """SQL writing the step; ``source`` is the CTE that must have matched (PostgreSQL)."""
        if isinstance(step, StepInsert):
            values = dict(step.values)
            values.setdefault("created_at", NOW)
            columns = ", ".join(values)
            rendered = ", ".join(
                self.value(v, params, json_column=c in STEP_JSON_COLUMNS) for c, v in values.items()
            )
            if source is None:
                return f"INSERT INTO agentruns_step ({columns}) VALUES ({rendered}) RETURNING id"
            return (
                f"INSERT INTO agentruns_step ({columns}) SELECT {rendered} FROM {source} "
                "RETURNING id"
            )
        set_sql = self.assignments(step.values, params, STEP_JSON_COLUMNS)
        params.append(step.pk)
        where = "id = %s"
        if step.only_if_status:
            where += f" AND status IN ({', '.join('%s' for _ in step.only_if_status)})"
            params.extend(step.only_if_status)
        if source is not None:
            where += f" AND EXISTS (SELECT 1 FROM {source})"
        return f"UPDATE agentruns_step SET {set_sql} WHERE {where} RETURNING id"


def qmark(sql: str) -> str:
    return sql.replace("%s", "?")


def sqlite_columns(columns: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
    """Returned run columns as the model holds them (SQLite keeps booleans as 0/1 and
    timestamps in UTC without a zone; the connection parses declared datetimes, an
    expression's value comes back as text)."""
    typed: dict[str, Any] = {}
    for column, value in zip(columns, values, strict=True):
        if column in CLAIMED_BOOLEANS:
            value = bool(value)
        elif column in CLAIMED_TIMESTAMPS and value is not None:
            if isinstance(value, str):
                value = typecast_timestamp(value)
            if timezone.is_naive(value):
                value = timezone.make_aware(value, UTC)
        typed[column] = value
    return typed
