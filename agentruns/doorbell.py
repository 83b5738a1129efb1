"""Tells the live pages of the engine's commits on PostgreSQL: after the commit, apart from it.

A ``NOTIFY`` inside a transaction makes that transaction's commit wait for every other
notifying commit: PostgreSQL takes one database-wide lock on its notification queue at
commit and holds it until the commit is on disk. On the 2-core development machine,
pgbench's single-row UPDATEs with 8 clients fell from 7,700 to 10,000 commits a second to
3,300 to 3,500 once each also notified. Nearly every engine transition writes a RunEvent,
so a trigger on that table would put every step of every run behind that one lock.

So the engine's commits notify nothing. The Store rings this doorbell with the run's id
once its transition has committed (``Engine(committed=…)``, wired by
``agentruns.services.build_engine``); a thread of the process gathers the runs rung for
``HOLDFAST_LIVE_NOTIFY_SECONDS`` (20 ms) and sends one statement that finds their
tenants and calls ``pg_notify`` once per tenant, on a connection with
``synchronous_commit`` off: nothing waits for it to reach the disk, and few of them
take the lock (at most one a gathering per process). A ring the process loses (it died
after its commit, the server was away) costs the pages the follower's safety re-read
(``HOLDFAST_LIVE_REREAD_SECONDS``).
Audit entries are few and written by people's actions: their table keeps its trigger
(migration agentruns 0010).

On SQLite there is nothing to send: the follower polls.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

from django.conf import settings
from django.db import connections

from agentruns.runtime.outages import Outage
from agentruns.side_connections import side_connection_params

log = logging.getLogger("holdfast.pages")

# The channel the follower LISTENs on (agentruns.follower); the payload is a tenant id.
LIVE_CHANNEL = "holdfast_live"
# One per process: a doorbell that cannot reach the database says so once.
DOORBELL_OUTAGE = Outage("live pages' doorbell", log)
# A doorbell keeps its connection while its process commits, and closes it after this
# long without a ring (docs/scaling.md §4 counts it).
IDLE_SECONDS = 10.0


class Doorbell:
    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self._pid: int | None = None
        self._starting = threading.Lock()

    def ring(self, run_id: uuid.UUID) -> None:
        """Say that a commit wrote one of this run's events. Never raises, never waits."""
        if connections[self.alias].vendor != "postgresql":
            return
        if self._pid != os.getpid():
            # First ring in this process (or in a worker forked from a process that rang):
            # state and thread of its own.
            with self._starting:
                if self._pid != os.getpid():
                    self._start()
        with self._lock:
            self._pending.add(run_id)
        self._rung.set()

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._rung = threading.Event()
        self._pending: set[uuid.UUID] = set()
        threading.Thread(target=self._loop, name="holdfast-doorbell", daemon=True).start()
        self._pid = os.getpid()

    def _loop(self) -> None:
        import psycopg

        params = side_connection_params(self.alias)
        conn: psycopg.Connection | None = None
        while True:
            if not self._rung.wait(timeout=IDLE_SECONDS):
                # Quiet for a while: give the connection back until the next ring.
                if conn is not None:
                    conn.close()
                    conn = None
                continue
            time.sleep(settings.HOLDFAST_LIVE_NOTIFY_SECONDS)
            with self._lock:
                self._rung.clear()
                runs, self._pending = self._pending, set()
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(**params, autocommit=True)
                    # Nothing waits for a notification to reach the disk.
                    conn.execute("SET synchronous_commit = off")
                self._notify(conn, runs)
                DOORBELL_OUTAGE.recovered()
            except psycopg.Error as exc:
                # Lost: the follower's re-read shows these runs' changes instead.
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(DOORBELL_OUTAGE.failed(exc))
            except Exception:
                log.exception("live pages' doorbell failed; pages catch up at their re-read")

    @staticmethod
    def _notify(conn, runs: set[uuid.UUID]) -> None:
        # One statement, its own transaction: the runs' tenants found by primary key
        # and one notification per tenant. (Looking the tenants up apart, once per run
        # and kept, was a statement per run: a tenth of a commit per step.)
        conn.execute(
            "SELECT pg_notify(%s, tenant::text) FROM "
            "(SELECT DISTINCT tenant_id FROM agentruns_run WHERE id = ANY(%s)) AS runs(tenant)",
            [LIVE_CHANNEL, list(runs)],
        )


_doorbell = Doorbell()


def doorbell_ring(run_id: uuid.UUID) -> None:
    """This process's doorbell (agentruns.services wires it into every engine)."""
    _doorbell.ring(run_id)
