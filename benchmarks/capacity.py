"""What one PostgreSQL primary spends per run and per step, and what that makes of its capacity.

Admits runs through the real admission path (``agentruns.services.run_start``: the run
row, its first event and django-q2's queue row) and advances each in-process through
``Engine.advance``, as a worker does, then deletes the queue row as the worker's pusher
does. Two workloads: runs of S read-only no-op tool steps, and runs of S effect steps
(``benchmarks/step_overhead.py``'s agents). For each it measures, from the server:

- transactions per run and per step (``pg_stat_database.xact_commit``: a read in
  autocommit is one too);
- WAL bytes per run and per step (``pg_current_wal_lsn()`` before and after: the
  whole cluster's WAL, so the figure is only this benchmark's on a quiet server);
- the benchmark backend's CPU per run and per step (``/proc/<backend pid>/stat``:
  the server must be on this machine);
- the bytes the runs add to the run, step and event tables, heap and indexes apart
  (``pg_relation_size`` and ``pg_indexes_size``; what retention later prunes).

In the same run, the baseline: single-row autocommit UPDATEs on the same connection,
their CPU per commit and WAL bytes per commit. From those it prints what one primary
carries: steps per second per server core (its CPU per step), the WAL it writes a
day at a given rate, and the hot tables' size after a retention period at a given
number of runs a day. A measurement, not a test: exit status 0 whatever the figures.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_capacity_bench \\
        .venv/bin/python benchmarks/capacity.py [--runs 200] [--steps 10] \\
        [--runs-per-day 1000000] [--retention-days 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.step_overhead import (  # noqa: E402
    EFFECT_AGENT,
    READ_ONLY_AGENT,
    TENANT_SLUG,
    build_registry,
    configure_environment,
    prepare_database,
)
from benchmarks.throughput import proc_cpu  # noqa: E402

TABLES = ("agentruns_run", "agentruns_step", "agentruns_runevent")


def backend_cpu_seconds(pid: int) -> float:
    """user + system CPU of one server backend, from /proc."""
    read = proc_cpu(pid, children=False)
    if read is None:
        sys.exit(f"server backend {pid} is gone")
    return read[0]


@dataclass
class Reading:
    xacts: int
    wal: int
    cpu: float
    heap: dict[str, int]
    index: dict[str, int]


@dataclass
class Cost:
    label: str
    units: int
    xacts: float
    wal_bytes: float
    cpu_ms: float
    heap_bytes: dict[str, float]
    index_bytes: dict[str, float]


class Server:
    def __init__(self) -> None:
        from django.db import connection

        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid(), inet_server_addr()")
            self.pid, address = cursor.fetchone()
        if not Path(f"/proc/{self.pid}/stat").exists():
            sys.exit(f"the server must run on this machine (its CPU is read from /proc): {address}")

    def read(self) -> Reading:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
            xacts = cursor.fetchone()[0]
            cursor.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
            wal = int(cursor.fetchone()[0])
            heap, index = {}, {}
            for table in TABLES:
                cursor.execute(
                    "SELECT pg_relation_size(%s) + pg_relation_size(COALESCE("
                    "  (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass), 0)), "
                    "pg_indexes_size(%s)",
                    [table, table, table],
                )
                heap[table], index[table] = cursor.fetchone()
        return Reading(xacts, wal, backend_cpu_seconds(self.pid), heap, index)


def cost(label: str, before: Reading, after: Reading, units: int) -> Cost:
    return Cost(
        label=label,
        units=units,
        xacts=(after.xacts - before.xacts) / units,
        wal_bytes=(after.wal - before.wal) / units,
        cpu_ms=(after.cpu - before.cpu) * 1000 / units,
        heap_bytes={t: (after.heap[t] - before.heap[t]) / units for t in TABLES},
        index_bytes={t: (after.index[t] - before.index[t]) / units for t in TABLES},
    )


def run_workload(server: Server, agent_name: str, runs: int, steps: int) -> Cost:
    from django_q.models import OrmQ

    from accounts.models import Tenant
    from agentruns import services
    from agentruns.runtime import Engine, EngineSettings

    registry = build_registry(steps)
    tenant = Tenant.objects.get_or_create(slug=TENANT_SLUG, defaults={"name": "Bench"})[0]
    engine = Engine(
        registry=registry,
        settings=EngineSettings(time_slice_seconds=10_000, lease_seconds=60),
        enqueue=lambda run_id: None,
    )
    services.get_registry = lambda: registry  # the benchmark's agents, through real admission
    before = server.read()
    for _ in range(runs):
        run, _ = services.run_start(tenant=tenant, agent_name=agent_name, input={"steps": steps})
        outcome = engine.advance(run.id)
        if outcome != "finished:completed":
            sys.exit(f"run {run.id} of {agent_name} ended {outcome!r}")
        # What the pusher does with the knock once a worker took it.
        OrmQ.objects.all().delete()
    after = server.read()
    return cost(agent_name, before, after, runs)


def baseline(server: Server, n: int) -> Cost:
    from django.db import connection

    before = server.read()
    with connection.cursor() as cursor:
        for _ in range(n):
            cursor.execute("UPDATE bench_counter SET n = n + 1 WHERE id = 1")
    return cost("single-row UPDATE", before, server.read(), n)


def human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1024
    raise AssertionError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per workload (default 200)")
    parser.add_argument("--steps", type=int, default=10, help="steps per run (default 10)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument(
        "--runs-per-day", type=int, default=1_000_000, help="for the projection (default 1M)"
    )
    parser.add_argument(
        "--retention-days", type=int, default=30, help="for the projection (default 30)"
    )
    args = parser.parse_args(argv)
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        parser.error("PostgreSQL only: set DATABASE_URL to a database whose name contains 'bench'")

    scratch = configure_environment()
    try:
        label = prepare_database()
        server = Server()
        print(
            f"{label}; {os.cpu_count()} cores here; {args.runs} runs of {args.steps} steps, "
            f"{args.repeat} repetitions, medians"
        )
        # Warm up: imports, prepared statements, the tables' first pages.
        run_workload(server, READ_ONLY_AGENT, 5, args.steps)
        samples: dict[str, list[Cost]] = {"baseline": [], READ_ONLY_AGENT: [], EFFECT_AGENT: []}
        for _ in range(args.repeat):
            samples["baseline"].append(baseline(server, args.runs * args.steps))
            for agent_name in (READ_ONLY_AGENT, EFFECT_AGENT):
                samples[agent_name].append(run_workload(server, agent_name, args.runs, args.steps))
        report(samples, args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def median(costs: list[Cost], pick) -> float:
    return statistics.median(pick(c) for c in costs)


def report(samples: dict[str, list[Cost]], args: argparse.Namespace) -> None:
    steps = args.steps
    base = samples["baseline"]
    base_cpu = median(base, lambda c: c.cpu_ms)
    base_wal = median(base, lambda c: c.wal_bytes)
    print(
        f"\nbaseline, one single-row autocommit UPDATE: {base_cpu:.3f} ms server CPU, "
        f"{human(base_wal)} WAL, {median(base, lambda c: c.xacts):.2f} transactions"
    )
    print(
        "\nper run (admission + advance + the knock's queue row), and per step "
        "(the run's figure / steps):"
    )
    header = (
        f"{'workload':<22} {'xacts/run':>10} {'xacts/step':>10} {'WAL/run':>11} "
        f"{'WAL/step':>10} {'CPU/step':>9} {'/ UPDATE':>9} {'rows+idx/run':>13}"
    )
    print(header)
    print("-" * len(header))
    per_step_cpu = {}
    per_run_bytes = {}
    for agent_name in (READ_ONLY_AGENT, EFFECT_AGENT):
        costs = samples[agent_name]
        xacts = median(costs, lambda c: c.xacts)
        wal = median(costs, lambda c: c.wal_bytes)
        cpu = median(costs, lambda c: c.cpu_ms) / steps
        stored = median(costs, lambda c: sum(c.heap_bytes.values()) + sum(c.index_bytes.values()))
        per_step_cpu[agent_name] = cpu
        per_run_bytes[agent_name] = (wal, stored)
        print(
            f"{agent_name:<22} {xacts:>10.2f} {xacts / steps:>10.2f} {human(wal):>11} "
            f"{human(wal / steps):>10} {cpu:>7.3f}ms {cpu / base_cpu:>8.1f}x "
            f"{human(stored):>13}"
        )
    print("\nstorage per run, by table (heap + TOAST / indexes):")
    for agent_name in (READ_ONLY_AGENT, EFFECT_AGENT):
        costs = samples[agent_name]
        parts = ", ".join(
            f"{table.removeprefix('agentruns_')} "
            f"{human(median(costs, lambda c, t=table: c.heap_bytes[t]))} / "
            f"{human(median(costs, lambda c, t=table: c.index_bytes[t]))}"
            for table in TABLES
        )
        print(f"  {agent_name}: {parts}")

    print("\nwhat one primary carries (server CPU only; the workers are other machines):")
    for agent_name in (READ_ONLY_AGENT, EFFECT_AGENT):
        cpu = per_step_cpu[agent_name]
        wal, stored = per_run_bytes[agent_name]
        per_core = 1000 / cpu if cpu else float("inf")
        day_wal = wal * args.runs_per_day
        hot = stored * args.runs_per_day * args.retention_days
        print(
            f"  {agent_name}: {per_core:,.0f} steps/s per server core "
            f"({per_core / steps:,.0f} runs/s of {steps} steps); at {args.runs_per_day:,} "
            f"runs a day: {human(day_wal)} WAL a day, {human(hot)} of hot run/step/event "
            f"rows after {args.retention_days} days of retention"
        )
    print(
        "\n(a projection from one machine's per-step figures: it leaves out the pages'"
        " reads, autovacuum and checkpoints; docs/scaling.md §6 says what limits first)"
    )


if __name__ == "__main__":
    sys.exit(main())
