"""The live pages' follower: one per web process, reading each watched tenant's logs
once for every socket that watches it.

A socket (``agentruns.consumers``) subscribes for its tenant; the follower reads the
tenant's new ``RunEvent`` and ``AuditEntry`` rows and hands the same batch to each of
its subscribers, which re-render their own fragments from the current rows. Opening
more pages adds no reads of the logs.

When it reads:

- PostgreSQL: when told. The channel ``holdfast_live`` carries a tenant's id: the
  engine's process sends it just after committing the tenant's events
  (``agentruns.doorbell``, apart from the commit, which it would otherwise slow), and a
  trigger on the audit log when an insert commits (migration agentruns 0010); the
  follower LISTENs on a connection of its own and reads only the tenants named. A notification
  can be missed (the listening connection was lost, the server restarted), so every
  tenant is also read again every ``HOLDFAST_LIVE_REREAD_SECONDS`` and at once after
  the listener reconnects.
- SQLite: every ``HOLDFAST_LIVE_POLL_SECONDS``, every watched tenant, one read each.

Either way a channel-layer poke (``RunsConsumer.runs_poke``) reads its tenant at once.

Sequence values are handed out before commit, so an id below the newest one read can
still appear: each read takes a trailing window (``TRAILING_WINDOW`` ids) behind the
newest id seen and hands out only the ids it had not seen.

Everything here runs on the event loop of the sockets it serves; the database reads
run in the sockets' worker thread (``live_sync_to_async``: one thread for every
socket of the process, which keeps its connection while pages are open). A test's
``async_to_sync`` runs its own loop, so there is one follower per loop (in a web
process: exactly one).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from channels.db import DatabaseSyncToAsync
from django.conf import settings
from django.db import connection
from django.db.models import Max
from django.db.utils import InterfaceError, OperationalError

from accounts.models import AuditEntry
from agentruns.doorbell import LIVE_CHANNEL
from agentruns.models import RunEvent
from agentruns.runtime.outages import Outage
from agentruns.side_connections import side_connection_params

log = logging.getLogger("holdfast.pages")

# The most rows of each log one read takes; the rest come at the next read.
READ_LIMIT = 2000
# Sequence values are handed out before commit: an event with a lower id can
# become visible after a higher one. Re-read this many ids behind the newest.
TRAILING_WINDOW = 500
# One per web process: every open page of it waits out an outage, logged once.
PAGES_OUTAGE = Outage("live pages", log)
# The listening connection's own outage: reads go on (by the safety re-read) meanwhile.
LISTEN_OUTAGE = Outage("live pages' listener", log)

# How long the live pages' thread keeps a connection it opened (Django's CONN_MAX_AGE
# for it): the web process's requests open one each (config/asgi.py), the pages do not.
KEPT_CONNECTION_SECONDS = 60.0

_batches = itertools.count(1)


class live_sync_to_async(DatabaseSyncToAsync):
    """``database_sync_to_async`` for the live pages: the sockets' database calls.

    With no request around them they all run on asgiref's one shared thread, and they
    come several a second (a read, a render, an access check per change). Requests
    connect each time (``CONN_MAX_AGE=0``: each runs on a thread of its own that a
    kept connection would outlive), which here would be a new PostgreSQL backend per
    call: the connection a call opens on this thread is kept for
    ``KEPT_CONNECTION_SECONDS`` instead. Everything else is channels' own: its
    ``close_old_connections`` around every call closes a connection that failed and
    replaces one past its age, and ``CONN_HEALTH_CHECKS`` tests a kept one first. The
    follower closes it when the process's last page closes.
    """

    def __init__(self, func, **kwargs):
        @functools.wraps(func)
        def keeping(*args, **call_kwargs):
            try:
                return func(*args, **call_kwargs)
            finally:
                _keep_connection()  # before channels' close after the call

        super().__init__(keeping, **kwargs)


def _keep_connection() -> None:
    """Give a connection this call opened its live pages' age (once: a kept one ages)."""
    raw = connection.connection
    if raw is None or connection.close_at is None:
        return  # none open, or kept for ever (CONN_MAX_AGE=None)
    if getattr(connection, "holdfast_kept", None) is not raw:
        connection.holdfast_kept = raw
        connection.close_at = max(connection.close_at, time.monotonic() + KEPT_CONNECTION_SECONDS)


def _close_kept_connection() -> None:
    # Only a connection kept above, and never one in a transaction (a test's, say).
    if (
        connection.connection is not None
        and getattr(connection, "holdfast_kept", None) is connection.connection
        and not connection.in_atomic_block
    ):
        connection.close()


@dataclass(frozen=True)
class Moved:
    """One read of a tenant's logs: what had not been handed out before.

    ``events`` are (id, run_id, type); ``audit`` (id, object_type, object_id, action).
    ``seq`` names the batch: sockets holding the same batches may share one render.
    """

    seq: int
    events: tuple[tuple[int, Any, str], ...]
    audit: tuple[tuple[int, str, str, str], ...]


class Subscriber(Protocol):
    tenant_id: int

    def deliver(self, moved: Moved) -> None:
        """Take a batch; never blocks, never reads the database."""


class TenantLog:
    """What one tenant's sockets have been handed of its two logs."""

    def __init__(self, tenant_id: int):
        self.tenant_id = tenant_id
        self.subscribers: set[Subscriber] = set()
        self.events_seen: deque[int] = deque(maxlen=4 * TRAILING_WINDOW)
        self.audit_seen: deque[int] = deque(maxlen=4 * TRAILING_WINDOW)
        self.ready = asyncio.Event()

    def start(self) -> None:
        """Mark what is in the logs now: a page's snapshot, rendered after this, shows
        it, and only what comes later is handed out. Only the newest window of each log
        is read, never the whole history."""
        self.events_seen.extend(row[0] for row in self._events(None))
        self.audit_seen.extend(row[0] for row in self._audit(None))

    def read(self) -> Moved | None:
        events = self._fresh(self._events(self.events_seen), self.events_seen)
        audit = self._fresh(self._audit(self.audit_seen), self.audit_seen)
        if not events and not audit:
            return None
        return Moved(next(_batches), events, audit)

    @staticmethod
    def _fresh(rows: list[tuple], seen: deque[int]) -> tuple:
        known = set(seen)
        fresh = tuple(row for row in rows if row[0] not in known)
        seen.extend(row[0] for row in fresh)
        return fresh

    @staticmethod
    def _floor(model, seen: deque[int] | None) -> int:
        if seen:
            return max(seen) - TRAILING_WINDOW
        newest = model.objects.aggregate(newest=Max("id"))["newest"] or 0
        return newest - TRAILING_WINDOW

    def _events(self, seen: deque[int] | None) -> list[tuple[int, Any, str]]:
        # Reads runevent by its primary key (id > floor), joined to the run for its tenant.
        events = RunEvent.objects.filter(
            id__gt=self._floor(RunEvent, seen), run__tenant_id=self.tenant_id
        )
        return list(events.order_by("id").values_list("id", "run_id", "type")[:READ_LIMIT])

    def _audit(self, seen: deque[int] | None) -> list[tuple[int, str, str, str]]:
        entries = AuditEntry.objects.filter(
            id__gt=self._floor(AuditEntry, seen), tenant_id=self.tenant_id
        )
        return list(
            entries.order_by("id").values_list("id", "object_type", "object_id", "action")[
                :READ_LIMIT
            ]
        )


class _Call:
    """One shared call: its task and the futures of whoever awaits it."""

    __slots__ = ("started", "task", "waiters")

    def __init__(self, task: asyncio.Task) -> None:
        self.started = time.monotonic()
        self.task = task
        self.waiters: list[asyncio.Future] = []
        task.add_done_callback(self._settle)

    def _settle(self, task: asyncio.Task) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if waiter.done():
                continue  # its socket closed meanwhile
            if task.cancelled():
                waiter.cancel()
            elif task.exception() is not None:
                waiter.set_exception(task.exception())
            else:
                waiter.set_result(task.result())


class Shared:
    """Calls that sockets with the same key may share: the first starts it, the others
    await the same result. An access check is shared only with sockets asking for one
    started no earlier than they ask for (``since``), so a verdict is never older than
    the change it lets through; a render is keyed by the batches it renders.

    Each caller waits on a future of its own, settled by the one callback of the
    call's task: a socket closed while it waits cancels its own future, not the call
    the others wait on (what ``asyncio.shield`` does, at two callbacks a caller, which
    a push to hundreds of pages felt)."""

    def __init__(self) -> None:
        self._calls: dict[Hashable, _Call] = {}

    async def call(self, key: Hashable, since: float, make: Callable[[], Awaitable[Any]]) -> Any:
        entry = self._calls.get(key)
        if entry is None or entry.started < since:
            self._forget_old()
            entry = self._calls[key] = _Call(asyncio.ensure_future(make()))
        task = entry.task
        if task.done() and not task.cancelled() and task.exception() is None:
            return task.result()  # answered already: nothing to wait on
        waiter = asyncio.get_running_loop().create_future()
        entry.waiters.append(waiter)
        if task.done():
            entry._settle(task)  # failed or cancelled already: this caller hears it too
        try:
            return await waiter
        except Exception:
            # A failure (the database away) is nobody's answer: the next asks again.
            if self._calls.get(key) is entry:
                del self._calls[key]
            raise

    def _forget_old(self) -> None:
        if len(self._calls) < 256:
            return
        horizon = time.monotonic() - 60
        for key, entry in list(self._calls.items()):
            if entry.task.done() and entry.started < horizon:
                del self._calls[key]


class Follower:
    def __init__(self) -> None:
        self.tenants: dict[int, TenantLog] = {}
        self.woken: set[int] = set()
        self.wake_up = asyncio.Event()
        self.checks = Shared()
        self.renders = Shared()
        self.reads = 0  # tenant reads made, for tests and benchmarks
        self._tasks: list[asyncio.Task] = []

    # --- sockets ------------------------------------------------------------------

    async def subscribe(self, subscriber: Subscriber) -> None:
        """From now on ``subscriber`` gets every batch of its tenant; returns once what
        is in the logs already is marked, so the socket's snapshot may be rendered."""
        while True:
            tenant = self.tenants.get(subscriber.tenant_id)
            if tenant is None:
                tenant = self.tenants[subscriber.tenant_id] = TenantLog(subscriber.tenant_id)
                try:
                    await live_sync_to_async(tenant.start)()
                except BaseException:
                    # The database away: the socket fails to open (the browser retries),
                    # and whoever waits on this start begins afresh.
                    if self.tenants.get(tenant.tenant_id) is tenant:
                        del self.tenants[tenant.tenant_id]
                    raise
                finally:
                    tenant.ready.set()
            else:
                await tenant.ready.wait()
                if self.tenants.get(subscriber.tenant_id) is not tenant:
                    continue  # its start failed; start it again
            tenant.subscribers.add(subscriber)
            self._start()
            return

    async def unsubscribe(self, subscriber: Subscriber) -> None:
        tenant = self.tenants.get(subscriber.tenant_id)
        if tenant is not None:
            tenant.subscribers.discard(subscriber)
            if not tenant.subscribers and tenant.ready.is_set():
                del self.tenants[subscriber.tenant_id]
        if not self.tenants:
            await self._stop()

    def wake(self, tenant_id: int | None = None) -> None:
        """Read ``tenant_id`` (every tenant if None) now rather than at the next interval."""
        self.woken.update(self.tenants if tenant_id is None else (tenant_id,))
        self.wake_up.set()

    # --- the loops ----------------------------------------------------------------

    def _start(self) -> None:
        if self._tasks:
            return
        self._tasks.append(asyncio.create_task(self._read_loop()))
        if connection.vendor == "postgresql":
            self._tasks.append(asyncio.create_task(self._listen_loop()))

    async def _stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if tasks:
            # No page is open: the pages' thread gives its connection back.
            await live_sync_to_async(_close_kept_connection)()

    @staticmethod
    def interval() -> float:
        if connection.vendor == "postgresql":
            return settings.HOLDFAST_LIVE_REREAD_SECONDS
        return settings.HOLDFAST_LIVE_POLL_SECONDS

    async def _read_loop(self) -> None:
        every_tenant_at = time.monotonic() + self.interval()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.wake_up.wait(), timeout=max(0.0, every_tenant_at - time.monotonic())
                )
            self.wake_up.clear()
            if time.monotonic() >= every_tenant_at:
                # The interval: every tenant, told of or not (a notification can be lost).
                self.woken.update(self.tenants)
                every_tenant_at = time.monotonic() + self.interval()
            woken, self.woken = self.woken, set()
            for tenant_id in woken:
                tenant = self.tenants.get(tenant_id)
                if tenant is None or not tenant.ready.is_set():
                    continue
                try:
                    moved = await live_sync_to_async(tenant.read)()
                except (OperationalError, InterfaceError) as exc:
                    # The database is away (or locked): the sockets stay open; every
                    # tenant is read again once it answers.
                    await asyncio.sleep(PAGES_OUTAGE.failed(exc))
                    self.wake()
                    break
                except Exception:
                    # Not an outage, and not expected: say so and carry on; the tenant
                    # is read again at the next interval, and its pages keep their state.
                    log.exception("live pages: reading tenant %s failed", tenant_id)
                    continue
                self.reads += 1
                PAGES_OUTAGE.recovered()
                if moved is not None:
                    for subscriber in list(tenant.subscribers):
                        subscriber.deliver(moved)

    async def _listen_loop(self) -> None:
        import psycopg

        params = side_connection_params(connection.alias)
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    **params, autocommit=True
                ) as listener:
                    await listener.execute(f"LISTEN {LIVE_CHANNEL}")
                    LISTEN_OUTAGE.recovered()
                    # Whatever was notified while no one listened: read every tenant.
                    self.wake()
                    async for notice in listener.notifies():
                        with contextlib.suppress(ValueError):
                            self.wake(int(notice.payload))
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                await asyncio.sleep(LISTEN_OUTAGE.failed(exc))
            except Exception:
                # Not an outage, and not expected: say so, and listen again shortly;
                # the safety re-read keeps the pages right meanwhile.
                log.exception("live pages' listener failed")
                await asyncio.sleep(self.interval())


_followers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Follower] = (
    weakref.WeakKeyDictionary()
)


def follower() -> Follower:
    """This event loop's follower (a web process runs one loop: one follower)."""
    loop = asyncio.get_running_loop()
    found = _followers.get(loop)
    if found is None:
        found = _followers[loop] = Follower()
    return found
