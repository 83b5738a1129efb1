"""What a live page's snapshot on connect costs with a long event log, against reading it whole.

Fills one tenant's event log (``RunEvent``, the table the live pages follow) with
300,000 events over 3,000 runs, then connects to ``/ws/nav/`` as an operator of that
tenant through the project's ASGI application (origin check, session, login,
permission, then the snapshot), driven by channels' ``WebsocketCommunicator`` until
the snapshot arrives; the consumer's own ``_snapshot`` is timed inside each connect.
The baseline, in the same run and interleaved: the same connects with the consumer's
``_events`` as it was before the read on connect was bounded (every event of the
tenant after id -1, no read limit).

Prints the median and max of each, the statements and rows each read (rows as
the driver hands them to Django), the peak of Python memory each allocates
(tracemalloc, in a pass of its own: memory the driver allocates in C is not
seen), the ratio bounded / whole log for time and memory, and whether the
snapshot answers in under 200 ms.

    .venv/bin/python benchmarks/snapshot.py [--events N] [--repeat R]

SQLite by default, in a temporary file (the developer's var/ is never touched);
PostgreSQL when DATABASE_URL is set, e.g.
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_snapshot_bench``. The
PostgreSQL database must be a dedicated one (its name contains "bench"); it is
created if missing and migrated, and the benchmark's tenant is removed from it
before and after. A measurement, not a test: exit status 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import time
import tracemalloc
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.step_overhead import configure_environment, prepare_database  # noqa: E402

if TYPE_CHECKING:
    from accounts.models import Tenant
    from agentruns.consumers import RunsConsumer

TENANT_SLUG = "bench-snapshot"
VIEWER_USERNAME = "snapshot-bench-viewer"
EVENTS_PER_RUN = 100
BATCH = 5_000
TARGET_MS = 200.0
ORIGIN = (b"origin", b"http://127.0.0.1")


# --- the event log ----------------------------------------------------------------------


def remove_tenant() -> None:
    """Delete what an earlier run of this benchmark left (an interrupted one, on PostgreSQL)."""
    from django.contrib.auth import get_user_model
    from django.db import connection

    from accounts.models import Operator, Tenant

    tenant = Tenant.objects.filter(slug=TENANT_SLUG).first()
    if tenant is not None:
        with connection.cursor() as cursor:
            # Raw deletes: the ORM would first collect 300,000 events and every related row.
            cursor.execute(
                "DELETE FROM agentruns_runevent WHERE run_id IN "
                "(SELECT id FROM agentruns_run WHERE tenant_id = %s)",
                [tenant.pk],
            )
            cursor.execute("DELETE FROM agentruns_run WHERE tenant_id = %s", [tenant.pk])
        Operator.objects.filter(tenant=tenant).delete()
    get_user_model().objects.filter(username=VIEWER_USERNAME).delete()
    if tenant is not None:
        tenant.delete()


def run_count(events: int) -> int:
    return max(1, -(-events // EVENTS_PER_RUN))


def fill(events: int) -> tuple[Tenant, Any, float]:
    """A tenant with ``events`` events over runs of EVENTS_PER_RUN, and a viewer of it."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.db import connection, transaction

    from accounts.models import Operator, Tenant
    from agentruns.models import Run, RunEvent, RunStatus

    began = time.perf_counter()
    tenant = Tenant.objects.create(slug=TENANT_SLUG, name="Snapshot bench")
    user = get_user_model().objects.create_user(username=VIEWER_USERNAME, password=None)
    Operator.objects.create(user=user, tenant=tenant)
    # The group migration 0004_create_operator_groups made, with view_runs.
    user.groups.add(Group.objects.get(name="viewer"))

    runs = [
        Run(
            tenant=tenant,
            agent_name="order_support",
            agent_version=1,
            input={"order_id": f"ord_{i}"},
            input_hash=f"{i:064x}",
            request_id=f"snapshot-bench-{i}",
            status=RunStatus.COMPLETED,
        )
        for i in range(run_count(events))
    ]
    with transaction.atomic():
        Run.objects.bulk_create(runs, batch_size=BATCH)
    for start in range(0, events, BATCH):
        batch = []
        for i in range(start, min(start + BATCH, events)):
            position = i % EVENTS_PER_RUN
            kind = (
                "created"
                if position == 0
                else "completed"
                if position == EVENTS_PER_RUN - 1
                else "step_succeeded"
            )
            batch.append(
                RunEvent(
                    run=runs[i // EVENTS_PER_RUN],
                    type=kind,
                    state_version=position,
                    step_id=f"{position}:tool:lookup_order" if kind == "step_succeeded" else "",
                    payload={"position": position},
                )
            )
        with transaction.atomic():
            RunEvent.objects.bulk_create(batch)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE agentruns_run, agentruns_runevent")
    return tenant, user, time.perf_counter() - began


# --- what is measured -------------------------------------------------------------------


class Reads:
    """Statements the default connection executes, and rows the driver hands to Django.

    An execute wrapper (``connection.execute_wrapper``): it counts each statement and
    counts what the statement's cursor then fetches, through the fetch methods the ORM
    calls.
    """

    def __init__(self) -> None:
        self.statements = 0
        self.rows = 0

    def __call__(self, execute, sql, params, many, context):
        self.statements += 1
        cursor = context["cursor"]
        if not getattr(cursor, "_bench_counted", False):
            cursor._bench_counted = True
            for name in ("fetchone", "fetchmany", "fetchall"):
                setattr(cursor, name, self._counting(getattr(cursor, name), name == "fetchone"))
        return execute(sql, params, many, context)

    def _counting(self, fetch: Callable[..., Any], one: bool) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            result = fetch(*args)
            self.rows += (result is not None) if one else len(result)
            return result

        return counted


def whole_log_events(consumer: RunsConsumer) -> list[tuple[int, Any, str]]:
    """``RunsConsumer._events`` as it was before the read on connect was bounded: with
    nothing seen yet, every event of the tenant after id -1, and no read limit."""
    from agentruns.consumers import TRAILING_WINDOW
    from agentruns.models import RunEvent

    floor = (max(consumer.seen) - TRAILING_WINDOW) if consumer.seen else -1
    events = RunEvent.objects.filter(id__gt=floor, run__tenant_id=consumer.operator.tenant_id)
    if consumer.run_id is not None:
        events = events.filter(run_id=consumer.run_id)
    return list(events.order_by("id").values_list("id", "run_id", "type"))


@dataclass
class Figures:
    """One kind of measurement (a whole connect, or the snapshot inside it)."""

    label: str
    seconds: list[float] = field(default_factory=list)
    statements: int = 0
    rows: int = 0
    peak_bytes: int = 0


class Connects:
    """``/ws/nav/`` connects through the project's ASGI application, each until its
    snapshot arrives, with the consumer's ``_snapshot`` timed inside each connect.

    The consumer's database work is thread-sensitive: under ``async_to_sync`` it runs
    back on this thread, on this thread's connection, so ``Reads`` sees all of it.
    """

    def __init__(self, user: Any, *, whole_log: bool) -> None:
        from django.conf import settings
        from django.test import Client

        client = Client()
        client.force_login(user)
        session = client.cookies[settings.SESSION_COOKIE_NAME].value
        self.headers = [ORIGIN, (b"cookie", f"{settings.SESSION_COOKIE_NAME}={session}".encode())]
        self.whole_log = whole_log
        name = "whole log (before)" if whole_log else "bounded (now)"
        self.connect = Figures(f"connect /ws/nav/, {name}")
        self.snapshot = Figures("  of it the snapshot")
        from agentruns.consumers import RunsConsumer

        self._original_snapshot = RunsConsumer._snapshot
        self._reads: Reads | None = None
        self._snapshot_seconds = 0.0
        self._snapshot_reads = (0, 0)
        self._snapshot_peak = 0
        self._peak_before_snapshot = 0

    def _observed_snapshot(self, consumer: RunsConsumer) -> str:
        """Stands in for ``RunsConsumer._snapshot`` while measuring, and calls it."""
        reads = self._reads
        before = (reads.statements, reads.rows) if reads else (0, 0)
        if tracemalloc.is_tracing():
            self._peak_before_snapshot = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
        at_start = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
        started = time.perf_counter()
        fragments = self._original_snapshot(consumer)
        self._snapshot_seconds = time.perf_counter() - started
        if tracemalloc.is_tracing():
            self._snapshot_peak = tracemalloc.get_traced_memory()[1] - at_start
        if reads:
            self._snapshot_reads = (reads.statements - before[0], reads.rows - before[1])
        return fragments

    def _once(self) -> float:
        """One connect, until the snapshot arrives; the seconds it took."""
        from unittest import mock

        from asgiref.sync import async_to_sync
        from channels.testing import WebsocketCommunicator

        from agentruns.consumers import RunsConsumer
        from config.asgi import application

        async def connect() -> float:
            socket = WebsocketCommunicator(application, "/ws/nav/", headers=self.headers)
            started = time.perf_counter()
            connected, code = await socket.connect(timeout=120)
            if not connected:
                raise RuntimeError(f"the /ws/nav/ connect was refused (close code {code})")
            await socket.receive_from(timeout=120)
            elapsed = time.perf_counter() - started
            await socket.disconnect()
            return elapsed

        observed = self

        def snapshot(consumer: RunsConsumer) -> str:
            return observed._observed_snapshot(consumer)

        with mock.patch.object(RunsConsumer, "_snapshot", snapshot):
            if not self.whole_log:
                return async_to_sync(connect)()
            with mock.patch.object(RunsConsumer, "_events", whole_log_events):
                return async_to_sync(connect)()

    def timed(self) -> None:
        self.connect.seconds.append(self._once())
        self.snapshot.seconds.append(self._snapshot_seconds)

    def count(self) -> None:
        from django.db import connection

        self._reads = Reads()
        try:
            with connection.execute_wrapper(self._reads):
                self._once()
            self.connect.statements, self.connect.rows = self._reads.statements, self._reads.rows
            self.snapshot.statements, self.snapshot.rows = self._snapshot_reads
        finally:
            self._reads = None

    def memory(self) -> None:
        tracemalloc.start()
        try:
            at_start = tracemalloc.get_traced_memory()[0]
            self._once()
            peak = max(self._peak_before_snapshot, tracemalloc.get_traced_memory()[1])
            self.connect.peak_bytes = peak - at_start
            self.snapshot.peak_bytes = self._snapshot_peak
        finally:
            tracemalloc.stop()


# --- report -----------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def target_line(label: str, figures: Figures) -> str:
    """The verdict is the median's; samples over the target are counted beside it."""
    median = statistics.median(figures.seconds) * 1000
    over = sum(s * 1000 >= TARGET_MS for s in figures.seconds)
    return (
        f"  {label:<10} median {median:.1f} ms  {verdict(median < TARGET_MS)}; "
        f"max {max(figures.seconds) * 1000:.1f} ms, {over} of {len(figures.seconds)} over"
    )


def ratio(now: float, before: float) -> str:
    return f"{now / before:.4f}x" if before else "-"


def report(
    label: str, events: int, repeat: int, fill_seconds: float, bounded: Connects, whole: Connects
) -> str:
    from agentruns import consumers

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"Holdfast live-page snapshot: {label}",
        f"one tenant's event log of {events:,} events over "
        f"{run_count(events):,} runs (fill: {fill_seconds:.1f} s); "
        f"window {consumers.TRAILING_WINDOW}, read limit {consumers.READ_LIMIT}",
        f"{repeat} connects each, interleaved; {os.cpu_count()} CPUs, load average {load} "
        "at the end",
        "",
    ]
    header = f"{'':<38}{'median':>10}{'max':>11}{'statements':>12}{'rows':>10}{'peak memory':>13}"
    lines += [header, "-" * len(header)]
    for figures in (bounded.connect, bounded.snapshot, whole.connect, whole.snapshot):
        lines.append(
            f"{figures.label:<38}{statistics.median(figures.seconds) * 1000:>7.1f} ms"
            f"{max(figures.seconds) * 1000:>8.1f} ms{figures.statements:>12}{figures.rows:>10,}"
            f"{figures.peak_bytes / 1e6:>10.2f} MB"
        )
    now, before = bounded.snapshot, whole.snapshot
    time_ratio = statistics.median(now.seconds) / statistics.median(before.seconds)
    connect_ratio = statistics.median(bounded.connect.seconds) / statistics.median(
        whole.connect.seconds
    )
    lines += [
        "",
        f"bounded / whole log, the snapshot: time {time_ratio:.4f}x "
        f"({1 / time_ratio:,.1f} times as fast), "
        f"memory {ratio(now.peak_bytes, before.peak_bytes)}, rows {now.rows:,} / {before.rows:,}",
        f"bounded / whole log, the connect: time {connect_ratio:.4f}x, memory "
        f"{ratio(bounded.connect.peak_bytes, whole.connect.peak_bytes)}",
        "whole log: the consumer with its read on connect as it was before it was bounded.",
        "rows: as the driver hands them to Django (the connect's include its session, login "
        "and permission reads);",
        "peak memory: Python allocations (tracemalloc, a pass of its own), the driver's C "
        "buffers left out.",
        "",
        f"target (not asserted): under {TARGET_MS:.0f} ms with {events:,} events",
        target_line("snapshot", bounded.snapshot),
        target_line("connect", bounded.connect),
    ]
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events", type=int, default=300_000, help="events in the log (default 300000)"
    )
    parser.add_argument("--repeat", type=int, default=7, help="repetitions (default 7)")
    args = parser.parse_args(argv)
    if args.events < 1 or args.repeat < 1:
        parser.error("--events and --repeat must be at least 1")

    # As config/asgi.py sets it for the web process: a connect opens its own connection.
    os.environ.setdefault("HOLDFAST_CONN_MAX_AGE", "0")
    scratch = configure_environment()
    # The scratch directory has no collected static files, and a login is not news here.
    warnings.filterwarnings("ignore", message="No directory at")
    logging.getLogger("axes").setLevel(logging.WARNING)
    try:
        from django.db import connections

        label = prepare_database()
        try:
            remove_tenant()
            _, user, fill_seconds = fill(args.events)
            bounded = Connects(user, whole_log=False)
            whole = Connects(user, whole_log=True)
            for connects in (bounded, whole):
                connects.count()  # also the warm-up: imports, templates, the tables' pages
            for connects in (bounded, whole):
                connects.memory()
            for _ in range(args.repeat):
                for connects in (bounded, whole):
                    connects.timed()
            print(report(label, args.events, args.repeat, fill_seconds, bounded, whole))
        finally:
            remove_tenant()
            connections.close_all()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
