"""Recovery after a killed worker cluster, and worker memory over many runs.

Run from the project root::

    .venv/bin/python benchmarks/recovery.py [--trials 50] [--memory-runs 2000]

Everything runs against a database of its own: a temporary SQLite file by
default, or, when ``DATABASE_URL`` is set, a PostgreSQL database named
``holdfast_recovery`` on that server (dropped and created fresh). Lease and
sweep settings are the defaults: ``HOLDFAST_*`` variables in the environment
are ignored, because the target is "with the default settings".

Recovery: two real worker clusters (``manage.py qcluster``, each in its own
process group) and one ``manage.py sweep --loop``. Each trial starts a run of
slow read-only steps (``benchmarks/recovery_agents.py``), waits until a cluster
holds its lease, waits 0.2-2.0 s, SIGKILLs that cluster's whole process group,
and measures the time from the kill to the start of the run's next step body
on the surviving cluster. Step bodies note every execution in a ledger the
engine never writes; the duplicate counts come from that ledger. A replacement
cluster is started once the run has moved on, so the next trial again has two.

Memory: one cluster with one worker that is never recycled runs many small
runs; the worker's VmRSS is read halfway and at the end.

Progress goes to stderr, results to stdout. Every process group the benchmark
starts is killed on exit, including on Ctrl-C and on errors.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import math
import os
import random
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PYTHON = sys.executable
MANAGE = str(ROOT / "manage.py")
AGENT_MODULE = "benchmarks.recovery_agents"
# Mirrors of benchmarks.recovery_agents, which can only be imported once Django is set up.
LEDGER_ENV = "HOLDFAST_BENCH_LEDGER"
CLUSTER_ENV = "HOLDFAST_BENCH_CLUSTER"
PG_DATABASE = "holdfast_recovery"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}

RECOVERY_TARGET_SECONDS = 5.0
MEMORY_LIMIT_MB = 200.0
MEMORY_GROWTH_LIMIT = 0.05

T0 = time.monotonic()
SESSION = f"{os.getpid()}-{int(time.time())}"


def progress(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", file=sys.stderr, flush=True)


class BenchmarkError(Exception):
    pass


# --- processes ---------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgid) of a process, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
        if stat is not None and stat[2] == pgid and stat[0] != "Z":
            members.append(int(entry.name))
    return members


def alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


WORKER_READY = re.compile(r"ready for work at (\d+)")
CLUSTER_RUNNING = re.compile(r"Q Cluster .+ running\.")


@dataclass
class Group:
    """One process group the benchmark started: a worker cluster or the sweeper."""

    label: str
    kind: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    workers: int = 0
    gone: bool = False

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def worker_pids(self) -> list[int]:
        """The django-q worker processes of this cluster that are alive now."""
        pids = [int(p) for p in WORKER_READY.findall(self.log_text())]
        return [p for p in dict.fromkeys(pids) if alive(p) and os.getpgid(p) == self.pgid]

    def ready(self) -> bool:
        return bool(CLUSTER_RUNNING.search(self.log_text())) and (
            len(self.worker_pids()) >= self.workers
        )


class Supervisor:
    """Starts process groups and makes sure every one of them is killed in the end."""

    def __init__(self, log_dir: Path, env: dict[str, str]):
        self.log_dir = log_dir
        self.env = env
        self.groups: list[Group] = []
        self.counter = 0

    def _start(self, label: str, kind: str, argv: list[str], extra_env: dict[str, str]) -> Group:
        log_path = self.log_dir / f"{label}.log"
        log_file = log_path.open("ab")
        env = {**self.env, **extra_env}
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        group = Group(label, kind, proc, log_path, log_file)
        self.groups.append(group)
        return group

    def start_cluster(
        self,
        workers: int,
        extra_env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> Group:
        """A cluster of ``workers`` workers: ``manage.py qcluster`` unless ``command`` is given."""
        self.counter += 1
        label = f"c{self.counter}"
        env = {
            "HOLDFAST_WORKERS": str(workers),
            CLUSTER_ENV: label,
            **(extra_env or {}),
        }
        group = self._start(label, "cluster", command or [PYTHON, MANAGE, "qcluster"], env)
        group.workers = workers
        progress(f"started cluster {label} (pgid {group.pgid}, {workers} worker(s))")
        return group

    def start_sweeper(self) -> Group:
        group = self._start("sweeper", "sweeper", [PYTHON, MANAGE, "sweep", "--loop"], {})
        progress(f"started sweeper (pgid {group.pgid})")
        return group

    def wait_ready(self, group: Group, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not group.ready():
            if group.proc.poll() is not None:
                raise BenchmarkError(
                    f"{group.label} exited with {group.proc.returncode}; see {group.log_path}"
                )
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    f"{group.label} not ready after {timeout}s; see {group.log_path}"
                )
            time.sleep(0.05)

    def kill(self, group: Group) -> None:
        """SIGKILL the whole group and wait until none of its processes is left."""
        if group.gone:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group.pgid, signal.SIGKILL)
        self._reap(group)

    def _reap(self, group: Group, timeout: float = 10.0) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            group.proc.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while group_members(group.pgid):
            if time.monotonic() > deadline:
                progress(f"WARNING: processes of {group.label} survive SIGKILL of the group")
                break
            time.sleep(0.02)
        group.gone = True
        with contextlib.suppress(OSError):
            group.log_file.close()

    def cleanup(self) -> None:
        for group in self.groups:
            if group.gone:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group.pgid, signal.SIGKILL)
        for group in self.groups:
            if not group.gone:
                self._reap(group, timeout=5.0)

    def cluster_of_pid(self, pid: int) -> Group | None:
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return None
        for group in self.groups:
            if group.kind == "cluster" and not group.gone and group.pgid == pgid:
                return group
        return None


# --- environment and database ------------------------------------------------------------


@dataclass
class Setup:
    backend: str
    workdir: Path
    ledger: Path
    env: dict[str, str]
    description: str


def measure_defaults() -> None:
    """Drop Holdfast's settings from the environment: the defaults are what is measured."""
    ignored = sorted(k for k in os.environ if k.startswith("HOLDFAST_") or k == "REDIS_URL")
    for name in ignored:
        os.environ.pop(name)
    if ignored:
        progress(f"ignoring {', '.join(ignored)} from the environment: defaults are measured")


def prepare(args: argparse.Namespace) -> Setup:
    """Point this process (and every child) at a fresh database of its own, then migrate."""
    workdir = Path(tempfile.mkdtemp(prefix="holdfast-recovery-"))
    (workdir / "logs").mkdir()
    (workdir / "var").mkdir()
    measure_defaults()
    ledger = workdir / "ledger.sqlite3"
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "HOLDFAST_AGENT_MODULES": AGENT_MODULE,
            "HOLDFAST_VAR_DIR": str(workdir / "var"),
            # Settings read a key and write nothing; the var dir is this run's own.
            "DJANGO_SECRET_KEY": "benchmark-only-not-secret",
            LEDGER_ENV: str(ledger),
            "PYTHONUNBUFFERED": "1",
        }
    )
    url = os.environ.get("DATABASE_URL", "")
    if url:
        url = create_pg_database(url, args.pg_database)
        os.environ["DATABASE_URL"] = url
        backend = "postgresql"
        parts = urlsplit(url)
        description = f"PostgreSQL {parts.hostname}:{parts.port or 5432}/{args.pg_database}"
    else:
        os.environ.pop("DATABASE_URL", None)
        os.environ["HOLDFAST_SQLITE_PATH"] = str(workdir / "holdfast.sqlite3")
        backend = "sqlite"
        description = f"SQLite {workdir / 'holdfast.sqlite3'}"

    import django

    django.setup()
    # This process only enqueues; django-q2 logs every enqueue at INFO.
    logging.getLogger("django-q").setLevel(logging.WARNING)
    from django.core.management import call_command

    from benchmarks import recovery_agents

    assert (recovery_agents.LEDGER_ENV, recovery_agents.CLUSTER_ENV) == (LEDGER_ENV, CLUSTER_ENV)
    recovery_agents.init_ledger(ledger)
    call_command("migrate", interactive=False, verbosity=0)
    if backend == "sqlite":
        call_command("migrate", database="queue", interactive=False, verbosity=0)
    progress(f"database ready: {description}")
    return Setup(backend, workdir, ledger, dict(os.environ), description)


def create_pg_database(url: str, name: str) -> str:
    """Drop and create ``name`` on the server of ``url``; return the URL that names it."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    if parts.hostname not in LOCAL_HOSTS:
        raise BenchmarkError(f"refusing a non-local database server: {parts.hostname}")
    given = parts.path.lstrip("/")
    if given and given != name:
        progress(f"DATABASE_URL names {given!r}; the benchmark uses its own database {name!r}")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return urlunsplit(parts._replace(path=f"/{name}"))


# --- statistics ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (
        f"median {statistics.median(values):.2f} s, p95 {percentile(values, 95):.2f} s, "
        f"max {max(values):.2f} s"
    )


def wait_for(
    condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.01
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# --- recovery trials ------------------------------------------------------------------------


@dataclass
class Execution:
    seq: int
    cluster: str
    pid: int
    start_mono: float
    start_wall: float
    end_mono: float | None


@dataclass
class Trial:
    index: int
    run_id: str
    killed: str = ""
    killed_pid: int = 0
    delay: float = 0.0
    kill_mono: float = 0.0
    kill_wall: float = 0.0
    recovered_on: str = ""
    recovery: float | None = None
    final_status: str = ""
    output_ok: bool = False
    skipped: str = ""
    # Filled by analyse():
    executed_by_killed: bool = False
    steps_done_at_kill: int = 0
    mid_body: bool = False
    duplicates: list[int] = field(default_factory=list)
    interrupted_reruns: list[int] = field(default_factory=list)
    unrecorded_reruns: list[int] = field(default_factory=list)
    overlaps: int = 0
    missing_steps: list[int] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def ledger_connect(path: Path) -> sqlite3.Connection:
    from benchmarks.recovery_agents import ledger_connect as connect

    return connect(path)


def ledger_executions(ledger: Path, run_id: str) -> list[Execution]:
    conn = ledger_connect(ledger)
    try:
        rows = conn.execute(
            "SELECT seq, cluster, pid, start_mono, start_wall, end_mono FROM execution "
            "WHERE run_id = ? ORDER BY start_mono",
            (run_id,),
        ).fetchall()
    finally:
        conn.close()
    return [Execution(*row) for row in rows]


def first_execution_after(
    ledger: Path, run_id: str, after_mono: float, not_cluster: str
) -> Execution | None:
    conn = ledger_connect(ledger)
    try:
        row = conn.execute(
            "SELECT seq, cluster, pid, start_mono, start_wall, end_mono FROM execution "
            "WHERE run_id = ? AND start_mono > ? AND cluster != ? ORDER BY start_mono LIMIT 1",
            (run_id, after_mono, not_cluster),
        ).fetchone()
    finally:
        conn.close()
    return Execution(*row) if row else None


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


# run_start calls that raised after the run was committed (its wake-up failed).
ENQUEUE_FAILURES: list[str] = []


def start_run(agent_name: str, input: dict[str, Any], request_id: str) -> str:
    """Start a run the way a caller would; survive a failed wake-up after the commit.

    ``run_start`` enqueues after its insert commits. On SQLite that enqueue can
    fail with "database is locked" (the queue database is busy); the run exists
    and the sweeper re-enqueues it, so the benchmark notes it and goes on.
    """
    from django.db import OperationalError

    from agentruns.models import Run
    from agentruns.services import run_start, tenant_by_slug

    try:
        run, _ = run_start(
            tenant=tenant_by_slug(None),
            agent_name=agent_name,
            input=input,
            request_id=request_id,
            requested_by="benchmark",
        )
        return str(run.id)
    except OperationalError as exc:
        existing = Run.objects.filter(request_id=request_id).values_list("id", flat=True).first()
        if existing is None:
            raise
        ENQUEUE_FAILURES.append(f"{agent_name} run {existing}: {exc}")
        progress(f"run_start raised {type(exc).__name__}: {exc} (run {existing} was committed)")
        return str(existing)


def run_trial(
    index: int,
    sup: Supervisor,
    clusters: list[Group],
    setup: Setup,
    args: argparse.Namespace,
    rng: random.Random,
) -> Trial:
    from agentruns.models import TERMINAL_STATUSES, Run

    run_id = start_run(
        "slow_steps",
        {"steps": args.steps, "sleep": args.step_sleep, "trial": index},
        f"recovery-{SESSION}-{index}",
    )
    run = Run.objects.get(pk=run_id)
    trial = Trial(index, run_id)

    def claimed() -> tuple[str, str] | None:
        row = Run.objects.filter(pk=run.id).values_list("status", "lease_owner").first()
        return row if row and row[1] else None

    _status, owner = wait_for(claimed, 30.0, f"run {run.id} to be claimed")
    owner_pid = int(owner.split(":")[-2])
    victim = sup.cluster_of_pid(owner_pid)
    if victim is None or victim not in clusters:
        raise BenchmarkError(f"run {run.id} is held by pid {owner_pid}, not by a live cluster")
    trial.delay = rng.uniform(0.2, 2.0)
    time.sleep(trial.delay)
    row = Run.objects.filter(pk=run.id).values_list("status", "lease_owner").first()
    if row is None or row[0] != "running" or row[1] != owner:
        trial.skipped = f"run no longer held by {victim.label} at kill time ({row})"
    else:
        os.killpg(victim.pgid, signal.SIGKILL)
        trial.kill_mono = time.monotonic()
        trial.kill_wall = time.time()
        trial.killed = victim.label
        trial.killed_pid = owner_pid
        sup.kill(victim)  # reap and make sure the whole group is gone
        clusters.remove(victim)
        found = None
        deadline = time.monotonic() + args.recovery_timeout
        while found is None and time.monotonic() < deadline:
            found = first_execution_after(setup.ledger, trial.run_id, trial.kill_mono, victim.label)
            if found is None:
                time.sleep(0.01)
        if found is not None:
            trial.recovery = found.start_mono - trial.kill_mono
            trial.recovered_on = found.cluster
        else:
            trial.problems.append(
                f"no step started within {args.recovery_timeout:.0f}s of the kill"
            )
        # Two clusters again for the next trial.
        clusters.append(sup.start_cluster(args.workers))

    def finished() -> str | None:
        status = Run.objects.filter(pk=run.id).values_list("status", flat=True).first()
        return status if status in TERMINAL_STATUSES else None

    try:
        trial.final_status = wait_for(finished, args.recovery_timeout + 30, f"run {run.id} to end")
    except BenchmarkError as exc:
        trial.final_status = str(Run.objects.get(pk=run.id).status)
        trial.problems.append(str(exc))
    output = Run.objects.get(pk=run.id).output or {}
    trial.output_ok = bool(output.get("ok")) and output.get("steps") == args.steps
    for cluster in clusters:
        sup.wait_ready(cluster)
    return trial


def analyse(trial: Trial, setup: Setup, args: argparse.Namespace, lease_seconds: float) -> None:
    """Count executions per step from the ledger and classify every re-run."""
    from agentruns.models import Run, RunEvent, Step

    executions = ledger_executions(setup.ledger, trial.run_id)
    by_seq: dict[int, list[Execution]] = {}
    for ex in executions:
        by_seq.setdefault(ex.seq, []).append(ex)
    trial.missing_steps = [seq for seq in range(args.steps) if seq not in by_seq]
    steps = {s.seq: s for s in Step.objects.filter(run_id=trial.run_id)}

    killed = bool(trial.killed)
    before = [ex for ex in executions if killed and ex.start_mono < trial.kill_mono]
    if killed:
        trial.executed_by_killed = bool(before) and before[-1].cluster == trial.killed
        others = {ex.cluster for ex in before} - {trial.killed}
        if others:
            trial.problems.append(f"steps ran on {sorted(others)} before the kill")
        if not trial.executed_by_killed:
            trial.problems.append("the killed cluster had not executed any step of the run")
        last = before[-1] if before else None
        trial.mid_body = last is not None and last.end_mono is None
        trial.steps_done_at_kill = sum(
            1 for ex in before if ex.end_mono is not None and ex.end_mono < trial.kill_mono
        )

    for seq, runs in sorted(by_seq.items()):
        if len(runs) == 1:
            continue
        first = runs[0]
        if not killed:
            trial.duplicates.append(seq)
            continue
        body_done = first.end_mono is not None and first.end_mono < trial.kill_mono
        later_started = any(ex.seq > seq and ex.start_mono < trial.kill_mono for ex in executions)
        recorded_at = _timestamp(steps[seq].completed_at) if seq in steps else None
        recorded_before_kill = recorded_at is not None and recorded_at < trial.kill_wall
        extra = len(runs) - 2
        if body_done and (later_started or recorded_before_kill):
            trial.duplicates.append(seq)
        elif body_done:
            # The body returned but the process died before the step commit.
            trial.unrecorded_reruns.append(seq)
        else:
            trial.interrupted_reruns.append(seq)
        if extra > 0:
            trial.problems.append(f"step {seq} ran {len(runs)} times")
            trial.duplicates.extend([seq] * extra)

    # Two executions of one run at the same time would mean two owners.
    spans = []
    for ex in executions:
        end = ex.end_mono
        if end is None:
            end = trial.kill_mono if killed and ex.cluster == trial.killed else math.inf
        spans.append((ex.start_mono, end, ex.cluster))
    for i, (start_a, end_a, cluster_a) in enumerate(spans):
        for start_b, end_b, cluster_b in spans[i + 1 :]:
            if cluster_a != cluster_b and start_a < end_b and start_b < end_a:
                trial.overlaps += 1

    if not killed or trial.recovery is None:
        return
    # Where the recovery time goes (database timestamps; same host, same clock).
    events = list(
        RunEvent.objects.filter(run_id=trial.run_id, type="claimed").values_list(
            "created_at", "payload"
        )
    )
    commits = [
        t
        for t in (_timestamp(s.completed_at) for s in steps.values())
        if t is not None and t < trial.kill_wall
    ]
    commits += [t.timestamp() for t, _ in events if t.timestamp() < trial.kill_wall]
    reclaims = sorted(t.timestamp() for t, _ in events if t.timestamp() > trial.kill_wall)
    enqueued = _timestamp(Run.objects.get(pk=trial.run_id).enqueued_at)
    step_wall = trial.kill_wall + trial.recovery
    if commits:
        # The lease is renewed once a third of it is used, not at every commit, so
        # the last commit only bounds when it was last renewed: this is the latest
        # the dead worker's lease can have expired.
        expiry = max(commits) + lease_seconds
        trial.phases["kill->lease expiry (at most)"] = expiry - trial.kill_wall
    if enqueued is not None and enqueued > trial.kill_wall:
        trial.phases["kill->sweeper knock"] = enqueued - trial.kill_wall
    if reclaims:
        if enqueued is not None and enqueued > trial.kill_wall:
            trial.phases["knock->claim"] = reclaims[0] - enqueued
        trial.phases["claim->step start"] = step_wall - reclaims[0]


def recovery_phase(
    sup: Supervisor, setup: Setup, args: argparse.Namespace, deadline: float
) -> list[Trial]:
    rng = random.Random(args.seed)
    clusters = [sup.start_cluster(args.workers), sup.start_cluster(args.workers)]
    for cluster in clusters:
        sup.wait_ready(cluster)
    trials: list[Trial] = []
    attempts = 0
    while len([t for t in trials if not t.skipped]) < args.trials:
        if time.monotonic() > deadline:
            progress("time budget used up; stopping the trials early")
            break
        attempts += 1
        if attempts > args.trials * 2:
            raise BenchmarkError("too many skipped trials: the run ends before the kill")
        trial = run_trial(len(trials), sup, clusters, setup, args, rng)
        trials.append(trial)
        if trial.skipped:
            progress(f"trial {trial.index}: skipped ({trial.skipped})")
        else:
            recovery = "n/a" if trial.recovery is None else f"{trial.recovery:.2f}s"
            progress(
                f"trial {trial.index}: killed {trial.killed} after {trial.delay:.2f}s, "
                f"next step on {trial.recovered_on or '-'} after {recovery}, "
                f"run {trial.final_status}"
            )
    for cluster in clusters:
        sup.kill(cluster)
    return trials


def report_recovery(
    trials: list[Trial], setup: Setup, args: argparse.Namespace, lease_seconds: float
) -> bool:
    done = [t for t in trials if not t.skipped]
    for trial in trials:
        analyse(trial, setup, args, lease_seconds)
    times = [t.recovery for t in done if t.recovery is not None]
    not_recovered = [t for t in done if t.recovery is None]
    wrong_cluster = [t for t in done if t.recovery is not None and t.recovered_on == t.killed]
    duplicates = sum(len(t.duplicates) for t in trials)
    interrupted = sum(len(t.interrupted_reruns) for t in trials)
    unrecorded = sum(len(t.unrecorded_reruns) for t in trials)
    overlaps = sum(t.overlaps for t in trials)
    completed = [t for t in trials if t.final_status == "completed" and t.output_ok]
    incomplete = [t for t in trials if t not in completed or t.missing_steps]
    not_executing = [t for t in done if not t.executed_by_killed]
    mid_body = sum(1 for t in done if t.mid_body)

    print("recovery (SIGKILL of the cluster advancing the run):")
    print(f"  trials: {len(done)} (skipped: {len(trials) - len(done)})")
    print(f"  kill -> next step start on the surviving cluster: {summary(times)}")
    if not_recovered:
        print(f"  NOT RECOVERED within {args.recovery_timeout:.0f}s: {len(not_recovered)}")
    phase_names = [
        "kill->lease expiry (at most)",
        "kill->sweeper knock",
        "knock->claim",
        "claim->step start",
    ]
    parts = []
    for name in phase_names:
        values = [t.phases[name] for t in done if name in t.phases]
        if values:
            parts.append(f"{name} {statistics.median(values):.2f}")
    if parts:
        print(f"  median phases (s, estimated from database timestamps): {', '.join(parts)}")
    print(
        f"  the kill hit a step body in {mid_body} trial(s), between steps in "
        f"{len(done) - mid_body}; steps completed before the kill: "
        f"{sum(t.steps_done_at_kill for t in done)}"
    )
    print(f"  completed steps that ran twice: {duplicates}")
    print(f"  interrupted steps re-run: {interrupted + unrecorded}", end="")
    print(f" (of which body had returned but the step was not yet recorded: {unrecorded})")
    print(f"  concurrent executions of one run by two clusters: {overlaps}")
    print(f"  runs completed: {len(completed)}/{len(trials)}")
    if not_executing:
        print(f"  trials where the killed cluster was not executing the run: {len(not_executing)}")
    if wrong_cluster:
        print(f"  trials resumed by the killed cluster itself: {len(wrong_cluster)}")
    for trial in trials:
        for problem in trial.problems:
            print(f"  trial {trial.index} ({trial.run_id}): {problem}")
    for trial in incomplete:
        print(
            f"  trial {trial.index} ({trial.run_id}): ended {trial.final_status}, "
            f"output ok {trial.output_ok}, steps never executed {trial.missing_steps}"
        )
    p95 = percentile(times, 95) if times else math.inf
    ok = (
        bool(done)
        and len(times) == len(done)
        and p95 < RECOVERY_TARGET_SECONDS
        and duplicates == 0
        and overlaps == 0
        and not incomplete
        and not not_executing
        and not wrong_cluster
        and len(done) >= args.trials
    )
    verdict = "PASS" if ok else "MISS"
    print(
        f"  target: p95 < {RECOVERY_TARGET_SECONDS:.0f} s, 0 completed steps run twice, "
        f"every run completes: {verdict}"
    )
    return ok


# --- memory ----------------------------------------------------------------------------------


@dataclass
class Reading:
    runs: int
    rss: dict[int, float]

    @property
    def largest(self) -> float:
        return max(self.rss.values()) if self.rss else math.nan


def memory_phase(
    sup: Supervisor, args: argparse.Namespace, deadline: float
) -> tuple[list[Reading], Group, float, list[str]]:
    from agentruns.models import TERMINAL_STATUSES, Run

    cluster = sup.start_cluster(1, {"HOLDFAST_Q_RECYCLE": "100000"})
    sup.wait_ready(cluster)
    first_workers = cluster.worker_pids()
    checkpoints = sorted({args.memory_runs // 2, args.memory_runs} - {0})
    fast = Run.objects.filter(agent_name="fast_steps")
    readings: list[Reading] = []
    notes: list[str] = []
    started = 0
    began = time.monotonic()
    last_progress = (time.monotonic(), 0)
    for checkpoint in checkpoints:
        while True:
            done = fast.filter(status__in=TERMINAL_STATUSES).count()
            if done >= checkpoint:
                break
            if started < checkpoint and started - done < 2 * args.batch:
                for _ in range(min(args.batch, checkpoint - started)):
                    start_run("fast_steps", {"n": started}, f"memory-{SESSION}-{started}")
                    started += 1
            now = time.monotonic()
            if done > last_progress[1]:
                if done // 250 > last_progress[1] // 250:
                    progress(f"memory: {done}/{args.memory_runs} runs done")
                last_progress = (now, done)
            elif now - last_progress[0] > 60:
                raise BenchmarkError(f"memory: no run finished for 60s ({done} done)")
            if now > deadline:
                raise BenchmarkError(f"memory: time budget used up after {done} runs")
            if cluster.proc.poll() is not None:
                raise BenchmarkError(f"memory cluster exited; see {cluster.log_path}")
            time.sleep(0.05)
        workers = cluster.worker_pids()
        readings.append(Reading(checkpoint, {pid: rss_mb(pid) or math.nan for pid in workers}))
        progress(f"memory: {checkpoint} runs done, worker RSS {readings[-1].rss}")
    elapsed = time.monotonic() - began
    final_workers = cluster.worker_pids()
    if final_workers != first_workers:
        notes.append(f"worker processes changed: {first_workers} -> {final_workers}")
    text = cluster.log_text()
    for marker in ("recycled worker", "reincarnated"):
        count = text.count(marker)
        if count:
            notes.append(f"cluster log: {count} x '{marker}'")
    statuses: dict[str, int] = {}
    for status in fast.values_list("status", flat=True):
        statuses[status] = statuses.get(status, 0) + 1
    if statuses.get("completed", 0) != started:
        notes.append(f"fast runs by status: {statuses} (started {started})")
    not_ok = sum(1 for out in fast.values_list("output", flat=True) if not (out or {}).get("ok"))
    if not_ok:
        notes.append(f"{not_ok} fast run(s) without an ok output")
    others = [p for p in group_members(cluster.pgid) if p not in final_workers]
    other_rss = {p: rss_mb(p) for p in others}
    notes.append(
        "other cluster processes (main, sentinel, pusher, monitor) VmRSS MB: "
        + ", ".join(f"{p}: {v:.1f}" for p, v in other_rss.items() if v is not None)
    )
    sup.kill(cluster)
    return readings, cluster, elapsed, notes


def report_memory(
    readings: list[Reading], elapsed: float, notes: list[str], args: argparse.Namespace
) -> bool:
    print(
        f"memory (one cluster, 1 worker, recycle 100000, {args.memory_runs} runs of 2 steps, "
        f"{args.memory_runs / elapsed:.0f} runs/s):"
    )
    for reading in readings:
        each = ", ".join(f"pid {pid} {mb:.1f} MB" for pid, mb in reading.rss.items())
        print(f"  after {reading.runs} runs: worker VmRSS {each}; largest {reading.largest:.1f} MB")
    for note in notes:
        print(f"  {note}")
    if len(readings) < 2:
        print("  MISS: fewer than two readings")
        return False
    first, last = readings[0], readings[-1]
    growth = last.largest - first.largest
    ratio = growth / first.largest if first.largest else math.inf
    print(f"  growth between readings: {growth:+.1f} MB ({ratio:+.1%})")
    changed = set(first.rss) != set(last.rss)
    ok = last.largest < MEMORY_LIMIT_MB and ratio < MEMORY_GROWTH_LIMIT and not changed
    verdict = "PASS" if ok else "MISS"
    print(
        f"  target: < {MEMORY_LIMIT_MB:.0f} MB and growth < {MEMORY_GROWTH_LIMIT:.0%} "
        f"(same worker process): {verdict}"
    )
    return ok


# --- main --------------------------------------------------------------------------------------


def report_enqueue_failures(since: int) -> None:
    failures = ENQUEUE_FAILURES[since:]
    if failures:
        print(
            f"  run_start raised after committing the run (its enqueue failed; the sweeper "
            f"re-enqueued it): {len(failures)}, e.g. {failures[0]}"
        )
    sys.stdout.flush()


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trials", type=int, default=50, help="recovery trials (0: skip)")
    parser.add_argument(
        "--memory-runs", type=int, default=2000, help="runs for the memory check (0: skip)"
    )
    parser.add_argument("--workers", type=int, default=2, help="workers per recovery cluster")
    parser.add_argument("--steps", type=int, default=8, help="steps of the slow run")
    parser.add_argument("--step-sleep", type=float, default=0.3, help="seconds each step sleeps")
    parser.add_argument("--batch", type=int, default=25, help="fast runs started at a time")
    parser.add_argument("--seed", type=int, default=None, help="seed for the kill delays")
    parser.add_argument("--recovery-timeout", type=float, default=60.0)
    parser.add_argument(
        "--max-minutes", type=float, default=60.0, help="stop early after this long"
    )
    parser.add_argument("--pg-database", default=PG_DATABASE)
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    return parser.parse_args(list(argv) if argv is not None else None)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: Iterable[str] | None = None) -> int:
    args = parse_args(argv)
    if args.steps * args.step_sleep <= 2.2:
        raise SystemExit("--steps x --step-sleep must exceed the longest kill delay (2.0 s)")
    # Ctrl-C raises KeyboardInterrupt even when started from a shell that ignores SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    deadline = T0 + args.max_minutes * 60
    setup = prepare(args)
    sup = Supervisor(setup.workdir / "logs", setup.env)
    atexit.register(sup.cleanup)
    keep = args.keep
    results: list[bool] = []
    try:
        from django.conf import settings

        conf = settings.HOLDFAST
        lease = float(conf["LEASE_SECONDS"])
        print(
            f"Holdfast recovery benchmark on {setup.description}\n"
            f"  lease {lease:g} s, sweep interval {conf['SWEEP_INTERVAL_SECONDS']:g} s, "
            f"django-q2 poll {settings.Q_CLUSTER['poll']:g} s, "
            f"task retry {settings.Q_CLUSTER['retry']:g} s"
        )
        sup.start_sweeper()
        if args.trials > 0:
            print(
                f"  recovery: 2 clusters x {args.workers} worker(s); slow run = {args.steps} "
                f"read-only steps x {args.step_sleep:g} s; kill 0.2-2.0 s after the claim",
                flush=True,
            )
            trials = recovery_phase(sup, setup, args, deadline)
            results.append(report_recovery(trials, setup, args, lease))
            report_enqueue_failures(0)
            sys.stdout.flush()
        if args.memory_runs > 0:
            before = len(ENQUEUE_FAILURES)
            readings, _, elapsed, notes = memory_phase(sup, args, deadline)
            results.append(report_memory(readings, elapsed, notes, args))
            report_enqueue_failures(before)
        print(f"total runtime: {time.monotonic() - T0:.0f} s")
        keep = keep or not all(results)
        return 0 if all(results) else 1
    except BaseException:
        keep = True
        raise
    finally:
        sup.cleanup()
        if keep:
            progress(f"work directory (logs, ledger) kept: {setup.workdir}")
        else:
            shutil.rmtree(setup.workdir, ignore_errors=True)
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchmarkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except sqlite3.Error as exc:
        print(f"ledger error: {exc}", file=sys.stderr)
        sys.exit(2)
