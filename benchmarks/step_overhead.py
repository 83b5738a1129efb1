"""What one engine step costs, against the database's bare commit rate.

Runs two agents in-process through ``Engine.advance`` (one claim does the whole
run): one takes N read-only tool steps, the other N effect steps, every tool a
no-op that answers at once. The floor is a loop of N single-row autocommit
UPDATEs on the same database through the same Django connection. Prints steps
per second, the ratio to that floor, and how many commits (and, on PostgreSQL,
WAL syncs) each step costs, with the targets of shared/reference/step-write-cost.md.

    .venv/bin/python benchmarks/step_overhead.py [--steps N] [--repeat R] [--profile] [--unprepared]
        [--no-flush]

SQLite by default, in a temporary file (the developer's var/ is never touched);
PostgreSQL when DATABASE_URL is set, e.g.
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_bench``. The
PostgreSQL database must be a dedicated one (its name contains "bench"); it is
created if missing and migrated. A measurement, not a test: exit status 0
whatever the figures.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from agentruns.runtime import Engine, Registry, RunContext

READ_ONLY_AGENT = "bench_read_only"
EFFECT_AGENT = "bench_effect"
KINDS = {"read-only": READ_ONLY_AGENT, "effect": EFFECT_AGENT}
# Targets (printed, never asserted): commits per step and step_rate / raw_commit_rate.
COMMIT_TARGETS = {"read-only": 1, "effect": 2}
RATIO_TARGETS = {"read-only": 0.5, "effect": 0.3}
TENANT_SLUG = "bench"


# --- environment --------------------------------------------------------------------


def configure_environment() -> Path:
    """Point settings at throw-away places before Django reads them; returns the temp dir."""
    scratch = Path(tempfile.mkdtemp(prefix="holdfast-bench-"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    # Nothing under the project's var/ is read or written: SQLite file, media, secret key.
    os.environ["HOLDFAST_VAR_DIR"] = str(scratch)
    os.environ["HOLDFAST_SQLITE_PATH"] = str(scratch / "bench.sqlite3")
    os.environ["DJANGO_SECRET_KEY"] = "benchmark-only-not-secret"
    # DEBUG would keep every query in connection.queries.
    os.environ["DJANGO_DEBUG"] = "false"
    import django

    django.setup()
    return scratch


def prepare_database() -> str:
    """Create (PostgreSQL, if missing) and migrate the benchmark database; returns a label."""
    from django.core.management import call_command
    from django.db import connection

    if connection.vendor == "postgresql":
        ensure_postgres_database(connection.settings_dict)
        call_command("migrate", verbosity=0, interactive=False)
    else:
        call_command("migrate", verbosity=0, interactive=False)
        call_command("migrate", verbosity=0, interactive=False, database="queue")
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS bench_counter (id integer PRIMARY KEY, n bigint NOT NULL)"
        )
        cursor.execute("DELETE FROM bench_counter")
        cursor.execute("INSERT INTO bench_counter (id, n) VALUES (1, 0)")
        if connection.vendor == "postgresql":
            # Earlier benchmark runs leave dead rows behind; start from clean tables.
            cursor.execute(
                "VACUUM ANALYZE agentruns_run, agentruns_step, agentruns_runevent, bench_counter"
            )
    settings_dict = connection.settings_dict
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('server_version'), current_setting('fsync'), "
                "current_setting('synchronous_commit'), current_setting('wal_sync_method')"
            )
            version, fsync, sync_commit, sync_method = cursor.fetchone()
        where = f"{settings_dict['NAME']} @ {settings_dict['HOST'] or 'socket'}"
        if settings_dict["PORT"]:
            where += f":{settings_dict['PORT']}"
        return (
            f"PostgreSQL {version} ({where}); fsync={fsync} "
            f"synchronous_commit={sync_commit} wal_sync_method={sync_method}"
        )
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        journal = cursor.fetchone()[0]
        cursor.execute("PRAGMA synchronous")
        synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(cursor.fetchone()[0])
        cursor.execute("SELECT sqlite_version()")
        version = cursor.fetchone()[0]
    return (
        f"SQLite {version} (temporary file {settings_dict['NAME']}); "
        f"journal_mode={journal} synchronous={synchronous}"
    )


def ensure_postgres_database(settings_dict: dict[str, Any]) -> None:
    import psycopg
    from psycopg import sql

    name = settings_dict["NAME"]
    if "bench" not in name:
        sys.exit(
            f"refusing to write benchmark runs into database {name!r}: point DATABASE_URL at a "
            "dedicated database whose name contains 'bench', e.g. "
            "postgres://postgres@127.0.0.1:5432/holdfast_bench"
        )
    params = {
        "host": settings_dict["HOST"] or None,
        "port": settings_dict["PORT"] or None,
        "user": settings_dict["USER"] or None,
        "password": settings_dict["PASSWORD"] or None,
        "dbname": "postgres",
    }
    with psycopg.connect(**{k: v for k, v in params.items() if v}, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


# --- the agents ---------------------------------------------------------------------


class StepArgs(BaseModel):
    i: int


def build_registry(max_steps: int) -> Registry:
    """Two agents: N read-only tool steps, or N effect steps; every tool a no-op."""
    from agentruns.runtime import READ_ONLY, Budget, Registry, agent, idempotent, tool

    @tool(name="noop_read", args=StepArgs, description="Read nothing.", recovery=READ_ONLY)
    def noop_read(request: dict[str, Any], call: Any) -> dict[str, Any]:
        return {"i": request["i"], "ok": True}

    @tool(
        name="noop_effect",
        args=StepArgs,
        description="Change nothing, idempotently.",
        recovery=idempotent(timedelta(hours=24)),
    )
    def noop_effect(request: dict[str, Any], call: Any) -> dict[str, Any]:
        return {"id": f"fx_{request['i']}", "ok": True}

    tools = [noop_read, noop_effect]
    budget = Budget(max_steps=max_steps + 10)

    def loop(tool_name: str) -> Callable[[RunContext, dict[str, Any]], dict[str, Any]]:
        def fn(ctx: RunContext, input: dict[str, Any]) -> dict[str, Any]:
            for i in range(input["steps"]):
                result = ctx.tool(tool_name, {"i": i})
                if not result.ok:
                    raise RuntimeError(f"step {i} of {tool_name}: {result.error}")
            return {"steps": input["steps"]}

        return fn

    read_only_agent = agent(name=READ_ONLY_AGENT, version=1, tools=tools, budget=budget)(
        loop("noop_read")
    )
    effect_agent = agent(name=EFFECT_AGENT, version=1, tools=tools, budget=budget)(
        loop("noop_effect")
    )
    return Registry([read_only_agent, effect_agent])


# --- counting commits ---------------------------------------------------------------


Counts = dict[str, int]


class SqliteCounter:
    """Counts what the raw sqlite3 connection executes, from its trace callback.

    A commit is an explicit COMMIT or a write statement outside a transaction
    (SQLite autocommits it); a read is a statement outside a transaction that
    writes nothing.
    """

    def __init__(self) -> None:
        from django.db import connection

        connection.ensure_connection()
        self.raw = connection.connection
        # About 1 us per statement, against 100+ us per commit: left on while timing.
        self.counts: Counts = {"commits": 0, "reads": 0, "rollbacks": 0}
        self.raw.set_trace_callback(self._trace)

    def _trace(self, statement: str) -> None:
        head = statement.lstrip()[:8].upper()
        if head.startswith(("COMMIT", "END")):
            self.counts["commits"] += 1
        elif head.startswith("ROLLBACK"):
            self.counts["rollbacks"] += 1
        elif head.startswith(("BEGIN", "SAVEPOINT", "RELEASE", "--")):
            pass
        elif not self.raw.in_transaction:
            if head.startswith(("INSERT", "UPDATE", "DELETE", "REPLACE")):
                self.counts["commits"] += 1
            else:
                self.counts["reads"] += 1

    def read(self) -> Counts:
        return dict(self.counts)

    def close(self) -> None:
        self.raw.set_trace_callback(None)


class PostgresCounter:
    """Reads the server's statistics from the benchmark's own connection.

    ``xact_commit`` is per database and counts every transaction, read-only
    autocommit statements included; the xid horizon advances once per
    transaction that wrote; ``wal_sync`` is the cluster's WAL flushes. Both of
    the latter are cluster-wide, so other databases' activity shows in them.
    """

    def read(self) -> Counts:
        from django.db import connection

        with connection.cursor() as cursor:
            # Our own backend's statistics are flushed when it next goes idle.
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute(
                "SELECT (SELECT xact_commit FROM pg_stat_database "
                "        WHERE datname = current_database()), "
                "       wal_sync, wal_bytes, "
                "       pg_snapshot_xmax(pg_current_snapshot())::text::bigint "
                "FROM pg_stat_wal"
            )
            xacts, wal_syncs, wal_bytes, next_xid = cursor.fetchone()
        return {
            "xacts": int(xacts),
            "writes": int(next_xid),
            "wal_syncs": int(wal_syncs),
            "wal_bytes": int(wal_bytes),
        }

    def close(self) -> None:
        pass


def delta(after: Counts, before: Counts) -> Counts:
    return {key: after[key] - before[key] for key in after}


# --- what is measured -----------------------------------------------------------------


@dataclass
class Samples:
    seconds: list[float] = field(default_factory=list)
    counts: list[Counts] = field(default_factory=list)
    # For engine runs: the baseline measured just before each one, for its ratio.
    paired_baseline: list[float] = field(default_factory=list)


class Bench:
    def __init__(self, steps: int, *, prepared: bool = True) -> None:
        from django.db import connection

        from accounts.models import Tenant
        from agentruns.runtime import Engine, EngineSettings

        self.steps = steps
        self.vendor = connection.vendor
        self.registry = build_registry(steps)
        self.tenant = Tenant.objects.get_or_create(slug=TENANT_SLUG, defaults={"name": "Bench"})[0]
        self.engine: Engine = Engine(
            registry=self.registry,
            settings=EngineSettings(
                time_slice_seconds=10_000, lease_seconds=60, prepared_statements=prepared
            ),
            enqueue=lambda run_id: None,
        )
        self.counter: SqliteCounter | PostgresCounter = (
            PostgresCounter() if self.vendor == "postgresql" else SqliteCounter()
        )

    # One engine run: start it, time the one advance that does all of it, count, clean up.
    def engine_run(
        self, kind: str, steps: int, *, profile: cProfile.Profile | None = None
    ) -> tuple[float, Counts]:
        from agentruns.runtime import start_run

        run, _ = start_run(
            registry=self.registry,
            tenant=self.tenant,
            agent_name=KINDS[kind],
            input={"steps": steps},
        )
        gc.collect()
        before = self.counter.read()
        started = time.perf_counter()
        if profile is not None:
            profile.enable()
        outcome = self.engine.advance(run.id)
        if profile is not None:
            profile.disable()
        elapsed = time.perf_counter() - started
        counts = delta(self.counter.read(), before)
        assert outcome == "finished:completed", f"{kind} run {run.id} ended {outcome!r}"
        self.delete_run(run.id)
        return elapsed, counts

    def baseline(self, n: int) -> tuple[float, Counts]:
        """N single-row autocommit UPDATEs through the same Django connection."""
        from django.db import connection

        gc.collect()
        before = self.counter.read()
        with connection.cursor() as cursor:
            started = time.perf_counter()
            for _ in range(n):
                cursor.execute("UPDATE bench_counter SET n = n + 1 WHERE id = 1")
            elapsed = time.perf_counter() - started
        return elapsed, delta(self.counter.read(), before)

    def delete_run(self, run_id: uuid.UUID) -> None:
        from django.db import connection

        key = run_id if self.vendor == "postgresql" else run_id.hex
        with connection.cursor() as cursor:
            for table in ("agentruns_runevent", "agentruns_step"):
                cursor.execute(f"DELETE FROM {table} WHERE run_id = %s", [key])
            cursor.execute("DELETE FROM agentruns_run WHERE id = %s", [key])

    def close(self) -> None:
        self.counter.close()


def per_op(counts: list[Counts], fixed: Counts, n: int) -> dict[str, float]:
    """Median over samples of (count - fixed per-run cost) / n, per counter."""
    keys = counts[0].keys()
    result = {k: statistics.median((c[k] - fixed.get(k, 0)) / n for c in counts) for k in keys}
    if "wal_bytes" in result:
        result["wal_kb"] = result["wal_bytes"] / 1024
    return result


def median_counts(counts: list[Counts]) -> Counts:
    return {k: int(statistics.median(c[k] for c in counts)) for k in counts[0]}


def profile_runs(bench: Bench, steps: int, top: int = 15) -> str:
    out = io.StringIO()
    for kind in KINDS:
        profile = cProfile.Profile()
        elapsed, _ = bench.engine_run(kind, steps, profile=profile)
        out.write(
            f"\n--- cProfile, one {kind} run of {steps} steps "
            f"({elapsed * 1000 / steps:.3f} ms/step under the profiler), "
            f"top {top} by cumulative time ---\n"
        )
        stats = pstats.Stats(profile, stream=out)
        stats.strip_dirs().sort_stats("cumulative").print_stats(top)
        out.write(f"--- same run, top {top} by own time ---\n")
        stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


# --- report ---------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def report(
    label: str,
    steps: int,
    repeat: int,
    base: Samples,
    runs: dict[str, Samples],
    fixed: dict[str, Counts],
) -> str:
    pg = "wal_syncs" in base.counts[0]
    count_columns = (
        [
            ("xacts", "xacts/op"),
            ("writes", "writes/op"),
            ("wal_syncs", "WAL syncs/op"),
            ("wal_kb", "WAL kB/op"),
        ]
        if pg
        else [("commits", "commits/op"), ("reads", "reads/op")]
    )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        f"Holdfast step overhead: {label}",
        f"{steps} steps per run, median of {repeat} (best: the fastest); baseline: {steps} "
        "single-row autocommit",
        f"UPDATEs on the same connection, before each run; {os.cpu_count()} CPUs, load average "
        f"{load} at the end",
        "",
    ]
    header = f"{'':<16}{'ops/s':>8}{'ms/op':>8}{'best':>8}{'ratio':>7}"
    header += "".join(f"{title:>{len(title) + 2}}" for _, title in count_columns)
    lines += [header, "-" * len(header)]

    def row(name: str, seconds: list[float], ratio: float | None, counts: dict) -> str:
        ms = statistics.median(seconds) * 1000 / steps
        best = min(seconds) * 1000 / steps
        ratio_text = "1" if ratio is None else f"{ratio:.2f}"
        text = f"{name:<16}{1000 / ms:>8.0f}{ms:>8.3f}{best:>8.3f}{ratio_text:>7}"
        return text + "".join(f"{counts[k]:>{len(t) + 2}.2f}" for k, t in count_columns)

    lines.append(row("raw UPDATE", base.seconds, None, per_op(base.counts, {}, steps)))
    figures: dict[str, tuple[float, dict[str, float]]] = {}
    for kind, samples in runs.items():
        # Each run's step rate against the baseline measured just before it.
        pairs = zip(samples.seconds, samples.paired_baseline, strict=True)
        ratio = round(statistics.median(b / s for s, b in pairs), 2)
        counts = per_op(samples.counts, fixed[kind], steps)
        figures[kind] = (ratio, counts)
        lines.append(row(f"{kind} step", samples.seconds, ratio, counts))
    lines.append("")
    if pg:
        lines += [
            "xacts: pg_stat_database.xact_commit, every transaction (autocommit reads too);",
            "writes: transactions that wrote (xid horizon); WAL: pg_stat_wal.wal_sync and",
            "wal_bytes. writes and WAL are cluster-wide: other databases' activity shows in them.",
        ]
    else:
        lines += [
            "commits: COMMITs and autocommitted writes; reads: statements outside a write",
            "transaction (both from the connection's trace callback).",
        ]
    lines.append("Per-step counts leave out a run's claim and finish (a 0-step run's).")
    rollbacks = sum(c.get("rollbacks", 0) for s in runs.values() for c in s.counts)
    if rollbacks:
        lines.append(f"Note: {rollbacks} ROLLBACKs during the timed runs (lost fences?).")
    lines.append("")
    commit_key = "xacts" if pg else "commits"
    lines.append(f"{'targets (not asserted)':<24}{commit_key + '/step':<22}ratio")
    for kind, (ratio, counts) in figures.items():
        target = COMMIT_TARGETS[kind]
        floor = RATIO_TARGETS[kind]
        commits = counts[commit_key]
        commit_text = f"{commits:.2f} = {target}  {verdict(abs(commits - target) <= 0.05)}"
        ratio_text = f"{ratio:.2f} >= {floor:.1f}  {verdict(ratio >= floor)}"
        text = f"  {kind:<22}{commit_text:<22}{ratio_text:<21}"
        if pg:
            writes = counts["writes"]
            text += f"writes/step {writes:.2f} = {target}  {verdict(abs(writes - target) <= 0.05)}"
        lines.append(text.rstrip())
    return "\n".join(lines)


# --- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per run (default 2000)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (default 5)")
    parser.add_argument("--profile", action="store_true", help="also cProfile one run of each kind")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="stop repeating (after at least 3 repetitions) when the next one would end past "
        "this many seconds since start; 0 for no limit (default 60)",
    )
    parser.add_argument(
        "--unprepared",
        action="store_true",
        help="PostgreSQL: the engine's statements unprepared, as with "
        "HOLDFAST_PREPARED_STATEMENTS=false behind a pooler (docs/scaling.md)",
    )
    parser.add_argument(
        "--no-flush",
        action="store_true",
        help="PostgreSQL: synchronous_commit off for the benchmark's connection, so no "
        "commit (the floor's or a step's) waits for its WAL flush: what is left is CPU "
        "and round trips, and the difference to a run without it is the flushes' wait",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeat < 1:
        parser.error("--steps and --repeat must be at least 1")

    began = time.monotonic()
    scratch = configure_environment()
    try:
        from django.db import connection, connections

        label = prepare_database()
        bench = Bench(args.steps, prepared=not args.unprepared)
        if args.unprepared:
            label += "; the engine's statements unprepared (--unprepared)"
        if args.no_flush:
            if connection.vendor != "postgresql":
                parser.error("--no-flush is for PostgreSQL")
            with connection.cursor() as cursor:
                cursor.execute("SET synchronous_commit = off")
            label += "; synchronous_commit off for this connection (--no-flush)"
        try:
            # Warm up: imports, prepared statements, the tables' pages.
            warm = min(args.steps, 100)
            bench.baseline(warm)
            for kind in KINDS:
                bench.engine_run(kind, warm)
            # A run's own cost (claim, replay start, finish), subtracted from the per-step counts.
            fixed = {
                kind: median_counts([bench.engine_run(kind, 0)[1] for _ in range(3)])
                for kind in KINDS
            }
            base = Samples()
            runs = {kind: Samples() for kind in KINDS}
            done = 0
            while done < args.repeat:
                repetition_began = time.monotonic()
                for kind in KINDS:
                    # The floor right before each run, so both see the same machine load.
                    base_seconds, base_counts = bench.baseline(args.steps)
                    base.seconds.append(base_seconds)
                    base.counts.append(base_counts)
                    seconds, counts = bench.engine_run(kind, args.steps)
                    runs[kind].seconds.append(seconds)
                    runs[kind].counts.append(counts)
                    runs[kind].paired_baseline.append(base_seconds)
                done += 1
                now = time.monotonic()
                past_budget = now + (now - repetition_began) - began > args.max_seconds
                if args.max_seconds and done >= 3 and done < args.repeat and past_budget:
                    label += (
                        f"\nstopped after {done} of {args.repeat} repetitions: the next would "
                        f"end past --max-seconds {args.max_seconds:g}"
                    )
                    break
            print(report(label, args.steps, done, base, runs, fixed))
            if args.profile:
                print(profile_runs(bench, args.steps))
        finally:
            bench.close()
            connections.close_all()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
