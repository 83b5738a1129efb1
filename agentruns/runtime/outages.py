"""A lost database connection is a pause, not a failure.

PostgreSQL restarts, fails over, refuses a connection (``too many connections``),
or the network blips: the connection a process holds is broken, or a new one is
refused. Every long-running process (the worker's task, the sweeper, the live
pages' followers) meets that the same way: close the broken connection, wait with
jittered backoff, try again, and log one line when the outage starts and one when
it ends, never a traceback per attempt.

Only a lost connection is treated so. A statement the database refused on a
working connection (a constraint, a deadlock, a serialization failure) is the
caller's to handle, as before. SQLite has no connection to lose.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.utils import InterfaceError, OperationalError

try:
    import psycopg
except ImportError:  # pragma: no cover - psycopg is a dependency; SQLite-only installs
    psycopg = None

T = TypeVar("T")

_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)
if psycopg is not None:
    # The engine's own statements run on the raw psycopg connection.
    _ERRORS += (psycopg.OperationalError, psycopg.InterfaceError)

FIRST_DELAY = 0.1
MAX_DELAY = 2.0


def is_connection_loss(exc: BaseException, alias: str = DEFAULT_DB_ALIAS) -> bool:
    """Whether ``exc`` means the connection to the database is gone (or was refused)."""
    if not isinstance(exc, _ERRORS):
        return False
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return False
    raw = connection.connection
    # None: connecting failed (refused, too many connections, shutting down).
    return raw is None or bool(raw.closed) or bool(getattr(raw, "broken", False))


def backoff(attempt: int) -> float:
    """Full jitter: many processes that lost the database together do not return in step."""
    return random.uniform(0, min(MAX_DELAY, FIRST_DELAY * 2 ** min(attempt, 10)))


class Outage:
    """One thing's view of the database being away: one log line when it goes, one
    when it comes back (with how long and how many tries), nothing in between.

    Shared by every caller in a process that reports as ``what`` (say, the live
    pages of one web process), so a hundred open pages log one line, not a hundred.
    """

    def __init__(self, what: str, logger: logging.Logger, *, resource: str = "database"):
        self.what = what
        self.logger = logger
        self.resource = resource
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> float:
        """Note one failed attempt; return how long to wait before the next."""
        with self._lock:
            self._failures += 1
            failures = self._failures
            if self._since is None:
                self._since = time.monotonic()
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self.logger.warning(
                    "%s: %s unreachable (%s: %s); retrying",
                    self.what,
                    self.resource,
                    type(exc).__name__,
                    first_line,
                )
        return backoff(failures)

    def recovered(self) -> None:
        with self._lock:
            if self._since is None:
                return
            took = time.monotonic() - self._since
            failures, self._since, self._failures = self._failures, None, 0
        self.logger.warning(
            "%s: %s back after %.1f s (%d failed attempts)",
            self.what,
            self.resource,
            took,
            failures,
        )


def close_broken(alias: str = DEFAULT_DB_ALIAS) -> None:
    """Drop this thread's broken connection so the next use connects afresh."""
    connection = connections[alias]
    # It is broken: closing it can only fail the same way.
    with contextlib.suppress(Exception):
        connection.close()
    # close() in an atomic block is refused; a broken connection is closed regardless.
    connection.connection = None


def through_outages(
    fn: Callable[[], T],
    *,
    outage: Outage,
    budget: float | None,
    alias: str = DEFAULT_DB_ALIAS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn``; while it fails because the database connection is lost, close the
    connection, wait and call it again, for at most ``budget`` seconds (None: until
    it works). Any other error, or the last connection loss, is raised.

    ``fn`` must be safe to call again after a lost connection: a statement that may
    have committed before the connection dropped is one whose repetition the
    caller's own checks (the fence, a step's status) make harmless.
    """
    deadline = None if budget is None else time.monotonic() + budget
    while True:
        try:
            result = fn()
        except _ERRORS as exc:
            if not is_connection_loss(exc, alias):
                raise
            close_broken(alias)
            delay = outage.failed(exc)
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            sleep(delay)
            continue
        outage.recovered()
        return result
