"""The workload of ``benchmarks/throughput.py``, run on DBOS Transact for comparison.

Standalone: it imports nothing of Holdfast nor Django, because DBOS's dependencies
(SQLAlchemy, psycopg and others) may clash with the project's pinned ones, so it runs
in a virtualenv of its own::

    python3 -m venv /tmp/dbos-venv
    /tmp/dbos-venv/bin/pip install dbos==3.4.0   # brings psycopg[binary] and SQLAlchemy

    /tmp/dbos-venv/bin/python benchmarks/dbos_queue.py \\
        [--database-url postgres://postgres@127.0.0.1:5432/holdfast_dbos_bench] \\
        [--concurrency 4] [--processes 1] [--runs 300] [--steps 10] [--poll 0.1]

``benchmarks/throughput.py --dbos-python /tmp/dbos-venv/bin/python`` runs it beside
Holdfast in the same sitting (with ``--handshake``, below).

The workload: ``--runs`` workflows of ``--steps`` ``@DBOS.step()`` no-op steps each
(a step returns its argument), enqueued in one burst by a ``DBOSClient`` in this
process on a DBOS queue registered with ``worker_concurrency`` = ``--concurrency`` ÷
``--processes`` and ``polling_interval_sec`` = ``--poll``, while ``--processes``
executor processes (this script with ``--executor``, each ``DBOS.launch()``-ed with
its own executor id) run them. The system database (its name must contain "bench") is
created if missing, migrated, and emptied (``DBOS.reset_system_database(truncate=True)``)
before the measurement, so each starts empty.

Printed on stdout, one JSON line:

- ``steps_per_second``: all steps over the time from the first workflow's
  ``created_at`` to the last one's ``completed_at`` (both stamped by DBOS);
- ``worker_cpu_seconds_per_step``: user + system time of the executor processes over
  the burst (``/proc/<pid>/stat``), per step;
- ``commits_per_step``: ``xact_commit`` of the database over the burst, the
  enqueues' commits included, this script's own polling for the end excluded;
- ``queue_latency_p50_ms``/``p95`` (and each workflow's, ``queue_latencies_ms``):
  from its ``created_at`` to its ``started_at_epoch_ms`` (its dequeue);
- ``enqueue_cpu_seconds_per_run``: this process's CPU per ``DBOSClient.enqueue``;
- ``excluded_backends``: the PostgreSQL backends of this process (the client's and
  the poller's), so that a caller measuring the database's CPU counts them apart.

With ``--handshake`` (what ``throughput.py`` uses) it also prints ``{"event":
"ready"}`` once the executors listen and waits for a line on stdin before the burst,
then prints ``{"event": "done", ...}`` once every workflow ended and waits for another
line before tearing down: the caller samples the database's backends over exactly the
burst. It exits non-zero with a message on stderr if a step fails, a workflow does not
end, or anything takes longer than ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from dbos import DBOS, DBOSClient
from pipe_lines import LineReader  # benchmarks/, this script's own directory
from psycopg import sql

APP_NAME = "holdfast-bench-dbos"
# Fixed, so every executor is the latest version and dequeues the version-less
# workflows the client enqueues (DBOS would otherwise hash the registered code).
APP_VERSION = "bench"
QUEUE_NAME = "bench_noop"
WORKFLOW_NAME = "bench_noop_workflow"
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/holdfast_dbos_bench"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
FINISHED = ("SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")
POLL_END_SECONDS = 0.05


class BenchError(Exception):
    pass


# --- the workload ------------------------------------------------------------------------


@DBOS.step()
def noop(argument: dict[str, int]) -> dict[str, int]:
    return argument


@DBOS.workflow(name=WORKFLOW_NAME)
def noop_workflow(steps: int, n: int) -> dict[str, Any]:
    for index in range(steps):
        result = noop({"index": index})
        if result != {"index": index}:
            return {"ok": False, "steps": index}
    return {"ok": True, "steps": steps, "n": n}


# --- helpers -------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"dbos_queue: {message}", file=sys.stderr, flush=True)


def emit(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process, all its threads."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): utime is field 14, stime 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def sqlalchemy_url(url: str) -> str:
    """DBOS wants a SQLAlchemy URL; "postgres://" is not one."""
    if url.startswith("postgres://"):
        return "postgresql://" + url.removeprefix("postgres://")
    return url


# --- an executor process ---------------------------------------------------------------------


def executor(args: argparse.Namespace) -> int:
    """Launch DBOS, say "ready" once the queue's worker thread runs, execute until SIGTERM."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()

    def orphaned() -> None:
        # A coordinator that died (killed, or its own timeout) leaves no executor behind.
        while not stop.wait(1.0):
            if os.getppid() != parent:
                stop.set()

    threading.Thread(target=orphaned, daemon=True).start()
    DBOS(
        config={
            "name": APP_NAME,
            "system_database_url": sqlalchemy_url(args.database_url),
            "application_version": APP_VERSION,
            "executor_id": f"bench-executor-{args.index}",
            "log_level": "WARNING",
            # The coordinator migrated the schema: P executors need not race to check it.
            "run_migrations": False,
        }
    )
    DBOS.launch()
    # DBOS starts one worker thread per queue registered in the database (the
    # coordinator registered ours before this launch); until it runs, nothing is
    # dequeued, so the burst must not start before.
    deadline = time.monotonic() + 30.0
    thread_name = f"queue-worker-{QUEUE_NAME}"
    while not any(t.name == thread_name for t in threading.enumerate()):
        if time.monotonic() > deadline:
            log(f"executor {args.index}: no worker thread for queue {QUEUE_NAME} after 30 s")
            return 1
        time.sleep(0.01)
    emit({"event": "ready", "pid": os.getpid()})
    stop.wait()
    DBOS.destroy()
    return 0


# --- the coordinator ---------------------------------------------------------------------------


def prepare_database(url: str) -> str:
    parts = urlsplit(url)
    database = parts.path.lstrip("/")
    if "bench" not in database:
        raise BenchError(
            f"refusing to reset DBOS's tables in database {database!r}: name a dedicated "
            "database whose name contains 'bench'"
        )
    if parts.hostname not in LOCAL_HOSTS:
        raise BenchError(f"the server must be local: {parts.hostname}")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
        if found.fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            log(f"created database {database}")
    DBOS.migrate(sqlalchemy_url(url))
    # Empties every DBOS table (ending any backend left on the database), schema kept.
    DBOS.reset_system_database(system_database_url=sqlalchemy_url(url), truncate=True)
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        conn.execute("VACUUM ANALYZE")
    return database


def xact_commit(conn: psycopg.Connection[Any]) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def start_executors(
    args: argparse.Namespace, deadline: float, executors: list[subprocess.Popen[bytes]]
) -> None:
    """Start the executors into ``executors`` (so that the caller stops every one started,
    even if a later one fails) and wait until each listens."""
    for index in range(args.processes):
        executors.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--executor",
                    "--index",
                    str(index),
                    "--database-url",
                    args.database_url,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                # DBOS logs to stderr: the caller's log.
                stderr=None,
            )
        )
    for index, proc in enumerate(executors):
        assert proc.stdout is not None
        line = LineReader(proc.stdout.fileno(), BenchError).readline(
            deadline, f"executor {index} to start"
        )
        if json.loads(line).get("event") != "ready":
            raise BenchError(f"executor {index} said {line!r}")


def stop_executors(executors: list[subprocess.Popen[bytes]]) -> None:
    for proc in executors:
        if proc.poll() is None:
            proc.terminate()
    for proc in executors:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ended(conn: psycopg.Connection[Any], runs: int, deadline: float) -> int:
    """Poll until every workflow ended; returns how many statements that took."""
    statements = 0
    while True:
        row = conn.execute(
            "SELECT count(*) FROM dbos.workflow_status WHERE queue_name = %s AND status = ANY(%s)",
            [QUEUE_NAME, list(FINISHED)],
        ).fetchone()
        statements += 1
        if row is not None and row[0] >= runs:
            return statements
        if time.monotonic() > deadline:
            ended = row[0] if row is not None else 0
            raise BenchError(f"{runs - ended} of {runs} workflow(s) not ended before the timeout")
        time.sleep(POLL_END_SECONDS)


def coordinate(args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + args.timeout
    if args.concurrency % args.processes:
        raise BenchError(
            f"--concurrency {args.concurrency} is not a multiple of --processes {args.processes}"
        )
    worker_concurrency = args.concurrency // args.processes
    database = prepare_database(args.database_url)
    stdin = LineReader(sys.stdin.fileno(), BenchError) if args.handshake else None
    client = DBOSClient(
        system_database_url=sqlalchemy_url(args.database_url),
        application_name=APP_NAME,
        # Enqueues are sequential: one connection, one backend to count apart.
        system_database_pool_size=1,
    )
    executors: list[subprocess.Popen[bytes]] = []
    try:
        # Before the executors launch, so that each starts the queue's worker thread at once.
        client.register_queue(
            QUEUE_NAME,
            worker_concurrency=worker_concurrency,
            polling_interval_sec=args.poll,
            application_name=APP_NAME,
        )
        start_executors(args, deadline, executors)
        with psycopg.connect(args.database_url, autocommit=True, connect_timeout=10) as conn:
            if stdin is not None:
                emit({"event": "ready"})
                stdin.readline(deadline, "the go-ahead on stdin")
            commits_before = xact_commit(conn)
            cpu_before = {p.pid: process_cpu(p.pid) for p in executors}
            began = time.monotonic()
            enqueue_cpu = time.process_time()
            for n in range(args.runs):
                client.enqueue(
                    {"workflow_name": WORKFLOW_NAME, "queue_name": QUEUE_NAME}, args.steps, n
                )
            enqueue_cpu = time.process_time() - enqueue_cpu
            polls = wait_ended(conn, args.runs, deadline)
            wall = time.monotonic() - began
            cpu_after = {p.pid: process_cpu(p.pid) for p in executors}
            backends = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND (application_name = 'dbos_transact_client' OR pid = pg_backend_pid())"
                )
            ]
            if stdin is not None:
                emit({"event": "done", "excluded_backends": backends})
                stdin.readline(deadline, "the end of the sampling on stdin")
            result = summarize(conn, args)
        # A backend reports its commits to pg_stat_database at most once a second, and
        # at its exit: so the count is read once every backend of the burst has gone.
        stop_executors(executors)
        client.destroy()
        time.sleep(0.5)
        with psycopg.connect(args.database_url, autocommit=True, connect_timeout=10) as conn:
            # The poller's own statements are this script's, not DBOS's: the two of the
            # first reading, the polls, the backends' list and summarize's two.
            commits = xact_commit(conn) - commits_before - (2 + polls + 1 + 2)
    finally:
        stop_executors(executors)
        with contextlib.suppress(Exception):
            client.destroy()
    steps = args.runs * args.steps
    worker_cpu = sum(cpu_after[pid] - cpu_before[pid] for pid in cpu_before)
    return {
        "dbos_version": DBOS_VERSION,
        "database": database,
        "concurrency": args.concurrency,
        "processes": args.processes,
        "worker_concurrency": worker_concurrency,
        "polling_interval_sec": args.poll,
        "runs": args.runs,
        "steps": steps,
        **result,
        "steps_per_second": steps / result["seconds"],
        "wall_seconds": wall,
        "worker_cpu_seconds": worker_cpu,
        "worker_cpu_seconds_per_step": worker_cpu / steps,
        "commits_per_step": commits / steps,
        "enqueue_cpu_seconds_per_run": enqueue_cpu / args.runs,
        "excluded_backends": backends,
    }


def summarize(conn: psycopg.Connection[Any], args: argparse.Namespace) -> dict[str, Any]:
    """The burst's window and queue latencies, from DBOS's own stamps; checks every step ran."""
    rows = conn.execute(
        "SELECT status, created_at, started_at_epoch_ms, completed_at, updated_at "
        "FROM dbos.workflow_status WHERE queue_name = %s",
        [QUEUE_NAME],
    ).fetchall()
    failed = [row for row in rows if row[0] != "SUCCESS"]
    if len(rows) != args.runs or failed:
        raise BenchError(f"{len(failed)} of {len(rows)} workflow(s) did not succeed")
    outputs = conn.execute(
        "SELECT count(*) FROM dbos.operation_outputs WHERE function_name LIKE %s",
        ["%noop%"],
    ).fetchone()
    if outputs is None or outputs[0] != args.runs * args.steps:
        raise BenchError(f"{outputs} step outputs recorded, not {args.runs * args.steps}")
    start = min(row[1] for row in rows)
    end = max(row[3] if row[3] is not None else row[4] for row in rows)
    latencies = [(row[2] - row[1]) / 1000 for row in rows if row[2] is not None]
    return {
        "seconds": (end - start) / 1000,
        "queue_latency_p50_ms": percentile(latencies, 50) * 1000,
        "queue_latency_p95_ms": percentile(latencies, 95) * 1000,
        "queue_latency_mean_ms": statistics.fmean(latencies) * 1000,
        "queue_latencies_ms": [round(x * 1000, 1) for x in latencies],
    }


def _version() -> str:
    from importlib.metadata import version

    return version("dbos")


DBOS_VERSION = _version()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DBOS_BENCH_DATABASE_URL", DEFAULT_URL),
        help=f"DBOS's system database, its name containing 'bench' (default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="workflows run at once, all executors"
    )
    parser.add_argument("--processes", type=int, default=1, help="executor processes")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--poll", type=float, default=0.1, help="the queue's polling_interval_sec (default 0.1)"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for everything")
    parser.add_argument("--handshake", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--executor", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.executor:
        return executor(args)
    if args.concurrency < 1 or args.processes < 1 or args.runs < 1 or args.steps < 1:
        parser.error("--concurrency, --processes, --runs and --steps must be at least 1")

    def timed_out(signum: int, frame: object) -> None:
        raise BenchError(f"timed out after --timeout {args.timeout:g} s")

    # The deadline is checked wherever this script waits; the alarm bounds the rest (a
    # statement that blocks, an enqueue that hangs) a little later.
    signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(int(args.timeout) + 5)
    try:
        result = coordinate(args)
    except BenchError as exc:
        log(f"error: {exc}")
        return 2
    finally:
        signal.alarm(0)
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
