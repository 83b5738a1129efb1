"""Throughput of real worker clusters, against pgbench's commit rate measured in the same run.

Run from the project root, against a PostgreSQL server::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/holdfast_throughput_bench \\
        .venv/bin/python benchmarks/throughput.py [--configs 1x2,2x2,1x4] [--repeat 3]
        [--runs 300] [--steps 10] [--profile] [--dbos-python /tmp/dbos-venv/bin/python]

The workload: ``--runs`` runs of ``--steps`` no-op read-only tool steps each
(``benchmarks/throughput_agents.py``), started in one burst through
``run_start`` (admission, in this process) while K worker clusters of W workers
each (``manage.py worker``, each its own process group) and one sweeper
(``manage.py sweep --loop``) run them. Each configuration (``KxW``) is measured
``--repeat`` times, interleaved, with fresh clusters and empty run tables each
time; the figures are medians. Printed per configuration:

- steps per second: all steps over the database's time from the first run's
  enqueue to the last run's end;
- worker CPU per step: user + system time of every process of the clusters
  (``/proc/<pid>/stat``, reaped children included), over the burst;
- database CPU per step: the same for the PostgreSQL backends serving the
  benchmark database (found by their process title, sampled through the burst so a
  backend that exits is counted up to its last sample); this process's own backend
  is counted apart, as admission's database cost;
- commits per step: ``xact_commit`` of ``pg_stat_database`` for the database;
- queue latency p50/p95, from a run's enqueue stamp to its first claim (both
  the database's clock): under the burst; at half of saturation (runs started
  evenly at half the rate the burst just sustained, for ``--paced-seconds``); and
  at low load (``--latency-runs`` runs one after another, each started once the
  one before ended);
- admission: this process's CPU per ``run_start`` (and its backend's);
- the ceiling: ``pgbench`` on a database of its own, one single-row UPDATE per
  transaction, with as many clients as the configuration has workers, run in
  the same repetition; each configuration's steps/s is shown as a ratio of it;
- with ``--dbos-python PATH``, DBOS Transact on the same workload, in the same
  repetition: ``benchmarks/dbos_queue.py`` run by that Python (a virtualenv of its
  own, ``python3 -m venv /tmp/dbos-venv && /tmp/dbos-venv/bin/pip install
  dbos==3.4.0``: DBOS's dependencies may clash with the project's), one workflow of
  ``--steps`` ``@DBOS.step()`` no-op steps per run, enqueued in one burst on a DBOS
  queue whose concurrency is the configuration's KxW (polled every ``--dbos-poll``
  seconds, run by ``--dbos-processes`` executor processes), on a system database of
  its own that is emptied before each measurement. Its steps/s, executor CPU, database
  CPU (the same sampler) and commits per step get a row per concurrency, and each
  configuration's steps/s is shown as a ratio of DBOS's at its concurrency. Without
  the option DBOS is not measured, and the report says so.

``--profile`` runs the first configuration once with every cluster process (and
the sweeper) under cProfile and counting its SQL statements
(``benchmarks/throughput_worker.py``), and prints the workers' top functions and
the statements per run of each kind of process.

The benchmark database (its name must contain "bench") is created and migrated
if missing, and its run tables are emptied before each measurement. The machine
may be shared: absolute figures move with its load, the ratios to pgbench less.
A measurement, not a test: exit status 0 whatever the figures, unless it could
not measure.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import cProfile
import io
import json
import os
import pstats
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.pipe_lines import LineReader  # noqa: E402 - the project root is on sys.path first
from benchmarks.recovery import (  # noqa: E402
    BenchmarkError,
    Group,
    Supervisor,
    measure_defaults,
    percentile,
    progress,
)

PYTHON = sys.executable
MANAGE = str(ROOT / "manage.py")
PROFILED = str(ROOT / "benchmarks" / "throughput_worker.py")
AGENT_MODULE = "benchmarks.throughput_agents"
AGENT_NAME = "throughput_noop"  # benchmarks.throughput_agents.AGENT_NAME
PROFILE_DIR_ENV = "HOLDFAST_BENCH_PROFILE_DIR"
PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"
# Run by --dbos-python, never imported here: it needs the dbos package, kept out of
# the project's environment.
DBOS_SCRIPT = str(ROOT / "benchmarks" / "dbos_queue.py")
PGBENCH_SCRIPT = (
    "\\set aid random(1, 100000)\n"
    "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n"
)
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Targets, printed next to the figures (never asserted).
TARGET_RATIO = 0.15
TARGET_WORKER_CPU_MS = 1.2
TARGET_ADMISSION_MS = 1.5
TARGET_HALF_LOAD_P95_MS = 200
TARGET_DBOS_RATIO = 5.0


# --- /proc -----------------------------------------------------------------------------


def proc_cpu(pid: int, *, children: bool = True) -> tuple[float, int, int] | None:
    """(CPU seconds, parent pid, start time) of a process, or None when it is gone.

    With ``children`` the CPU of its reaped children is included (cutime, cstime).
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLK_TCK, int(fields[1]), int(fields[19])


def group_cpu(pgid: int) -> float:
    """CPU seconds of every live process of a process group, their reaped children included."""
    total = 0.0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            total += sum(int(f) for f in fields[11:15]) / CLK_TCK
    return total


class BackendSampler:
    """CPU of the PostgreSQL backends serving some databases, sampled in a thread.

    A backend is a child of the postmaster whose process title names the database.
    Each is read every ``interval`` seconds; one that exits keeps its last reading,
    so its work up to then counts. ``excluded`` backends are counted apart.
    """

    def __init__(self, postmaster: int, databases: set[str], interval: float = 0.2):
        self.postmaster = postmaster
        self.databases = databases
        self.interval = interval
        self.excluded: set[int] = set()
        # (pid, start time) -> (database, CPU seconds at first and at last reading)
        self.readings: dict[tuple[int, int], tuple[str, float, float]] = {}
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None

    def _database_of(self, pid: int) -> str | None:
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
        # "postgres: [<cluster>:] <user> <database> <host>(<port>) <state>"
        parts = title.split()
        if not parts or parts[0] != "postgres:":
            return None
        parts = parts[2:] if len(parts) > 1 and parts[1].endswith(":") else parts[1:]
        if len(parts) >= 2 and parts[1] in self.databases:
            return parts[1]
        return None

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            reading = proc_cpu(pid, children=False)
            if reading is None or reading[1] != self.postmaster:
                continue
            cpu, _, started = reading
            key = (pid, started)
            with self.lock:
                known = self.readings.get(key)
                if known is not None:
                    self.readings[key] = (known[0], known[1], cpu)
                    continue
            database = self._database_of(pid)
            if database is not None:
                with self.lock:
                    # A backend first seen now started during the window: all its CPU counts.
                    first = cpu if self.thread is None else 0.0
                    self.readings[key] = (database, first, cpu)

    def start(self) -> None:
        self.readings.clear()
        self.thread = None
        self.sample()  # the backends that exist now: their CPU so far is not counted
        self.stop_event.clear()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> tuple[dict[str, float], float]:
        """CPU seconds per database since ``start``, and that of the excluded backends."""
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join()
        self.sample()
        totals: dict[str, float] = {}
        excluded = 0.0
        with self.lock:
            for (pid, _), (database, first, last) in self.readings.items():
                if pid in self.excluded:
                    excluded += last - first
                else:
                    totals[database] = totals.get(database, 0.0) + last - first
        return totals, excluded


# --- environment and databases -----------------------------------------------------------


@dataclass
class Setup:
    url: str
    database: str
    pgbench_database: str
    workdir: Path
    env: dict[str, str]
    postmaster: int
    description: str
    # DBOS's system database (--dbos-python): benchmarks/dbos_queue.py creates it.
    dbos_database: str = ""


def prepare(args: argparse.Namespace) -> Setup:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        raise BenchmarkError(
            "set DATABASE_URL to a PostgreSQL database whose name contains 'bench', e.g. "
            "postgres://postgres@127.0.0.1:5432/holdfast_throughput_bench"
        )
    parts = urlsplit(url)
    database = parts.path.lstrip("/")
    if "bench" not in database:
        raise BenchmarkError(
            f"refusing to write benchmark runs into database {database!r}: name a dedicated "
            "database whose name contains 'bench'"
        )
    if parts.hostname not in LOCAL_HOSTS:
        raise BenchmarkError(
            f"the server must be local (its backends' CPU is read from /proc): {parts.hostname}"
        )
    workdir = Path(tempfile.mkdtemp(prefix="holdfast-throughput-"))
    (workdir / "logs").mkdir()
    (workdir / "var").mkdir()
    measure_defaults()
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "HOLDFAST_AGENT_MODULES": AGENT_MODULE,
            "HOLDFAST_VAR_DIR": str(workdir / "var"),
            "DJANGO_SECRET_KEY": "benchmark-only-not-secret",
            "DJANGO_DEBUG": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    pgbench_database = f"{database}_pgbench"
    admin = urlunsplit(parts._replace(path="/postgres"))
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin, autocommit=True) as conn:
        existing = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
        for name in (database, pgbench_database):
            if name not in existing:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                progress(f"created database {name}")
        postmaster = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'"
        ).fetchone()
        version = conn.execute(
            "SELECT current_setting('server_version'), current_setting('synchronous_commit')"
        ).fetchone()
    checkpointer = postmaster[0] if postmaster else None
    reading = proc_cpu(checkpointer) if checkpointer else None
    if reading is None:
        raise BenchmarkError("cannot find the PostgreSQL server's processes in /proc")
    import django

    django.setup()
    # This process only starts runs; django-q2 logs every enqueue at INFO.
    import logging

    logging.getLogger("django-q").setLevel(logging.WARNING)
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    description = (
        f"PostgreSQL {version[0]} {parts.hostname}:{parts.port or 5432}/{database} "
        f"(synchronous_commit={version[1]})"
    )
    progress(f"database ready: {description}")
    return Setup(
        url,
        database,
        pgbench_database,
        workdir,
        dict(os.environ),
        reading[1],
        description,
        dbos_database=f"{database}_dbos",
    )


def empty_run_tables() -> None:
    """Every run, step, event and queued task of earlier measurements goes."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE agentruns_run, django_q_ormq, django_q_task RESTART IDENTITY CASCADE"
        )
        cursor.execute("VACUUM ANALYZE agentruns_run, agentruns_step, agentruns_runevent")


def commits(database: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [database])
        return int(cursor.fetchone()[0])


# --- one measurement -------------------------------------------------------------------------


@dataclass
class Measurement:
    config: str
    steps_per_second: float
    worker_cpu_ms: float
    db_cpu_ms: float
    sweeper_cpu_ms: float
    commits_per_step: float
    burst_latency: list[float]
    half_latency: list[float]
    low_latency: list[float]
    admission_cpu_ms: float
    admission_db_cpu_ms: float
    pgbench_tps: float = 0.0
    pgbench_db_cpu_ms: float = 0.0
    dbos_steps_per_second: float = 0.0


@dataclass
class DbosMeasurement:
    """DBOS Transact on the same workload at one concurrency (``benchmarks/dbos_queue.py``)."""

    concurrency: int
    version: str
    processes: int
    polling_interval_sec: float
    steps_per_second: float
    worker_cpu_ms: float
    db_cpu_ms: float
    commits_per_step: float
    burst_latency: list[float]
    enqueue_cpu_ms: float
    enqueue_db_cpu_ms: float
    pgbench_tps: float = 0.0
    pgbench_db_cpu_ms: float = 0.0


def dbos_check(python: str) -> str:
    """The version of dbos that ``python`` imports; fails early, before any measurement."""
    probe = "import importlib.metadata, dbos, psycopg; print(importlib.metadata.version('dbos'))"
    try:
        done = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BenchmarkError(f"--dbos-python {python}: {exc}") from exc
    if done.returncode != 0:
        raise BenchmarkError(
            f"--dbos-python {python} cannot import dbos: {done.stderr.strip()[-500:]}\n"
            "set up its virtualenv: python3 -m venv /tmp/dbos-venv && "
            "/tmp/dbos-venv/bin/pip install dbos==3.4.0"
        )
    return done.stdout.strip()


def parse_config(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not match or int(match[1]) < 1 or int(match[2]) < 1:
        raise argparse.ArgumentTypeError(f"a configuration is KxW, e.g. 2x2, not {text!r}")
    return int(match[1]), int(match[2])


class Bench:
    def __init__(self, setup: Setup, args: argparse.Namespace):
        self.setup = setup
        self.args = args
        self.supervisor = Supervisor(setup.workdir / "logs", setup.env)
        atexit.register(self.supervisor.cleanup)
        self.sampler = BackendSampler(setup.postmaster, {setup.database})
        from django.db import connection

        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.sampler.excluded.add(cursor.fetchone()[0])
        from accounts.models import Tenant

        self.tenant = Tenant.objects.get(slug="default")
        self.sweeper: Group | None = None
        # Set by --profile: admission (run_start in this process) under cProfile, CPU time.
        self.admission_profiler: cProfile.Profile | None = None
        self.dbos_count = 0

    def command(self, profile_dir: Path | None, *argv: str) -> list[str]:
        return [PYTHON, PROFILED, *argv] if profile_dir else [PYTHON, MANAGE, *argv]

    def start_sweeper(self, profile_dir: Path | None = None) -> Group:
        extra = {PROFILE_DIR_ENV: str(profile_dir)} if profile_dir else {}
        sweeper = self.supervisor._start(
            f"sweeper{len(self.supervisor.groups)}",
            "sweeper",
            self.command(profile_dir, "sweep", "--loop"),
            extra,
        )
        return sweeper

    def start_clusters(self, clusters: int, workers: int, profile_dir: Path | None) -> list[Group]:
        extra = {PROFILE_DIR_ENV: str(profile_dir)} if profile_dir else {}
        groups = [
            self.supervisor.start_cluster(
                workers, extra_env=extra, command=self.command(profile_dir, "worker")
            )
            for _ in range(clusters)
        ]
        for group in groups:
            self.supervisor.wait_ready(group)
        return groups

    def start_runs(
        self, count: int, first: int, profiler: cProfile.Profile | None = None
    ) -> tuple[list[str], float]:
        """Start ``count`` runs through admission; returns their ids and this process's CPU."""
        from django.db import connection

        from agentruns.services import run_start

        ids = []
        cpu = 0.0
        for n in range(first, first + count):
            before = time.process_time()
            if profiler is not None:
                profiler.enable()
            run, _ = run_start(
                tenant=self.tenant,
                agent_name=AGENT_NAME,
                input={"steps": self.args.steps, "n": n},
                requested_by="benchmark",
            )
            if profiler is not None:
                profiler.disable()
            cpu += time.process_time() - before
            ids.append(str(run.id))
            # django-q2's enqueue closes connections older than CONN_MAX_AGE: this
            # process's backend may be a new one now.
            if connection.connection is not None:
                self.sampler.excluded.add(connection.connection.info.backend_pid)
        return ids, cpu

    def wait_finished(self, ids: list[str], timeout: float) -> None:
        from agentruns.models import Run

        deadline = time.monotonic() + timeout
        while True:
            left = Run.objects.filter(pk__in=ids, finished_at__isnull=True).count()
            if not left:
                return
            if time.monotonic() > deadline:
                raise BenchmarkError(f"{left} run(s) not finished after {timeout:.0f}s")
            time.sleep(0.05)

    def check_outputs(self, ids: list[str]) -> None:
        from agentruns.models import Run, RunStatus

        wrong = Run.objects.filter(pk__in=ids).exclude(status=RunStatus.COMPLETED).count()
        steps = Run.objects.filter(pk__in=ids).values_list("steps_used", flat=True)
        if wrong or any(used != self.args.steps for used in steps):
            raise BenchmarkError(f"{wrong} run(s) did not succeed with {self.args.steps} steps")

    def window(self, ids: list[str]) -> tuple[float, list[float]]:
        """(seconds from the first enqueue to the last end, each run's queue latency)."""
        from django.db.models import Max, Min

        from agentruns.models import Run, RunEvent

        span = Run.objects.filter(pk__in=ids).aggregate(
            start=Min("enqueued_at"), end=Max("finished_at")
        )
        claimed = dict(
            RunEvent.objects.filter(run_id__in=ids, type="claimed")
            .values("run_id")
            .annotate(first=Min("created_at"))
            .values_list("run_id", "first")
        )
        latencies = [
            (claimed[run_id] - enqueued).total_seconds()
            for run_id, enqueued in Run.objects.filter(pk__in=ids).values_list("id", "enqueued_at")
        ]
        return (span["end"] - span["start"]).total_seconds(), latencies

    def measure(self, clusters: int, workers: int, profile_dir: Path | None = None) -> Measurement:
        empty_run_tables()
        groups = self.start_clusters(clusters, workers, profile_dir)
        assert self.sweeper is not None
        runs, steps = self.args.runs, self.args.runs * self.args.steps
        cpu_before = {g.pgid: group_cpu(g.pgid) for g in [*groups, self.sweeper]}
        commits_before = commits(self.setup.database)
        self.sampler.start()
        ids, admission_cpu = self.start_runs(runs, 0, self.admission_profiler)
        self.wait_finished(ids, timeout=max(60.0, runs * self.args.steps / 20))
        db_cpu, admission_db_cpu = self.sampler.stop()
        cpu_after = {g.pgid: group_cpu(g.pgid) for g in [*groups, self.sweeper]}
        commits_after = commits(self.setup.database)
        worker_cpu = sum(cpu_after[g.pgid] - cpu_before[g.pgid] for g in groups)
        sweeper_cpu = cpu_after[self.sweeper.pgid] - cpu_before[self.sweeper.pgid]
        self.check_outputs(ids)
        seconds, burst_latency = self.window(ids)
        half_latency = self.half_load(steps / seconds, runs)
        low_latency: list[float] = []
        first = runs + len(half_latency)
        for n in range(self.args.latency_runs):
            one, _ = self.start_runs(1, first + n)
            self.wait_finished(one, timeout=30.0)
            low_latency.extend(self.window(one)[1])
        if profile_dir is not None:
            self.dump_profiles(groups, profile_dir)
        for group in groups:
            self.supervisor.kill(group)
        return Measurement(
            config=f"{clusters}x{workers}",
            steps_per_second=steps / seconds,
            worker_cpu_ms=worker_cpu / steps * 1000,
            db_cpu_ms=db_cpu.get(self.setup.database, 0.0) / steps * 1000,
            sweeper_cpu_ms=sweeper_cpu / steps * 1000,
            # This process's own commits (admission: one per run) are in the count too.
            commits_per_step=(commits_after - commits_before) / steps,
            burst_latency=burst_latency,
            half_latency=half_latency,
            low_latency=low_latency,
            admission_cpu_ms=admission_cpu / runs * 1000,
            admission_db_cpu_ms=admission_db_cpu / runs * 1000,
        )

    def half_load(self, steps_per_second: float, first: int) -> list[float]:
        """Queue latencies of runs started at half the rate the burst sustained, evenly
        spaced, for ``--paced-seconds``: the queue at half of saturation."""
        if self.args.paced_seconds <= 0:
            return []
        rate = steps_per_second / self.args.steps / 2  # runs per second
        count = max(1, round(rate * self.args.paced_seconds))
        ids: list[str] = []
        began = time.monotonic()
        for n in range(count):
            delay = began + n / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            started, _ = self.start_runs(1, first + n)
            ids += started
        self.wait_finished(ids, timeout=max(60.0, self.args.paced_seconds * 4))
        return self.window(ids)[1]

    def dump_profiles(self, groups: list[Group], profile_dir: Path) -> None:
        assert self.sweeper is not None
        expected = 0
        for group in [*groups, self.sweeper]:
            members = [pid for pid in group_pids(group.pgid)]
            expected += len(members)
            os.killpg(group.pgid, signal.SIGUSR1)
        deadline = time.monotonic() + 15.0
        while len(list(profile_dir.glob("*.json"))) < expected:
            if time.monotonic() > deadline:
                progress("WARNING: not every process wrote its profile")
                break
            time.sleep(0.1)
        time.sleep(0.5)

    def pgbench(self, clients: int) -> tuple[float, float]:
        """pgbench's single-row UPDATE rate with ``clients`` clients, and its backends' CPU
        per transaction in seconds."""
        parts = urlsplit(self.setup.url)
        conn_args = ["-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432)]
        if parts.username:
            conn_args += ["-U", parts.username]
        env = {**os.environ}
        if parts.password:
            env["PGPASSWORD"] = parts.password
        script = self.setup.workdir / "single_row_update.sql"
        script.write_text(PGBENCH_SCRIPT)
        sampler = BackendSampler(self.setup.postmaster, {self.setup.pgbench_database}, 0.1)
        sampler.start()
        done = subprocess.run(
            [
                PGBENCH,
                *conn_args,
                "-n",
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-T",
                str(self.args.pgbench_seconds),
                "-f",
                str(script),
                self.setup.pgbench_database,
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        cpu, _ = sampler.stop()
        if done.returncode != 0:
            raise BenchmarkError(f"pgbench failed: {done.stderr.strip()}")
        match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
        processed = re.search(r"number of transactions actually processed: (\d+)", done.stdout)
        if not match or not processed:
            raise BenchmarkError(f"cannot read pgbench's output: {done.stdout}")
        tps = float(match[1])
        per_tx = cpu.get(self.setup.pgbench_database, 0.0) / max(1, int(processed[1]))
        return tps, per_tx

    def pgbench_init(self) -> None:
        parts = urlsplit(self.setup.url)
        argv = [PGBENCH, "-i", "-q", "-s", "1", "-h", parts.hostname or "127.0.0.1"]
        argv += ["-p", str(parts.port or 5432)]
        if parts.username:
            argv += ["-U", parts.username]
        env = {**os.environ}
        if parts.password:
            env["PGPASSWORD"] = parts.password
        done = subprocess.run(
            [*argv, self.setup.pgbench_database], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise BenchmarkError(f"pgbench -i failed: {done.stderr.strip()}")

    def dbos(self, concurrency: int) -> DbosMeasurement:
        """DBOS on the same burst at ``concurrency``, its database's backends sampled by the
        same sampler over exactly the burst (the script waits for a line on stdin before
        it and after it)."""
        args = self.args
        steps = args.runs * args.steps
        # DBOS ran ~200 steps/s here: a tenth of that is a hang, not a slow machine.
        timeout = max(120.0, steps / 20)
        parts = urlsplit(self.setup.url)
        url = urlunsplit(parts._replace(path=f"/{self.setup.dbos_database}"))
        argv = [args.dbos_python, DBOS_SCRIPT, "--handshake", "--database-url", url]
        argv += ["--concurrency", str(concurrency), "--processes", str(args.dbos_processes)]
        argv += ["--runs", str(args.runs), "--steps", str(args.steps)]
        argv += ["--poll", str(args.dbos_poll), "--timeout", str(timeout)]
        # Holdfast's settings mean nothing to it; DBOS reads DBOS__* variables of its own.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "HOLDFAST_"))}
        self.dbos_count += 1
        log_path = self.setup.workdir / "logs" / f"dbos-{self.dbos_count}-c{concurrency}.log"
        sampler = BackendSampler(self.setup.postmaster, {self.setup.dbos_database})
        deadline = time.monotonic() + timeout + 60
        with log_path.open("wb") as log:
            # Its own session: on failure the script and its executor processes go at once.
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        assert proc.stdin is not None and proc.stdout is not None
        out = LineReader(proc.stdout.fileno(), BenchmarkError)
        try:
            try:
                out.readline(deadline, "DBOS's executors to start")
                sampler.start()
                proc.stdin.write(b"go\n")
                proc.stdin.flush()
                done = json.loads(out.readline(deadline, "DBOS's workflows to end"))
                sampler.excluded.update(done["excluded_backends"])
                db_cpu, enqueue_db_cpu = sampler.stop()
                proc.stdin.write(b"stop\n")
                proc.stdin.flush()
                result = json.loads(out.readline(deadline, "DBOS's result"))
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except (BenchmarkError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
                sampler.stop()
                raise BenchmarkError(f"DBOS: {exc}; {_tail(log_path)}") from exc
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc.returncode != 0:
            raise BenchmarkError(f"DBOS exited {proc.returncode}: {_tail(log_path)}")
        return DbosMeasurement(
            concurrency=concurrency,
            version=result["dbos_version"],
            processes=result["processes"],
            polling_interval_sec=result["polling_interval_sec"],
            steps_per_second=result["steps_per_second"],
            worker_cpu_ms=result["worker_cpu_seconds_per_step"] * 1000,
            db_cpu_ms=db_cpu.get(self.setup.dbos_database, 0.0) / steps * 1000,
            commits_per_step=result["commits_per_step"],
            burst_latency=[x / 1000 for x in result["queue_latencies_ms"]],
            enqueue_cpu_ms=result["enqueue_cpu_seconds_per_run"] * 1000,
            enqueue_db_cpu_ms=enqueue_db_cpu / args.runs * 1000,
        )


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").strip().splitlines()
    return "its log ends:\n" + "\n".join(text[-lines:]) if text else "its log is empty"


def group_pids(pgid: int) -> list[int]:
    from benchmarks.recovery import group_members

    return group_members(pgid)


# --- report -------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(
    setup: Setup,
    args: argparse.Namespace,
    results: dict[str, list[Measurement]],
    dbos: dict[int, list[DbosMeasurement]] | None = None,
) -> str:
    out = io.StringIO()
    w = out.write
    w(f"Throughput: {args.runs} runs x {args.steps} no-op read-only steps, ")
    w(f"{args.repeat} repetition(s), medians; {setup.description}\n")
    w(f"CPUs: {os.cpu_count()}; load average at the end: ")
    w(", ".join(f"{x:.2f}" for x in os.getloadavg()))
    w(" (the machine may be shared: rely on the ratios to pgbench, measured in the same run)\n\n")
    header = (
        "| configuration | steps/s | worker CPU/step | DB CPU/step | sweeper CPU/step "
        "| commits/step | queue p50/p95 (burst) | queue p50/p95 (half load) "
        "| queue p50/p95 (low load) "
        "| admission CPU/run (+DB) | pgbench tx/s (DB CPU/tx) | ÷ pgbench |"
    )
    rule = "| --- " * 12 + "|"
    if dbos:
        header += " ÷ DBOS |"
        rule += " --- |"
    w(f"{header}\n{rule}\n")
    for config, ms in results.items():
        burst = [x for m in ms for x in m.burst_latency]
        half = [x for m in ms for x in m.half_latency]
        low = [x for m in ms for x in m.low_latency]
        ratios = [m.steps_per_second / m.pgbench_tps for m in ms if m.pgbench_tps]
        w(
            f"| {config} | {median([m.steps_per_second for m in ms]):,.0f} "
            f"| {median([m.worker_cpu_ms for m in ms]):.2f} ms "
            f"| {median([m.db_cpu_ms for m in ms]):.2f} ms "
            f"| {median([m.sweeper_cpu_ms for m in ms]):.3f} ms "
            f"| {median([m.commits_per_step for m in ms]):.2f} "
            f"| {_latency(burst)} | {_latency(half)} | {_latency(low)} "
            f"| {median([m.admission_cpu_ms for m in ms]):.2f} ms "
            f"(+{median([m.admission_db_cpu_ms for m in ms]):.2f} ms) "
            f"| {median([m.pgbench_tps for m in ms]):,.0f} "
            f"({median([m.pgbench_db_cpu_ms for m in ms]):.3f} ms) "
            f"| {median(ratios):.3f} |"
        )
        if dbos:
            dbos_ratios = [_dbos_ratio(m) for m in ms if m.dbos_steps_per_second]
            w(f" {median(dbos_ratios):.2f}x |")
        w("\n")
    for concurrency, ds in (dbos or {}).items():
        ratios = [d.steps_per_second / d.pgbench_tps for d in ds if d.pgbench_tps]
        w(
            f"| DBOS, concurrency {concurrency} | {median([d.steps_per_second for d in ds]):,.0f} "
            f"| {median([d.worker_cpu_ms for d in ds]):.2f} ms "
            f"| {median([d.db_cpu_ms for d in ds]):.2f} ms | n/a "
            f"| {median([d.commits_per_step for d in ds]):.2f} "
            f"| {_latency([x for d in ds for x in d.burst_latency])} | n/a | n/a "
            f"| {median([d.enqueue_cpu_ms for d in ds]):.2f} ms "
            f"(+{median([d.enqueue_db_cpu_ms for d in ds]):.2f} ms) "
            f"| {median([d.pgbench_tps for d in ds]):,.0f} "
            f"({median([d.pgbench_db_cpu_ms for d in ds]):.3f} ms) "
            f"| {median(ratios):.3f} | — |\n"
        )
    w("\nPer repetition (steps/s ÷ pgbench tx/s at the same concurrency):\n")
    for config, ms in results.items():
        w(f"  {config}: ")
        w(
            ", ".join(
                f"{m.steps_per_second:,.0f}/{m.pgbench_tps:,.0f} = "
                f"{m.steps_per_second / m.pgbench_tps:.3f}"
                for m in ms
                if m.pgbench_tps
            )
        )
        w("\n")
    if dbos:
        w("\nPer repetition (Holdfast steps/s ÷ DBOS steps/s at the same concurrency):\n")
        for config, ms in results.items():
            w(f"  {config}: ")
            w(
                ", ".join(
                    f"{m.steps_per_second:,.0f}/{m.dbos_steps_per_second:,.0f} = "
                    f"{_dbos_ratio(m):.2f}"
                    for m in ms
                    if m.dbos_steps_per_second
                )
            )
            w("\n")
    w(
        f"\nTargets: ≥ {TARGET_RATIO} of pgbench, worker CPU ≤ {TARGET_WORKER_CPU_MS} "
        f"ms per step, admission ≤ {TARGET_ADMISSION_MS} ms per run, queue p95 at half load "
        f"< {TARGET_HALF_LOAD_P95_MS} ms"
        + (f", ≥ {TARGET_DBOS_RATIO:g}x DBOS's steps/s.\n" if dbos else ".\n")
        + "Worker CPU: every process of the clusters (workers, monitor, pusher, sentinel). DB CPU: "
        "the backends of the benchmark database, this process's excluded (admission's +DB).\n"
        "Commits: xact_commit of the database, admission's own commit per run included.\n"
    )
    if dbos:
        first = next(iter(dbos.values()))[0]
        w(
            f"DBOS: DBOS Transact {first.version} (benchmarks/dbos_queue.py, "
            f"{args.dbos_python}), its system database {setup.dbos_database}, emptied "
            "before each measurement: one workflow per run, of "
            f"{args.steps} @DBOS.step() no-op steps, all enqueued at once by a DBOSClient on "
            "a queue registered with worker_concurrency = the concurrency ÷ "
            f"{first.processes} executor process(es), polling_interval_sec="
            f"{first.polling_interval_sec:g}; steps/s from the first workflow's created_at to "
            "the last one's completed_at. Worker CPU: the executor process(es). DB CPU: the "
            "backends of its database, the client's and the end poller's apart (its +DB). "
            "Commits: xact_commit, the enqueues' included, the end poller's not. Queue "
            "latency: created_at to started_at_epoch_ms. Admission CPU/run: the DBOSClient's "
            "enqueue. ÷ DBOS: median of the per-repetition ratios.\n"
        )
    else:
        w(
            "DBOS was not measured: pass --dbos-python PATH, the Python of a virtualenv "
            "with dbos==3.4.0 (python3 -m venv /tmp/dbos-venv && /tmp/dbos-venv/bin/pip "
            "install dbos==3.4.0; see benchmarks/dbos_queue.py), to measure it in the same "
            "run.\n"
        )
    return out.getvalue()


def _dbos_ratio(m: Measurement) -> float:
    return m.steps_per_second / m.dbos_steps_per_second


def _latency(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"{percentile(values, 50) * 1000:.0f}/{percentile(values, 95) * 1000:.0f} ms"


def profile_report(profile_dir: Path, runs: int, top: int) -> str:
    out = io.StringIO()
    w = out.write
    by_role: dict[str, Counter[str]] = {}
    processes: Counter[str] = Counter()
    for path in sorted(profile_dir.glob("*.json")):
        data = json.loads(path.read_text())
        by_role.setdefault(data["role"], Counter()).update(data["statements"])
        processes[data["role"]] += 1
    w(f"\nSQL statements per run, by kind of process ({runs} runs; counted at psycopg):\n")
    for role, counts in sorted(by_role.items()):
        total = sum(counts.values())
        w(f"  {role} ({processes[role]} process(es)): {total / runs:.1f} per run\n")
        for shape, n in counts.most_common(14):
            w(f"    {n / runs:7.2f}  {shape}\n")
    worker_profiles = [str(p) for p in profile_dir.glob("worker-*.prof")]
    if worker_profiles:
        stats = pstats.Stats(*worker_profiles, stream=out)
        total = stats.total_tt  # type: ignore[attr-defined]
        w(f"\nWorker processes' profile: {total / runs * 1000:.2f} ms of profiled time per run\n")
        stats.sort_stats("cumulative").print_stats(top)
        stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


# --- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--configs",
        type=lambda text: [parse_config(part) for part in text.split(",")],
        default=[(1, 2), (2, 2), (1, 4)],
        help="worker clusters x workers per cluster, comma-separated (default 1x2,2x2,1x4)",
    )
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-runs", type=int, default=10)
    parser.add_argument(
        "--paced-seconds",
        type=float,
        default=10.0,
        help="how long runs are started at half the burst's rate (0: not measured)",
    )
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile the first configuration once instead of measuring them all",
    )
    parser.add_argument("--top", type=int, default=30, help="profile lines to print")
    parser.add_argument(
        "--dbos-python",
        metavar="PATH",
        help="the Python of a virtualenv with dbos==3.4.0: also measure DBOS Transact on the "
        "same workload at each configuration's concurrency (benchmarks/dbos_queue.py)",
    )
    parser.add_argument(
        "--dbos-poll",
        type=float,
        default=0.1,
        help="the DBOS queue's polling_interval_sec (default 0.1)",
    )
    parser.add_argument(
        "--dbos-processes",
        type=int,
        default=1,
        help="DBOS executor processes sharing each concurrency (default 1)",
    )
    args = parser.parse_args(argv)
    if args.dbos_python:
        for clusters, workers in args.configs:
            if (clusters * workers) % args.dbos_processes:
                parser.error(
                    f"--dbos-processes {args.dbos_processes} does not divide the concurrency "
                    f"{clusters * workers} of {clusters}x{workers}"
                )
    if not Path(PGBENCH).exists():
        progress(f"{PGBENCH} is missing: no ceiling is measured")
    setup: Setup | None = None
    try:
        if args.dbos_python and not args.profile:
            progress(f"DBOS {dbos_check(args.dbos_python)} in {args.dbos_python}")
        setup = prepare(args)
        bench = Bench(setup, args)
        if Path(PGBENCH).exists():
            bench.pgbench_init()
        if args.profile:
            return profile(bench, setup, args)
        bench.sweeper = bench.start_sweeper()
        results: dict[str, list[Measurement]] = {f"{k}x{w}": [] for k, w in args.configs}
        ceilings: dict[tuple[int, int], tuple[float, float]] = {}
        # DBOS at each concurrency, once per repetition, as the ceilings are.
        dbos: dict[int, list[DbosMeasurement]] = {}
        dbos_runs: dict[tuple[int, int], DbosMeasurement] = {}
        for rep in range(args.repeat):
            for clusters, workers in args.configs:
                progress(f"repetition {rep + 1}: {clusters} cluster(s) x {workers} worker(s)")
                m = bench.measure(clusters, workers)
                concurrency = clusters * workers
                if Path(PGBENCH).exists() and (rep, concurrency) not in ceilings:
                    progress(f"repetition {rep + 1}: pgbench -c {concurrency}")
                    ceilings[(rep, concurrency)] = bench.pgbench(concurrency)
                m.pgbench_tps, per_tx = ceilings.get((rep, concurrency), (0.0, 0.0))
                m.pgbench_db_cpu_ms = per_tx * 1000
                if args.dbos_python and (rep, concurrency) not in dbos_runs:
                    progress(f"repetition {rep + 1}: DBOS, concurrency {concurrency}")
                    d = bench.dbos(concurrency)
                    d.pgbench_tps, d.pgbench_db_cpu_ms = m.pgbench_tps, m.pgbench_db_cpu_ms
                    dbos_runs[(rep, concurrency)] = d
                    dbos.setdefault(concurrency, []).append(d)
                    progress(
                        f"  DBOS {d.steps_per_second:,.0f} steps/s, worker CPU "
                        f"{d.worker_cpu_ms:.2f} ms/step, DB CPU {d.db_cpu_ms:.2f} ms/step"
                    )
                if (rep, concurrency) in dbos_runs:
                    m.dbos_steps_per_second = dbos_runs[(rep, concurrency)].steps_per_second
                progress(
                    f"  {m.steps_per_second:,.0f} steps/s, worker CPU {m.worker_cpu_ms:.2f} ms/step"
                    f", DB CPU {m.db_cpu_ms:.2f} ms/step, pgbench {m.pgbench_tps:,.0f} tx/s"
                    + (f", ÷ DBOS {_dbos_ratio(m):.2f}" if m.dbos_steps_per_second else "")
                )
                results[m.config].append(m)
        print(report(setup, args, results, dbos))
    except BenchmarkError as exc:
        progress(f"error: {exc}")
        return 1
    finally:
        # Only the directory this run made: never a path taken from the environment,
        # which may be unset (its parent was then "/") or name the caller's own.
        if setup is not None:
            shutil.rmtree(setup.workdir, ignore_errors=True)
    return 0


def profile(bench: Bench, setup: Setup, args: argparse.Namespace) -> int:
    clusters, workers = args.configs[0]
    profile_dir = setup.workdir / "profile"
    profile_dir.mkdir()
    bench.sweeper = bench.start_sweeper(profile_dir)
    progress(f"profiling {clusters} cluster(s) x {workers} worker(s), {args.runs} runs")
    args.latency_runs = 0
    args.paced_seconds = 0
    bench.admission_profiler = cProfile.Profile(time.process_time)
    m = bench.measure(clusters, workers, profile_dir=profile_dir)
    print(
        f"Profiled: {args.runs} runs x {args.steps} steps on {clusters}x{workers}; "
        f"{m.steps_per_second:,.0f} steps/s and {m.worker_cpu_ms:.2f} ms worker CPU per step "
        "under the profiler (slower than unprofiled); the machine may be shared."
    )
    print(profile_report(profile_dir, args.runs, args.top))
    out = io.StringIO()
    stats = pstats.Stats(bench.admission_profiler, stream=out)
    total = stats.total_tt  # type: ignore[attr-defined]
    out.write(f"Admission (run_start in-process): {total / args.runs * 1000:.2f} ms CPU per run\n")
    stats.sort_stats("cumulative").print_stats(args.top)
    print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
