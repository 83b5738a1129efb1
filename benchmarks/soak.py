"""Soak: 1,000 refund runs on PostgreSQL while everything around the workers fails.

Run from the project root (not in CI; 15-30 minutes on a 2-core machine)::

    .venv/bin/python benchmarks/soak.py [--runs 1000] [--kills 120] [--seed N] [--keep]

What it sets up, all of it its own and removed at the end (``--keep`` keeps the
database):

- a fresh PostgreSQL database ``holdfast_soak_<pid>`` on the server of
  ``DATABASE_URL`` (default ``postgres://postgres@127.0.0.1:5432/``), migrated;
- the sandbox (``manage.py runsandbox``) on free ports with its own SQLite file, so
  the provider's records live outside the database being restarted, seeded with
  enough sets of demo orders (``POST /_sandbox/seed``, first_number 1001, 2001, ...)
  that no order is refunded beyond what it paid;
- two worker clusters (``manage.py worker``, ``HOLDFAST_WORKERS=2`` each) and two
  sweepers (``manage.py sweep --loop``), each in its own session, with ``REDIS_URL``
  set; every other setting is the default.

The runs (``refund_support``, 1.00-2.00 EUR each, no email) are admitted in-process
through ``agentruns.services.run_start``, spread over the first part of the chaos
window so that faults meet runs in every phase (a run whose admission meets the
database restarting is admitted again under the same request id). Meanwhile, for
a bounded time: random SIGKILLs of a worker cluster's process group, each cluster
started again at once as a supervisor would; two PostgreSQL restarts, at least
60 s apart (each only when no ``pytest`` process runs on the machine: another
engineer's suite would lose its connections; it waits up to 10 minutes for one to
finish); one Redis restart; a provider outage (the sandbox refuses connections for
30 s); and random provider faults (lost replies, 500s before and after execution,
429s, delays) armed throughout. A sweeper or cluster that exits on its own is noted
and started again.

Then it waits (bounded) for every run to settle and prints: runs by final state;
refunds at the provider (``GET /_sandbox/stats``, its own tables) against succeeded
refund steps, and duplicates (effect keys with more than one refund); each run not
terminal with its status and why; the time to settle; the wake-ups django-q2's
queue carried (its depth, the sweepers' knocks, what each task found); worker RSS at
the end; and the log lines each outage left in each process's log. Every process's log stays in
the directory printed at the top and the bottom.

Exits 1 if any effect key has more than one refund or the refunds differ from the
succeeded refund steps; 2 if the soak itself could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import requests

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PYTHON = sys.executable
MANAGE = str(ROOT / "manage.py")
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
API_KEY = "sk_test_sandbox"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}

TERMINAL = {
    "completed",
    "failed_before_effect",
    "failed_after_effect",
    "compensated",
    "cancelled_no_effect",
    "cancelled_after_irreversible_effect",
}
# No worker moves these again: they wait for a person.
NEEDS_A_PERSON = {"waiting_for_approval", "effect_unknown_reconciliation_required", "blocked"}

ORDERS_PER_SET = 6
SMALLEST_ORDER = 3490  # minor units: the smallest demo order (sandbox/seed.py)
AMOUNTS = (100, 200)  # each run refunds between these, inclusive
PG_WAIT_FOR_PYTEST_SECONDS = 600.0
PG_RESTART_SPACING_SECONDS = 60.0
# How long after an outage ends its log lines are still counted as its own.
OUTAGE_LOG_TAIL_SECONDS = 20.0
REDIS_DOWN_SECONDS = 5.0
UNREACHABLE = re.compile(r"unreachable")
BACK = re.compile(r"back after")

T0 = time.monotonic()


def progress(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", flush=True)


class SoakError(Exception):
    pass


# --- processes ---------------------------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after the last ")".
    return raw[raw.rindex(")") + 2 :].split()


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields is not None and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry.name))
    return members


def rss_mb(pid: int) -> float | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def leader_exited(pid: int) -> bool:
    """Whether a child has exited, without reaping it (it stays a zombie)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


@dataclass
class Managed:
    """One process group the soak started and supervises."""

    label: str
    kind: str  # cluster, sweeper, sandbox
    argv: list[str]
    env: dict[str, str]
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    started: float
    ended: float | None = None
    killed: bool = False

    @property
    def pgid(self) -> int:
        return self.popen.pid

    @property
    def live(self) -> bool:
        return self.ended is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self) -> list[int]:
        found = re.findall(r"ready for work at (\d+)", self.log_text())
        members = set(group_members(self.pgid))
        return [int(pid) for pid in dict.fromkeys(found) if int(pid) in members]


class Supervisor:
    """Starts process groups, restarts one that exits on its own, kills them all in the end."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.all: list[Managed] = []
        self.counts: Counter[str] = Counter()
        self.deaths: list[str] = []

    def start(self, kind: str, argv: list[str], env: dict[str, str]) -> Managed:
        self.counts[kind] += 1
        label = f"{kind}-{self.counts[kind]:03d}"
        log_path = self.log_dir / f"{label}.log"
        log_file = log_path.open("ab")
        popen = subprocess.Popen(
            [PYTHON, MANAGE, *argv],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        managed = Managed(label, kind, argv, env, popen, log_path, log_file, time.monotonic())
        self.all.append(managed)
        return managed

    def live(self, kind: str) -> list[Managed]:
        return [m for m in self.all if m.kind == kind and m.live]

    def kill(self, managed: Managed) -> None:
        """SIGKILL the whole group and reap it."""
        managed.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(managed.pgid, signal.SIGKILL)
        self._reap(managed)

    def replace(self, managed: Managed) -> Managed:
        return self.start(managed.kind, managed.argv, managed.env)

    def _reap(self, managed: Managed, timeout: float = 5.0) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            managed.popen.wait(timeout=timeout)
        deadline = time.monotonic() + timeout
        while group_members(managed.pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
        managed.ended = time.monotonic()
        with contextlib.suppress(OSError):
            managed.log_file.close()

    def restart_the_dead(self) -> None:
        """A process that exited without being killed by the soak is noted and started again."""
        for managed in list(self.all):
            if not managed.live or not leader_exited(managed.popen.pid):
                continue
            # The leader is a zombie until reaped, so its number cannot name another
            # group yet: what is left of its group is killed before the leader is reaped.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(managed.pgid, signal.SIGKILL)
            self._reap(managed)
            code = managed.popen.returncode
            tail = " | ".join(managed.log_text().strip().splitlines()[-3:])
            self.deaths.append(f"{managed.label} exited on its own (code {code}): {tail}")
            progress(f"WARNING: {managed.label} exited on its own (code {code}); restarting")
            self.replace(managed)

    def cleanup(self) -> None:
        for managed in self.all:
            if managed.live:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(managed.pgid, signal.SIGKILL)
        for managed in self.all:
            if managed.live:
                self._reap(managed)


def wait_ready(managed: Managed, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        text = managed.log_text()
        if managed.kind == "cluster":
            ready = "running." in text and len(managed.worker_pids()) >= 2
        else:
            ready = managed.popen.poll() is None and time.monotonic() - managed.started > 1.0
        if ready:
            return
        if managed.popen.poll() is not None:
            raise SoakError(f"{managed.label} exited at start; see {managed.log_path}")
        if time.monotonic() > deadline:
            raise SoakError(f"{managed.label} not ready after {timeout:.0f}s; {managed.log_path}")
        time.sleep(0.1)


# --- the database, the sandbox, the infrastructure ------------------------------------------


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def create_database(server: str, name: str) -> str:
    import psycopg
    from psycopg import sql

    if urlsplit(server).hostname not in LOCAL_HOSTS:
        raise SoakError(f"refusing a non-local database server: {urlsplit(server).hostname}")
    with psycopg.connect(with_database(server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(server, name)


def drop_database(server: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(with_database(server, "postgres"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


class Reader:
    """Reads the engine's tables with raw SQL, as an outside observer, through restarts."""

    def __init__(self, url: str):
        self.url = url
        self._conn: Any = None

    def query(self, statement: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        import psycopg
        from psycopg.rows import dict_row

        for attempt in range(120):
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
                return list(self._conn.execute(statement, params).fetchall())
            except psycopg.OperationalError:
                if attempt == 119:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def queue_depth(self) -> int:
        """Wake-ups waiting in django-q2's ORM broker (the queue is in the same database)."""
        return self.query("SELECT count(*) AS n FROM django_q_ormq")[0]["n"]

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


class Sandbox:
    """The sandbox's control routes, with the control token the soak chose for it."""

    def __init__(self, url: str, control_token: str):
        self.url = url
        self.headers = {
            "Authorization": f"Bearer {control_token}",
            "Content-Type": "application/json",
        }

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = requests.post(self.url + path, json=body, headers=self.headers, timeout=10)
        answer.raise_for_status()
        return answer.json()

    def stats(self) -> dict[str, Any]:
        answer = requests.get(self.url + "/_sandbox/stats", headers=self.headers, timeout=30)
        answer.raise_for_status()
        return answer.json()

    def clear_faults(self) -> int:
        answer = requests.delete(self.url + "/_sandbox/faults", headers=self.headers, timeout=10)
        answer.raise_for_status()
        return answer.json()["cleared"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_command(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def pg_cluster() -> tuple[str, str, str]:
    """(version, name, status) of the local cluster on port 5432."""
    for line in run_command("pg_lsclusters", "--no-header").stdout.splitlines():
        version, name, port, status, *_ = line.split()
        if port == "5432":
            return version, name, status
    raise SoakError("no PostgreSQL cluster on port 5432 in pg_lsclusters")


def pg_ensure_running() -> str:
    version, name, status = pg_cluster()
    if status != "online":
        progress(f"PostgreSQL {version}/{name} is {status}: starting it")
        run_command("pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start")
        status = pg_cluster()[2]
    return status


def other_pytests() -> list[str]:
    found = run_command("pgrep", "-af", "pytest").stdout.splitlines()
    return [line for line in found if int(line.split()[0]) != os.getpid()]


def redis_ping() -> bool:
    return run_command("redis-cli", "ping", timeout=10).stdout.strip() == "PONG"


def redis_start() -> None:
    started = run_command(
        "redis-server",
        "--daemonize",
        "yes",
        "--bind",
        "127.0.0.1",
        "--port",
        "6379",
        "--save",
        "",
        "--appendonly",
        "no",
    )
    if started.returncode != 0:
        progress(f"WARNING: redis-server did not start: {started.stderr.strip()}")


def redis_ensure_running() -> bool:
    if not redis_ping():
        progress("Redis is not answering: starting it")
        redis_start()
        time.sleep(0.5)
    return redis_ping()


# --- outages and their log lines ---------------------------------------------------------------


@dataclass
class Outage:
    """One injected outage, and the size of every process log when it began."""

    name: str
    began: float
    offsets: dict[Path, int]
    ended: float | None = None
    took: float | None = None
    note: str = ""
    # label -> (unreachable, back, tracebacks), filled when its window closes.
    lines: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    closed: bool = False


def log_offsets(supervisor: Supervisor) -> dict[Path, int]:
    return {m.log_path: m.log_path.stat().st_size for m in supervisor.all if m.log_path.exists()}


def count_outage_lines(outage: Outage, supervisor: Supervisor) -> None:
    """Lines each process logged from the outage's start until its window closed."""
    for managed in supervisor.all:
        if managed.kind == "sandbox" or not managed.log_path.exists():
            continue
        if managed.ended is not None and managed.ended < outage.began:
            continue
        with managed.log_path.open("rb") as handle:
            handle.seek(outage.offsets.get(managed.log_path, 0))
            text = handle.read().decode(errors="replace")
        outage.lines[managed.label] = (
            len(UNREACHABLE.findall(text)),
            len(BACK.findall(text)),
            text.count("Traceback"),
        )
    outage.closed = True


# --- the chaos ----------------------------------------------------------------------------------

FAULTS: list[tuple[str, str, str, int]] = [
    # (kind, method, path, weight)
    ("drop_after_commit", "POST", "/v1/refunds", 5),
    ("error_before", "POST", "/v1/refunds", 3),
    ("error_after", "POST", "/v1/refunds", 3),
    ("rate_limit", "POST", "/v1/refunds", 3),
    ("delay", "POST", "/v1/refunds", 4),
    ("error_before", "GET", "/v1/payment_intents", 1),
    ("delay", "GET", "/v1/payment_intents", 1),
    ("drop_after_commit", "GET", "/shop/orders", 1),
    ("error_before", "GET", "/shop/orders", 1),
    ("rate_limit", "GET", "/shop/orders", 1),
    ("error_before", "GET", "/v1/refunds", 1),
]


@dataclass
class Plan:
    kill_times: list[float]
    pg_times: list[float]
    redis_times: list[float]
    provider_outage_at: float
    start_times: list[float]


def make_plan(args: argparse.Namespace, rng: random.Random) -> Plan:
    chaos = args.chaos_seconds
    # Kills anywhere in the window; the other failures spread apart from each other.
    kill_times = sorted(rng.uniform(3.0, chaos - 3.0) for _ in range(args.kills))
    pg_times = [chaos * f + rng.uniform(-10, 10) for f in (0.35, 0.7)][: args.pg_restarts]
    redis_times = [chaos * 0.52 + rng.uniform(-10, 10)][: args.redis_restarts]
    feed = chaos * args.feed_fraction
    start_times = [feed * i / args.runs for i in range(args.runs)]
    return Plan(kill_times, pg_times, redis_times, chaos * 0.15, start_times)


@dataclass
class Chaos:
    """What was injected, and when (monotonic)."""

    kills: int = 0
    kills_of_starting_clusters: int = 0
    faults_armed: Counter[str] = field(default_factory=Counter)
    outages: list[Outage] = field(default_factory=list)
    last_failure: float = 0.0
    skipped: list[str] = field(default_factory=list)
    waited: list[str] = field(default_factory=list)
    # The broker's queue, sampled with every progress line.
    peak_queue: int = 0


class Soak:
    def __init__(self, args, supervisor, sandbox, reader, worker_env, sweeper_env):
        self.args = args
        self.rng = random.Random(args.seed)
        self.supervisor = supervisor
        self.sandbox = sandbox
        self.reader = reader
        self.worker_env = worker_env
        self.sweeper_env = sweeper_env
        self.chaos = Chaos()
        self.run_ids: list[str] = []
        self.provider_down_until = 0.0

    # --- the injections

    def kill_a_cluster(self) -> None:
        clusters = self.supervisor.live("cluster")
        victim = self.rng.choice(clusters)
        if len(victim.worker_pids()) < 2:
            self.chaos.kills_of_starting_clusters += 1
        self.supervisor.kill(victim)
        self.supervisor.replace(victim)
        self.chaos.kills += 1
        self.chaos.last_failure = time.monotonic()

    def arm_random_fault(self) -> None:
        if time.monotonic() < self.provider_down_until:
            return
        kinds = [f[:3] for f in FAULTS]
        kind, method, path = self.rng.choices(kinds, weights=[f[3] for f in FAULTS])[0]
        spec: dict[str, Any] = {"kind": kind, "method": method, "path": path}
        spec["count"] = self.rng.randint(1, 3)
        if kind == "delay":
            # Now and then beyond the refund's 10 s timeout: the caller gives up first.
            spec["delay"] = self.rng.choice([0.5, 1.0, 2.0, 4.0, 12.0])
        if kind == "rate_limit":
            spec["retry_after"] = self.rng.randint(1, 3)
        try:
            self.sandbox.post("/_sandbox/faults", spec)
        except requests.RequestException as exc:
            progress(f"could not arm {kind} on {method} {path}: {exc}")
            return
        self.chaos.faults_armed[f"{kind} {method} {path}"] += spec["count"]
        self.chaos.last_failure = time.monotonic()

    def provider_outage(self) -> None:
        outage = self.begin_outage(f"provider refuses connections {self.args.outage_seconds:.0f} s")
        self.sandbox.post(
            "/_sandbox/faults",
            {"kind": "refuse", "path": "/", "method": "", "delay": self.args.outage_seconds},
        )
        self.provider_down_until = time.monotonic() + self.args.outage_seconds + 1.0
        outage.ended = self.provider_down_until - 1.0
        outage.took = self.args.outage_seconds
        self.chaos.last_failure = outage.ended

    def restart_postgresql(self, index: int) -> None:
        version, name, _ = pg_cluster()
        outage = self.begin_outage(f"PostgreSQL restart {index}")
        began = time.monotonic()
        result = run_command(
            "pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart", timeout=180
        )
        outage.ended = time.monotonic()
        outage.took = outage.ended - began
        if result.returncode != 0:
            outage.note = f"pg_ctlcluster failed: {result.stderr.strip()}"
            progress(f"WARNING: {outage.note}")
        status = pg_ensure_running()
        progress(f"PostgreSQL restarted in {outage.took:.1f} s ({status})")
        self.chaos.last_failure = outage.ended

    def restart_redis(self) -> None:
        outage = self.begin_outage("Redis restart")
        run_command("redis-cli", "shutdown", "nosave")
        time.sleep(REDIS_DOWN_SECONDS)
        redis_start()
        outage.ended = time.monotonic()
        outage.took = outage.ended - outage.began
        progress(f"Redis restarted after {outage.took:.1f} s down (ping: {redis_ping()})")
        self.chaos.last_failure = outage.ended

    def begin_outage(self, name: str) -> Outage:
        progress(f"outage: {name}")
        outage = Outage(name, time.monotonic(), log_offsets(self.supervisor))
        self.chaos.outages.append(outage)
        return outage

    def close_due_outage_windows(self, force: bool = False) -> None:
        now = time.monotonic()
        for outage in self.chaos.outages:
            if outage.closed or outage.ended is None:
                continue
            if force or now > outage.ended + OUTAGE_LOG_TAIL_SECONDS:
                count_outage_lines(outage, self.supervisor)

    # --- the loop

    def pg_restart_allowed(self, index: int, waiting_since: dict[int, float]) -> bool:
        """Whether PostgreSQL may be restarted now: not while someone else's pytest runs."""
        others = other_pytests()
        if not others:
            if index in waiting_since:
                waited = time.monotonic() - waiting_since[index]
                self.chaos.waited.append(
                    f"PostgreSQL restart {index}: waited {waited:.0f} s for another pytest"
                )
                progress(f"the other pytest finished after {waited:.0f} s; restarting PostgreSQL")
            return True
        if index not in waiting_since:
            waiting_since[index] = time.monotonic()
            progress(
                f"PostgreSQL restart {index} is due but a pytest is running "
                f"({others[0][:100]}); waiting for it (up to 10 min)"
            )
        return False

    def run_chaos(self, start_run) -> None:
        plan = make_plan(self.args, self.rng)
        began = time.monotonic()
        kills = list(plan.kill_times)
        pg = list(enumerate(plan.pg_times, start=1))
        redis_times = list(plan.redis_times)
        outage_at: float | None = plan.provider_outage_at
        starts = list(plan.start_times)
        next_fault = self.rng.uniform(1.0, 4.0)
        next_report = 15.0
        waiting_since: dict[int, float] = {}
        while kills or pg or redis_times or outage_at is not None or starts:
            elapsed = time.monotonic() - began
            while starts and starts[0] <= elapsed:
                starts.pop(0)
                self.run_ids.append(start_run(len(self.run_ids)))
            if kills and kills[0] <= elapsed:
                kills.pop(0)
                self.kill_a_cluster()
            if outage_at is not None and outage_at <= elapsed:
                outage_at = None
                self.provider_outage()
            if redis_times and redis_times[0] <= elapsed:
                redis_times.pop(0)
                self.restart_redis()
            if pg and pg[0][1] <= elapsed:
                index, _ = pg[0]
                if self.pg_restart_allowed(index, waiting_since):
                    pg.pop(0)
                    self.restart_postgresql(index)
                    # One restart that waited for a pytest must not bring the next one
                    # right behind it: two outages, not one long one.
                    after = time.monotonic() - began + PG_RESTART_SPACING_SECONDS
                    pg = [(i, max(due, after)) for i, due in pg]
                elif time.monotonic() - waiting_since[index] > PG_WAIT_FOR_PYTEST_SECONDS:
                    pg.pop(0)
                    self.chaos.skipped.append(
                        f"PostgreSQL restart {index}: another pytest still ran after 10 min"
                    )
                    progress(f"WARNING: {self.chaos.skipped[-1]}; skipped")
            if elapsed >= next_fault and elapsed < self.args.chaos_seconds:
                self.arm_random_fault()
                next_fault = elapsed + self.rng.uniform(1.0, 4.0)
            if elapsed >= next_report:
                next_report += 15.0
                self.report_progress(elapsed)
            self.supervisor.restart_the_dead()
            self.close_due_outage_windows()
            time.sleep(0.05)

    def report_progress(self, elapsed: float) -> None:
        rows = self.reader.query("SELECT status, count(*) AS n FROM agentruns_run GROUP BY status")
        states = ", ".join(
            f"{r['status']} {r['n']}" for r in sorted(rows, key=lambda r: r["status"])
        )
        queue = self.sample_queue()
        progress(
            f"chaos {elapsed:5.0f}s: {len(self.run_ids)} started, {self.chaos.kills} kills, "
            f"{sum(self.chaos.faults_armed.values())} faults armed, {queue} queued wake-ups; "
            f"{states}"
        )

    def sample_queue(self) -> int:
        queue = self.reader.queue_depth()
        self.chaos.peak_queue = max(self.chaos.peak_queue, queue)
        return queue

    def wait_settled(self, timeout: float) -> bool:
        """Until no run moves any more (terminal, or waiting for a person), or ``timeout``."""
        began = time.monotonic()
        last = 0.0
        while True:
            rows = self.reader.query(
                "SELECT status, count(*) AS n FROM agentruns_run GROUP BY status"
            )
            states = {r["status"]: r["n"] for r in rows}
            moving = sum(n for s, n in states.items() if s not in TERMINAL | NEEDS_A_PERSON)
            if moving == 0 and sum(states.values()) >= len(self.run_ids):
                return True
            if time.monotonic() - began > timeout:
                return False
            if time.monotonic() - last > 15:
                last = time.monotonic()
                progress(
                    f"settling: {moving} run(s) still moving, {self.sample_queue()} queued "
                    f"wake-ups; {dict(sorted(states.items()))}"
                )
            self.supervisor.restart_the_dead()
            time.sleep(1.0)


# --- setting up ------------------------------------------------------------------------------


def base_env(workdir: Path, secret: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("HOLDFAST_", "DJANGO_", "DATABASE_URL", "REDIS_URL", "SANDBOX_"))
        and key not in ("PROMETHEUS_MULTIPROC_DIR",)
    }
    env.update(
        {
            "HOLDFAST_VAR_DIR": str(workdir / "var"),
            # One key for every process: django-q2 signs its task packages with it.
            "DJANGO_SECRET_KEY": secret,
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def migrate(env: dict[str, str], database: str) -> None:
    done = subprocess.run(
        [PYTHON, MANAGE, "migrate", "--noinput", "-v0", "--database", database],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise SoakError(f"migrate --database {database} failed:\n{done.stdout}{done.stderr}")


def start_sandbox(supervisor: Supervisor, env: dict[str, str]) -> tuple[Sandbox, int]:
    migrate(env, "sandbox")
    port, smtp_port = free_port(), free_port()
    managed = supervisor.start(
        "sandbox", ["runsandbox", "--port", str(port), "--smtp-port", str(smtp_port)], env
    )
    sandbox = Sandbox(f"http://127.0.0.1:{port}", env["SANDBOX_CONTROL_TOKEN"])
    deadline = time.monotonic() + 30
    while True:
        try:
            sandbox.stats()
            break
        except requests.HTTPError as exc:
            raise SoakError(f"the sandbox answered {exc}: {exc.response.text[:300]}") from None
        except requests.RequestException:
            if managed.popen.poll() is not None or time.monotonic() > deadline:
                raise SoakError(f"the sandbox did not start; see {managed.log_path}") from None
            time.sleep(0.2)
    return sandbox, smtp_port


def seed_orders(sandbox: Sandbox, runs: int, rng: random.Random) -> list[tuple[str, int]]:
    """Seed enough order sets, and give each run an order and an amount none over-refunds."""
    most = AMOUNTS[1]
    per_order = SMALLEST_ORDER // most
    sets = math.ceil(runs / (per_order * ORDERS_PER_SET))
    orders: list[str] = []
    for index in range(sets):
        seeded = sandbox.post(
            "/_sandbox/seed", {"api_key": API_KEY, "first_number": 1001 + 1000 * index}
        )
        orders.extend(seeded["seeded"])
    plan = [(orders[i % len(orders)], rng.randint(*AMOUNTS)) for i in range(runs)]
    asked: Counter[str] = Counter()
    for order_id, amount in plan:
        asked[order_id] += amount
    if max(asked.values()) > SMALLEST_ORDER:
        raise SoakError("the plan would refund an order beyond what it paid")
    progress(
        f"sandbox seeded: {sets} set(s), {len(orders)} orders; most asked of one: "
        f"{max(asked.values())} of at least {SMALLEST_ORDER}"
    )
    return plan


def django_in_process(env: dict[str, str]):
    """Set this process up as a Holdfast client; return a function that admits one run."""
    os.environ.clear()
    os.environ.update(env)
    import logging

    import django

    django.setup()
    # This process only admits runs; django-q2 logs every enqueue at INFO.
    logging.getLogger("django-q").setLevel(logging.WARNING)
    from django.db import connections

    from accounts.models import Tenant
    from agentruns.services import run_start

    tenant = Tenant.objects.get(slug="default")
    return tenant, run_start, connections


def admitter(env: dict[str, str], plan: list[tuple[str, int]]):
    tenant, run_start, connections = django_in_process(env)

    def start_run(index: int) -> str:
        order_id, amount = plan[index]
        run_input = {"order_id": order_id, "amount": amount, "email_customer": False}
        for attempt in range(600):
            try:
                run, _ = run_start(
                    tenant=tenant,
                    agent_name="refund_support",
                    input=run_input,
                    # Admission is idempotent by request id: asking again after a lost
                    # connection returns the run if the first ask committed.
                    request_id=f"soak-{index}",
                    requested_by="soak",
                )
                return str(run.id)
            except Exception as exc:
                if attempt == 0:
                    progress(f"admitting run {index}: {type(exc).__name__}: {exc}; retrying")
                connections.close_all()
                time.sleep(0.5)
        raise SoakError(f"could not admit run {index}")

    return start_run


# --- the report ------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def not_terminal(reader: Reader) -> list[list[Any]]:
    runs = reader.query(
        "SELECT id, status, current_step, outcome_detail FROM agentruns_run "
        "WHERE status NOT IN ({}) ORDER BY created_at".format(
            ", ".join(f"'{s}'" for s in sorted(TERMINAL))
        )
    )
    rows = []
    for run in runs:
        steps = reader.query(
            "SELECT step_id, status, last_error_class, last_error FROM agentruns_step "
            "WHERE run_id = %s ORDER BY seq DESC LIMIT 1",
            (run["id"],),
        )
        cases = reader.query(
            "SELECT reason FROM reconciliation_reconciliationcase c "
            "JOIN agentruns_step s ON s.id = c.step_id WHERE s.run_id = %s",
            (run["id"],),
        )
        last = steps[0] if steps else {}
        why = f"{last.get('step_id', '-')} {last.get('status', '')}"
        error = f"{last.get('last_error_class', '')}: {last.get('last_error', '')}".strip(": ")
        if error:
            why += f"; {error[:160]}"
        if cases:
            why += f"; case: {cases[0]['reason'][:120]}"
        rows.append([run["id"], run["status"], why])
    return rows


def effects(reader: Reader, sandbox: Sandbox) -> dict[str, Any]:
    stats = sandbox.stats()["refunds"]
    by_key: dict[str, int] = stats["by_idempotency_key"]
    succeeded = {
        r["effect_key"]: str(r["run_id"])
        for r in reader.query(
            "SELECT effect_key, run_id FROM agentruns_step "
            "WHERE name = 'issue_refund' AND status = 'succeeded'"
        )
    }
    refund_steps = reader.query(
        "SELECT status, count(*) AS n FROM agentruns_step WHERE name = 'issue_refund' "
        "GROUP BY status"
    )
    return {
        "total": stats["total"],
        "unkeyed": stats["total"] - sum(by_key.values()),
        "succeeded_steps": len(succeeded),
        "refund_steps": {r["status"]: r["n"] for r in refund_steps},
        "duplicates": {key: n for key, n in by_key.items() if n > 1},
        "without_step": sorted(key for key in by_key if key not in succeeded),
        "without_refund": sorted((key, run) for key, run in succeeded.items() if key not in by_key),
    }


def process_role(pid: int, cluster: Managed, workers: set[int]) -> str:
    if pid == cluster.pgid:
        return "main (manage.py worker)"
    if pid in workers:
        return "worker"
    fields = _proc_stat(pid)
    # django-q2's sentinel is the main process's child; it forks the rest.
    return "sentinel" if fields and int(fields[1]) == cluster.pgid else "pusher or monitor"


def worker_rss(supervisor: Supervisor) -> list[list[Any]]:
    rows = []
    for cluster in supervisor.live("cluster"):
        workers = set(cluster.worker_pids())
        age = time.monotonic() - cluster.started
        for pid in sorted(group_members(cluster.pgid)):
            rss = rss_mb(pid)
            rows.append(
                [
                    cluster.label,
                    pid,
                    process_role(pid, cluster, workers),
                    f"{age:.0f} s",
                    f"{rss:.1f} MB" if rss else "?",
                ]
            )
    return rows


def write_evidence(reader: Reader, path: Path, found: dict[str, Any]) -> int:
    """Each run worth a second look, with its steps and events, into one file."""
    suspects = [
        str(r["id"])
        for r in reader.query(
            "SELECT id FROM agentruns_run WHERE status <> 'completed' "
            "OR outcome_code <> 'refunded' ORDER BY created_at LIMIT 200"
        )
    ]
    for key in [*found["duplicates"], *found["without_step"]]:
        rows = reader.query("SELECT run_id FROM agentruns_step WHERE effect_key = %s", (key,))
        suspects += [str(r["run_id"]) for r in rows]
    suspects += [run for _, run in found["without_refund"]]
    with path.open("w") as out:
        for run_id in dict.fromkeys(suspects):
            run = reader.query("SELECT * FROM agentruns_run WHERE id = %s", (run_id,))
            out.write(f"=== run {run_id}\n{json.dumps(run, default=str, indent=1)}\n")
            for kind in ("step", "runevent"):
                rows = reader.query(
                    f"SELECT * FROM agentruns_{kind} WHERE run_id = %s ORDER BY id", (run_id,)
                )
                for row in rows:
                    out.write(f"--- {kind} {json.dumps(row, default=str)}\n")
    return len(dict.fromkeys(suspects))


def wake_ups(soak: Soak) -> list[list[Any]]:
    """What the broker carried: knocks the sweepers made, and what each task found."""
    knocks: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for managed in soak.supervisor.all:
        text = managed.log_text()
        if managed.kind == "sweeper":
            for kind, n in re.findall(r"(woke|recovered|requeued|resumed) (\d+)", text):
                knocks[kind] += int(n)
        elif managed.kind == "cluster":
            outcomes.update(re.findall(r"holdfast\.tasks run \S+: (\w+)", text))
    return [
        ["peak queued wake-ups (sampled every 15 s)", soak.chaos.peak_queue],
        ["queued wake-ups at the end", soak.reader.queue_depth()],
        ["sweeper knocks", ", ".join(f"{k} {n}" for k, n in sorted(knocks.items())) or "none"],
        ["tasks by outcome", ", ".join(f"{k} {n}" for k, n in outcomes.most_common()) or "none"],
    ]


def final_report(soak: Soak, settled: bool, settle_wall: float, wall_began: float) -> int:
    reader, chaos, supervisor = soak.reader, soak.chaos, soak.supervisor
    print("\n=== Runs by final state")
    rows = reader.query(
        "SELECT status, outcome_code, count(*) AS n FROM agentruns_run "
        "GROUP BY status, outcome_code ORDER BY count(*) DESC"
    )
    print(
        table(
            ["state", "outcome", "runs"],
            [[r["status"], r["outcome_code"] or "-", r["n"]] for r in rows],
        )
    )

    found = effects(reader, soak.sandbox)
    print("\n=== Effects (the sandbox's own records against the engine's refund steps)")
    print(
        table(
            ["figure", "value"],
            [
                ["refunds at the provider", found["total"]],
                ["succeeded issue_refund steps", found["succeeded_steps"]],
                ["issue_refund steps by status", json.dumps(found["refund_steps"], sort_keys=True)],
                ["duplicates (keys with > 1 refund)", len(found["duplicates"])],
                ["refunds without an idempotency key", found["unkeyed"]],
                ["refunds whose key no succeeded step has", len(found["without_step"])],
                ["succeeded steps with no refund", len(found["without_refund"])],
            ],
        )
    )
    for key, n in found["duplicates"].items():
        print(f"  DUPLICATE {key}: {n} refunds")
    for key in found["without_step"]:
        print(f"  refund without a succeeded step: {key}")
    for key, run in found["without_refund"]:
        print(f"  succeeded step without a refund: run {run} key {key}")

    evidence = soak.supervisor.log_dir / "evidence.txt"
    suspects = write_evidence(reader, evidence, found)
    print(
        f"  every run not completed with a refund, or in a line above: {suspects} run(s), "
        f"with steps and events, in {evidence}"
    )

    print("\n=== Runs not terminal")
    waiting = not_terminal(reader)
    print(table(["run", "status", "why (last step; error; case)"], waiting) if waiting else "none")

    finished = reader.query("SELECT max(finished_at) AS last FROM agentruns_run")[0]["last"]
    last_failure_wall = time.time() - (time.monotonic() - chaos.last_failure)
    print("\n=== Time")
    print(
        table(
            ["figure", "value"],
            [
                ["settled within the wait", "yes" if settled else "NO"],
                [
                    "last injected failure → last run terminal",
                    f"{finished.timestamp() - last_failure_wall:.1f} s" if finished else "n/a",
                ],
                ["waited after the chaos", f"{settle_wall:.1f} s"],
                ["total wall time", f"{time.time() - wall_began:.1f} s"],
            ],
        )
    )

    print("\n=== Wake-ups (django-q2 tasks; a task only knocks, the claim decides)")
    print(table(["figure", "value"], wake_ups(soak)))

    print("\n=== Worker RSS at the end (/proc VmRSS)")
    print(table(["cluster", "pid", "process", "cluster age", "RSS"], worker_rss(supervisor)))

    print("\n=== Log lines per outage (from its start until 20 s after it ended)")
    for outage in chaos.outages:
        took = f"{outage.took:.1f} s" if outage.took is not None else "?"
        print(f"-- {outage.name} ({took}{'; ' + outage.note if outage.note else ''})")
        rows = [[label, *counts] for label, counts in sorted(outage.lines.items())]
        logged = [row for row in rows if any(row[1:])]
        if logged:
            print(table(["process", "unreachable", "back after", "tracebacks"], logged))
        totals = [sum(r[i] for r in rows) for i in (1, 2, 3)]
        print(
            f"   {len(rows)} processes alive in the window, {len(rows) - len(logged)} logged "
            f"none of these; total: {totals[0]} unreachable, {totals[1]} back after, "
            f"{totals[2]} tracebacks"
        )

    print("\n=== Processes")
    # The sandbox's own tracebacks are replies it could not write to a caller that
    # was killed or gave up; they are the provider's, not Holdfast's.
    tracebacks = {m.label: m.log_text().count("Traceback") for m in supervisor.all}
    print(
        table(
            ["figure", "value"],
            [
                ["clusters started", supervisor.counts["cluster"]],
                ["sweepers started", supervisor.counts["sweeper"]],
                ["exited on their own", len(supervisor.deaths)],
                [
                    "logs with a traceback",
                    ", ".join(f"{k} ({v})" for k, v in tracebacks.items() if v) or "none",
                ],
            ],
        )
    )
    for death in supervisor.deaths:
        print(f"  {death}")

    bad = len(found["duplicates"]) > 0 or found["total"] != found["succeeded_steps"]
    return 1 if bad else 0


# --- main --------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=120, help="SIGKILLs of a worker cluster")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--keep", action="store_true", help="keep the database at the end")
    parser.add_argument("--chaos-seconds", type=float, default=600.0)
    parser.add_argument(
        "--feed-fraction",
        type=float,
        default=0.6,
        help="runs are admitted evenly over this part of the chaos window (0: all at once)",
    )
    parser.add_argument("--settle-seconds", type=float, default=900.0)
    parser.add_argument("--pg-restarts", type=int, default=2, choices=(0, 1, 2))
    parser.add_argument("--redis-restarts", type=int, default=1, choices=(0, 1))
    parser.add_argument("--outage-seconds", type=float, default=30.0)
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(10**6)
    return args


def main() -> int:
    args = parse_args()
    # A stop from outside still cleans up (processes, database, PostgreSQL and Redis up).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    wall_began = time.time()
    workdir = Path(tempfile.mkdtemp(prefix="holdfast-soak-"))
    log_dir = workdir / "logs"
    log_dir.mkdir()
    (workdir / "var").mkdir()
    server = os.environ.get("DATABASE_URL") or DEFAULT_SERVER
    name = f"holdfast_soak_{os.getpid()}"
    print("=== Soak configuration")
    print(
        table(
            ["setting", "value"],
            [
                ["date", datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")],
                ["machine", f"{os.cpu_count()} cores"],
                ["database", f"PostgreSQL, fresh database {name} on {urlsplit(server).netloc}"],
                ["sandbox", "its own SQLite file"],
                ["runs", f"{args.runs} refund_support, {AMOUNTS[0]}-{AMOUNTS[1]} minor units each"],
                ["admitted over", f"the first {args.feed_fraction:.0%} of the chaos window"],
                ["worker clusters", "two of manage.py worker, HOLDFAST_WORKERS=2 each"],
                ["sweepers", "two of manage.py sweep --loop"],
                ["REDIS_URL", REDIS_URL],
                ["chaos window", f"{args.chaos_seconds:.0f} s"],
                ["cluster SIGKILLs", args.kills],
                ["PostgreSQL restarts", args.pg_restarts],
                ["Redis restarts", args.redis_restarts],
                ["provider outage", f"refused connections for {args.outage_seconds:.0f} s"],
                [
                    "random provider faults",
                    "every 1-4 s: " + ", ".join(sorted({f[0] for f in FAULTS})),
                ],
                ["settle wait", f"at most {args.settle_seconds:.0f} s"],
                ["random seed", args.seed],
                ["logs", str(log_dir)],
            ],
        )
    )
    if args.pg_restarts and (os.geteuid() != 0 or not shutil.which("pg_ctlcluster")):
        raise SoakError("PostgreSQL restarts need root and pg_ctlcluster")
    if not redis_ping():
        raise SoakError("Redis does not answer at 127.0.0.1:6379")

    rng = random.Random(args.seed)
    supervisor = Supervisor(log_dir)
    env = base_env(workdir, f"soak-{os.getpid()}-{rng.random()}")
    sandbox_env = {
        **env,
        "HOLDFAST_SANDBOX_SQLITE_PATH": str(workdir / "sandbox.sqlite3"),
        # The control routes (/_sandbox/) ask for it; the soak chooses it.
        "SANDBOX_CONTROL_TOKEN": f"soak-{secrets.token_urlsafe(24)}",
    }
    url = create_database(server, name)
    progress(f"created database {name}")
    reader = Reader(url)
    code = 2
    try:
        sandbox, smtp_port = start_sandbox(supervisor, sandbox_env)
        plan = seed_orders(sandbox, args.runs, rng)
        holdfast_env = {
            **env,
            "DATABASE_URL": url,
            "REDIS_URL": REDIS_URL,
            "HOLDFAST_AGENT_MODULES": "support.agents",
            "PAYMENTS_API_BASE": sandbox.url,
            "SHOP_API_BASE": sandbox.url,
            "EMAIL_HOST": "127.0.0.1",
            "EMAIL_PORT": str(smtp_port),
        }
        migrate(holdfast_env, "default")
        progress("database migrated")
        worker_env = {**holdfast_env, "HOLDFAST_WORKERS": "2"}
        started = [supervisor.start("cluster", ["worker"], worker_env) for _ in range(2)]
        started += [
            supervisor.start("sweeper", ["sweep", "--loop"], holdfast_env) for _ in range(2)
        ]
        for managed in started:
            wait_ready(managed)
        progress("2 worker clusters and 2 sweepers are up")
        start_run = admitter(holdfast_env, plan)

        soak = Soak(args, supervisor, sandbox, reader, worker_env, holdfast_env)
        soak.run_chaos(start_run)
        cleared = sandbox.clear_faults()
        soak.chaos.last_failure = max(soak.chaos.last_failure, time.monotonic())
        progress(
            f"chaos over: {soak.chaos.kills} kills; {cleared} armed fault(s) left "
            "unconsumed were cleared"
        )
        pg_ensure_running()
        redis_ensure_running()

        settle_began = time.monotonic()
        settled = soak.wait_settled(args.settle_seconds)
        settle_wall = time.monotonic() - settle_began
        soak.close_due_outage_windows(force=True)
        print_injections(soak)
        code = final_report(soak, settled, settle_wall, wall_began)
    except SoakError as exc:
        progress(f"SOAK ERROR: {exc}")
        code = 2
    except Exception:
        # Exit 1 means a duplicate or a missing refund; the soak's own failure is 2.
        traceback.print_exc()
        code = 2
    finally:
        supervisor.cleanup()
        reader.close()
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        print(f"\nPostgreSQL: {pg_ensure_running()}; Redis answering: {redis_ensure_running()}")
        if args.keep:
            print(f"kept the database {name}: {url}")
        else:
            drop_database(server, name)
            print(f"dropped the database {name}")
        print(f"logs: {log_dir}")
    return code


def print_injections(soak: Soak) -> None:
    chaos = soak.chaos
    print("\n=== What was injected")
    rows: list[list[Any]] = [
        [
            "worker cluster SIGKILLs",
            f"{chaos.kills} ({chaos.kills_of_starting_clusters} of a cluster still starting)",
        ],
        ["runs admitted", len(soak.run_ids)],
    ]
    rows += [
        [outage.name, f"{outage.took:.1f} s" if outage.took else "?"] for outage in chaos.outages
    ]
    rows += [[f"fault {name}", count] for name, count in sorted(chaos.faults_armed.items())]
    rows += [["skipped", s] for s in chaos.skipped] + [["waited", w] for w in chaos.waited]
    print(table(["injection", "count / duration"], rows))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SoakError as exc:
        print(f"SOAK ERROR: {exc}", file=sys.stderr)
        sys.exit(2)
