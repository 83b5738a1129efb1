"""Lease renewal while a call is out: one thread per process, not one per call.

A worker holds its run's lease (3 s by default) and renews it with its next decision.
While a call is out (a model, a read-only tool, a lookup) nothing is decided, so the
lease is renewed apart from the call, every third of a lease, for as long as the call
is within its timeout and not a moment longer: a worker that cannot prove progress
must let its lease expire.

Most calls end long before their first renewal would be due, so the renewals are made
by one thread of the process that sleeps until one is due, instead of a thread started
and joined around every call (which cost each step of a worker about as much CPU as
its own commit). Covering a call is then two lock round trips. Leaving the cover waits
for a renewal in flight for it, so no renewal of the call is made after the call
returned: the step's write that follows has the lease to itself.

The thread's database connection is its own (Django's are per thread); it is closed
whenever no call it renews for is out, so a process holds it only during long calls.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from django.db import connections

if TYPE_CHECKING:
    from agentruns.runtime.store import Fence, Store

log = logging.getLogger("holdfast.engine")


class _Cover:
    """One call out: whose lease, how long, until when."""

    __slots__ = ("busy", "deadline", "due", "fence", "interval", "lease", "monotonic", "store")

    def __init__(self, store, fence, lease, interval, deadline, monotonic) -> None:
        self.store: Store = store
        self.fence: Fence = fence
        self.lease = lease
        self.interval = interval
        # By the engine's clock (tests move it); renewals are paced by the real one.
        self.deadline = deadline
        self.monotonic: Callable[[], float] = monotonic
        self.due = time.monotonic() + interval
        self.busy = False


class Heartbeat:
    def __init__(self) -> None:
        self._pid: int | None = None
        self._starting = threading.Lock()

    @contextmanager
    def covering(
        self,
        store: Store,
        fence: Fence,
        *,
        lease: float,
        interval: float,
        deadline: float,
        monotonic: Callable[[], float],
    ) -> Iterator[None]:
        """Renew ``fence``'s lease every ``interval`` seconds until ``deadline`` or the
        end of the block, whichever is first."""
        self._ensure_thread()
        cover = _Cover(store, fence, lease, interval, deadline, monotonic)
        with self._changed:
            self._covers.add(cover)
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._covers.discard(cover)
                while cover.busy:
                    self._changed.wait()

    def _ensure_thread(self) -> None:
        if self._pid == os.getpid():
            return
        # First cover in this process, or in a worker forked from one that had a thread.
        with self._starting:
            if self._pid == os.getpid():
                return
            self._changed = threading.Condition()
            self._covers: set[_Cover] = set()
            threading.Thread(target=self._loop, name="holdfast-heartbeat", daemon=True).start()
            self._pid = os.getpid()

    def _loop(self) -> None:
        while True:
            due = self._next_due()
            aliases = {cover.store.alias for cover in due}
            for cover in due:
                renewing = self._renew(cover)
                with self._changed:
                    cover.busy = False
                    cover.due = time.monotonic() + cover.interval if renewing else math.inf
                    self._changed.notify_all()
            with self._changed:
                live = any(cover.due != math.inf for cover in self._covers)
            if not live:
                for alias in aliases:
                    connections[alias].close()

    def _next_due(self) -> list[_Cover]:
        """Wait for renewals to be due; mark them busy and return them."""
        with self._changed:
            while True:
                now = time.monotonic()
                due = [cover for cover in self._covers if cover.due <= now]
                if due:
                    for cover in due:
                        cover.busy = True
                    return due
                upcoming = min((cover.due for cover in self._covers), default=math.inf)
                self._changed.wait(None if upcoming == math.inf else upcoming - now)

    @staticmethod
    def _renew(cover: _Cover) -> bool:
        """One renewal; whether to go on renewing for this call."""
        if cover.monotonic() >= cover.deadline:
            return False  # the call outlived its timeout: let the lease lapse
        try:
            return cover.store.renew_lease(cover.fence, cover.lease)
        except Exception:
            log.exception("run %s: lease heartbeat failed", cover.fence.run_id)
            return True


HEARTBEAT = Heartbeat()
