"""django-q2's ORM broker, woken by PostgreSQL's ``NOTIFY`` instead of polling.

The ORM broker's pusher asks the queue table for a due task and, finding none, sleeps
``Q_CLUSTER["poll"]`` (0.1 s) before asking again: a knock waits half a poll on
average, and every idle cluster reads the table ten times a second. On PostgreSQL this
broker says each enqueue on a channel once it commits (``transaction.on_commit``: a
rolled-back enqueue says nothing, and the notifying transaction is a tiny one of its
own, not the enqueue's commit waiting on the notification queue's lock;
agentruns/doorbell.py says why that matters). A pusher LISTENs on a connection of its
own before it looks at the table and, finding nothing, waits on that connection:
a notification wakes it at once, and without one it looks again after
``HOLDFAST_QUEUE_REREAD_SECONDS`` (1 s), because a task also becomes due without an
enqueue (a dead cluster's task whose lock lapsed, django-q2's ``retry``) and a
notification sent while the listener reconnected is lost.

No wake-up is lost between the look and the wait: the LISTEN is in place before the
look, so a notification of a task committed after it waits in the connection until
the pusher reads it. Every listening pusher is woken by every enqueue and all but one
lose the compare-and-set on the task's ``lock``, as they do polling.

SQLite (the embedded default) has no ``NOTIFY``: there the broker is the ORM broker as
django-q2 ships it, polling. A listener that cannot reach the database falls back to
polling too, and says so once (``QUEUE_LISTEN_OUTAGE``).
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.utils import InterfaceError, OperationalError
from django.utils import timezone
from django_q import humanhash
from django_q.brokers.orm import ORM
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signals import pre_enqueue
from django_q.signing import SignedPackage

from agentruns.runtime.outages import Outage, is_connection_loss, through_outages
from agentruns.side_connections import side_connection_params

log = logging.getLogger("holdfast.broker")

# The channel of the queue's knocks; the payload is the queue's list key.
QUEUE_CHANNEL = "holdfast_queue"
QUEUE_LISTEN_OUTAGE = Outage("queue listener", log)
# The pusher's takes and the monitor's acknowledgements, while the database is away.
QUEUE_OUTAGE = Outage("queue", log)


class ListeningORM(ORM):
    """``Q_CLUSTER["broker_class"]``: the ORM broker, told of enqueues on PostgreSQL."""

    def __init__(self, list_key: str | None = None) -> None:
        super().__init__(list_key=list_key)
        self._listener = None
        self._listener_pid: int | None = None
        self._retry_listening_at = 0.0

    def __setstate__(self, state) -> None:
        # A cluster hands its broker to the pusher process pickled: no listener yet.
        super().__setstate__(state)
        self._listener = None
        self._listener_pid = None
        self._retry_listening_at = 0.0

    @staticmethod
    def _postgresql() -> bool:
        return connections[Conf.ORM].vendor == "postgresql"

    def enqueue(self, task):
        task_id = super().enqueue(task)
        if self._postgresql():
            transaction.on_commit(self._announce, using=Conf.ORM)
        return task_id

    def _announce(self) -> None:
        announce(self.list_key)

    def dequeue(self):
        if not self._postgresql():
            return super().dequeue()
        if not self._listen():
            return super().dequeue()
        # Under a backlog the pusher never waits; knocks it has not read would pile up
        # on its listener's connection (and in the server's notification queue).
        self._drain()
        tasks = self._on_the_queue(self._take, [])
        if not tasks:
            # Nothing due: look again when a task is announced, or at the re-read.
            self._wait(settings.HOLDFAST_QUEUE_REREAD_SECONDS)
            tasks = self._on_the_queue(self._take, [])
        return tasks or None

    @staticmethod
    def _on_the_queue(fn, failed):
        """``fn`` on this process's queue connection, a lost connection waited out (a
        restart, a failover) instead of ending the pusher or the monitor; after
        ``RECONNECT_SECONDS`` of it, ``failed``: the next call tries again.

        django-q2's ORM broker closed and reopened its connection around every call
        (``close_old_connections``, and then Django's health check, a ``SELECT 1``, on
        the next statement); here a connection is dropped only when it is lost.
        """
        try:
            return through_outages(
                fn,
                outage=QUEUE_OUTAGE,
                budget=settings.HOLDFAST["RECONNECT_SECONDS"],
                alias=Conf.ORM,
            )
        except (OperationalError, InterfaceError, psycopg.OperationalError) as exc:
            if not is_connection_loss(exc, Conf.ORM):
                raise
            return failed

    def _take(self) -> list[tuple[int, str]]:
        """The oldest due task, locked for this cluster in one statement: the row lock
        (``FOR UPDATE SKIP LOCKED``) keeps two pushers off one task, and a pusher never
        waits on a row another is taking. django-q2's ORM take was a read and then a
        compare-and-set on ``lock``, two transactions, which every other pusher woken by
        the same knock repeated and lost."""
        now = timezone.now()
        with connections[Conf.ORM].cursor() as cursor:
            cursor.execute(
                "UPDATE django_q_ormq SET lock = %s WHERE id IN ("
                "SELECT id FROM django_q_ormq WHERE key = %s AND lock < %s "
                "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, payload",
                [now + timedelta(seconds=Conf.RETRY), self.list_key, now, Conf.BULK],
            )
            return [(task_id, payload) for task_id, payload in cursor.fetchall()]

    def delete(self, task_id) -> None:
        if not self._postgresql():
            return super().delete(task_id)

        # acknowledge() and fail() come here: one statement, not the ORM's delete
        # collector. Not deleted (the database away past the budget), the task is
        # taken again once its lock lapses, and the run's lease decides what that does.
        def delete_it() -> bool:
            with connections[Conf.ORM].cursor() as cursor:
                cursor.execute("DELETE FROM django_q_ormq WHERE id = %s", [task_id])
            return True

        self._on_the_queue(delete_it, False)
        return None

    def _listen(self) -> bool:
        """A LISTENing connection of this process's own, (re)opened as needed, at most
        once per re-read interval while it cannot be (the pusher polls meanwhile)."""
        if self._listener_pid != os.getpid():
            # Forked from a process that listened: its socket is the parent's.
            self._listener = None
            self._listener_pid = os.getpid()
            self._retry_listening_at = 0.0
        if self._listener is not None and not self._listener.closed:
            return True
        if time.monotonic() < self._retry_listening_at:
            return False
        params = side_connection_params(Conf.ORM)
        try:
            self._listener = psycopg.connect(**params, autocommit=True)
            self._listener.execute(f"LISTEN {QUEUE_CHANNEL}")
        except Exception as exc:
            self._close_listener()
            self._retry_listening_at = time.monotonic() + settings.HOLDFAST_QUEUE_REREAD_SECONDS
            if isinstance(exc, psycopg.Error):
                QUEUE_LISTEN_OUTAGE.failed(exc)
            else:
                log.exception("the queue listener could not start; the pusher polls")
            return False
        QUEUE_LISTEN_OUTAGE.recovered()
        return True

    def _drain(self) -> None:
        """Read the knocks that arrived while the pusher was busy, without waiting."""
        try:
            for _ in self._listener.notifies(timeout=0.0):
                pass
        except psycopg.Error as exc:
            self._close_listener()
            QUEUE_LISTEN_OUTAGE.failed(exc)

    def _wait(self, seconds: float) -> None:
        """Until a knock on the channel, or ``seconds``; then drop the knocks behind it
        (they are for tasks the next look finds anyway)."""
        if self._listener is None:
            return
        try:
            for _ in self._listener.notifies(timeout=seconds, stop_after=1):
                pass
        except psycopg.Error as exc:
            self._close_listener()
            QUEUE_LISTEN_OUTAGE.failed(exc)
            return
        self._drain()

    def _close_listener(self) -> None:
        if self._listener is not None:
            try:
                self._listener.close()
            except Exception:
                log.debug("closing the queue listener failed", exc_info=True)
        self._listener = None


def announce(list_key: str | None = None) -> None:
    """One knock on the channel, once a task is committed; lost, it costs a pusher one
    re-read interval."""
    try:
        connection = connections[Conf.ORM]
        connection.ensure_connection()
        # The raw connection: one statement, nothing for Django's cursor to do.
        connection.connection.execute(
            "SELECT pg_notify(%s, %s)", [QUEUE_CHANNEL, list_key or Conf.CLUSTER_NAME]
        )
    except Exception:
        log.debug("could not announce a queued task; pushers find it at their re-read")


def queue_row(func: str, *args, group: str) -> OrmQ | None:
    """The task ``async_task(func, *args, group=group)`` would enqueue, as an unsaved row
    of the queue's table, for a caller to insert with its own write in one statement;
    ``None`` unless the queue is on PostgreSQL in the default database, the runs' own
    (on SQLite it has a file of its own, and the caller enqueues once it has committed).

    The package is django-q2's own: the task as ``async_task`` builds it (a humanhash
    id and name, the cluster's options, the start time, the ``pre_enqueue`` signal),
    signed and serialized by its ``SignedPackage``, so a pusher cannot tell the row from
    one the broker wrote (tests/agentruns/test_broker.py compares the two). Built here
    rather than by ``async_task`` with a broker that keeps it, which logged an
    "Enqueued … None" line per admission. After the row commits, ``announce()``.
    """
    if Conf.ORM != DEFAULT_DB_ALIAS or connections[Conf.ORM].vendor != "postgresql":
        return None
    if Conf.SYNC:
        # django-q2 would run the task at once, before the run it wakes is written.
        return None
    name, task_id = humanhash.uuid()
    task: dict = {"id": task_id, "name": name, "func": func, "args": args, "group": group}
    if Conf.CACHED:
        task["cached"] = Conf.CACHED
    if Conf.ACK_FAILURES:
        task["ack_failure"] = Conf.ACK_FAILURES
    task["kwargs"] = {}
    task["started"] = timezone.now()
    pre_enqueue.send(sender="django_q", task=task)
    return OrmQ(key=Conf.CLUSTER_NAME, payload=SignedPackage.dumps(task), lock=timezone.now())
