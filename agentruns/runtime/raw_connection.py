"""Where the engine's statements run: the DB-API connection beneath Django's, for one alias.

The Store composes a transition's SQL (agentruns/runtime/store.py, with the pieces of
agentruns/runtime/fragments.py); this runs it. On PostgreSQL a statement is its own
transaction (autocommit), server-side prepared once per connection unless the
deployment's pooler cannot keep a prepared statement (docs/scaling.md §5), and
retried while the connection is lost. On SQLite a transaction is ``BEGIN IMMEDIATE``
… ``COMMIT`` on the raw connection. Either way the ORM's query building, which costs
more than the commit itself, is skipped (benchmarks/step_overhead.py).

No statement here may run inside a caller's ``transaction.atomic()``: an engine
transition is a commit of its own, or it would not be a durable fact when it returns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from django.db import connections
from django.db.backends.utils import typecast_timestamp
from django.utils import timezone

from agentruns.dbclock import now_sql
from agentruns.runtime.fragments import qmark
from agentruns.runtime.outages import Outage, through_outages

T = TypeVar("T")

# One per process: a database outage is one warning when it starts and one when it
# ends, however many runs this process was working on.
ENGINE_OUTAGE = Outage("engine", logging.getLogger("holdfast.engine"))


class RawConnection:
    def __init__(self, alias: str, *, prepare: bool, reconnect_seconds: float) -> None:
        self.alias = alias
        # The backend never changes for an alias; looking it up per statement is costly.
        self.vendor: str = connections[alias].vendor
        # PostgreSQL: the engine's statements are server-side prepared, once per
        # connection. Off for a pooler that cannot keep a prepared statement on the
        # connection that prepared it (PgBouncer's transaction pooling before 1.21,
        # or with max_prepared_statements = 0): docs/scaling.md.
        self.prepare = prepare
        # How long a statement is retried while the database connection is lost
        # (a restart, a failover). Every statement the engine sends is one whose
        # repetition after a lost reply is harmless: the fence, a compare-and-set or
        # a step's status decides, so a write that did commit is never made twice.
        self.reconnect_seconds = reconnect_seconds

    @property
    def postgresql(self) -> bool:
        return self.vendor == "postgresql"

    def _raw(self, *, own_transaction: bool):
        conn = connections[self.alias]
        conn.ensure_connection()
        if own_transaction and conn.in_atomic_block:
            raise RuntimeError("engine transitions must not run inside transaction.atomic()")
        return conn.connection

    def retried(self, attempt: Callable[[], T], *, reconnect_seconds: float | None = None) -> T:
        """``attempt`` again while the connection is lost, for up to the budget (PostgreSQL).

        A transaction the lost connection cut short was rolled back by the server, so
        an attempt that failed wrote nothing. SQLite has no connection to lose.
        """
        if not self.postgresql:
            return attempt()
        return through_outages(
            attempt,
            outage=ENGINE_OUTAGE,
            budget=self.reconnect_seconds if reconnect_seconds is None else reconnect_seconds,
            alias=self.alias,
        )

    def fetch_one(
        self, sql: str, params: list[Any], *, reconnect_seconds: float | None = None
    ) -> tuple[Any, ...] | None:
        """One statement, its own transaction, retried while the connection is lost
        (``%s`` placeholders on both databases). SQLite's transitions take
        ``transaction()``; here it answers the Store's single reads."""
        if not self.postgresql:
            return self._raw(own_transaction=False).execute(qmark(sql), params).fetchone()
        return self.retried(
            lambda: self._pg(sql, params, own_transaction=True, fetch=psycopg.Cursor.fetchone),
            reconnect_seconds=reconnect_seconds,
        )

    def fetch_all(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """A read's rows, on the same connection as the engine's writes (prepared on
        PostgreSQL); a caller's transaction may hold it."""
        if not self.postgresql:
            return self._raw(own_transaction=False).execute(qmark(sql), params).fetchall()
        return self._pg(sql, params, own_transaction=False, fetch=psycopg.Cursor.fetchall)

    def _pg(self, sql: str, params: list[Any], *, own_transaction: bool, fetch: Callable) -> Any:
        # The engine's own statements are server-side prepared on the raw psycopg
        # connection (Django's cursors bind client-side). Autocommit: each
        # statement is its own transaction.
        raw = self._raw(own_transaction=own_transaction)
        self._allow_preparing(raw)
        with psycopg.Cursor(raw) as cursor:
            # prepare=False: an unnamed statement, parsed each time (nothing survives
            # on the server connection for a pooler to lose).
            cursor.execute(sql, params, prepare=self.prepare)
            return fetch(cursor)

    def _allow_preparing(self, raw) -> None:
        if self.prepare and raw.prepare_threshold is None:
            # Django turns preparation off for the connection; a threshold no query
            # reaches keeps Django's own statements unprepared while the engine's,
            # which ask for it explicitly, are prepared once per connection.
            raw.prepare_threshold = 2**31 - 1

    @contextmanager
    def transaction(self) -> Iterator[Callable[[str, list[Any]], Any]]:
        """An explicit transaction: yields ``execute(sql, params)`` returning the
        cursor. Committed when the block ends, rolled back if it raises."""
        raw = self._raw(own_transaction=True)
        if self.postgresql:
            with raw.transaction(), psycopg.Cursor(raw) as cursor:
                yield lambda sql, params: cursor.execute(sql, params)
            return
        # BEGIN IMMEDIATE: the write lock is taken at BEGIN, so a writer waits its
        # busy timeout instead of failing mid-transaction.
        raw.execute("BEGIN IMMEDIATE")
        try:
            yield lambda sql, params: raw.execute(qmark(sql), params)
            raw.execute("COMMIT")
        except BaseException:
            if raw.in_transaction:
                raw.execute("ROLLBACK")
            raise

    def db_now(self) -> datetime:
        """The database's clock (DESIGN §12.10), never this process's."""
        if self.postgresql:
            return self.fetch_one("SELECT statement_timestamp()", [])[0]
        value = (
            self._raw(own_transaction=False).execute(f"SELECT {now_sql(self.vendor)}").fetchone()[0]
        )
        return timezone.make_aware(typecast_timestamp(value), UTC)
