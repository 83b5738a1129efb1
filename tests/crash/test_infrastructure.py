"""The infrastructure fails around the workers: PostgreSQL restarts under load, a
worker cluster is told to stop mid-run, every process is restarted one at a time.

Judged as the other crash tests are: by the engine's tables read from outside and
by the sandbox's own records (one refund per run, counted by effect key), never by
our logs. No person steps in: every run must end on its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter

import pytest
from django.db import connections

from tests.crash.harness import (
    DEADLINE_SECONDS,
    NEEDS_A_PERSON,
    POLL_SECONDS,
    TERMINAL,
    CrashWorld,
    RefundWorld,
    group_members,
)

pytestmark = pytest.mark.crash

# These scenarios are about the processes and what surrounds them, not the engine's
# SQL: they run once, against the production database, to keep CI within its time.
on_postgresql = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL"), reason="an infrastructure scenario: run on PostgreSQL"
)

ORDERS = ["ord_1001", "ord_1002", "ord_1003", "ord_1005", "ord_1006"]
# Two 7.00 EUR refunds per order: ten runs in flight, enough for every phase.
RUNS_PER_ORDER = 2


def _postgres_cluster() -> list[str] | None:
    """The pg_ctlcluster command for the local server the tests use, or None."""
    url = os.environ.get("DATABASE_URL", "")
    if not url or not shutil.which("pg_ctlcluster") or os.geteuid() != 0:
        return None
    if "127.0.0.1" not in url and "localhost" not in url:
        return None
    listing = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=False
    )
    for line in listing.stdout.splitlines():
        version, name, port, status, *_ = line.split()
        if port == "5432" and status == "online":
            return ["pg_ctlcluster", "--skip-systemctl-redirect", version, name]
    return None


def _start_runs(refunds: RefundWorld, count_per_order: int) -> list[str]:
    """Start the runs side by side (one startrun process each)."""
    procs = []
    for order_id in ORDERS:
        for _ in range(count_per_order):
            run_input = {"order_id": order_id, "amount": 700, "email_customer": False}
            procs.append(
                refunds.world.start(
                    "startrun", "startrun", "refund_support", "--input", json.dumps(run_input)
                )
            )
    run_ids = []
    for proc in procs:
        refunds.world.wait_exit(proc)
        assert proc.popen.returncode == 0, refunds.explain()
        run_ids.append(proc.output().strip().splitlines()[-1])
    refunds.run_ids.extend(run_ids)
    return run_ids


def _all_settled(refunds: RefundWorld, run_ids: list[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        statuses = {run_id: refunds.world.db.run(run_id)["status"] for run_id in run_ids}
        if all(status in TERMINAL | NEEDS_A_PERSON for status in statuses.values()):
            return statuses
        if time.monotonic() > deadline:
            pytest.fail(f"runs not settled after {timeout}s: {statuses}\n{refunds.explain()}")
        time.sleep(POLL_SECONDS * 4)


def _one_refund_per_run(refunds: RefundWorld, run_ids: list[str]) -> None:
    """Every run completed and refunded, exactly once at the provider, by its own key."""
    by_key = refunds.stats()["refunds"]["by_idempotency_key"]
    for run_id in run_ids:
        step = refunds.tool_steps(run_id)["issue_refund"]
        assert step["status"] == "succeeded", refunds.explain()
        assert by_key.get(step["effect_key"]) == 1, (step["effect_key"], refunds.explain())
    assert refunds.stats()["refunds"]["total"] == len(run_ids), refunds.explain()


def _exited(*procs) -> list[str]:
    return [proc.name for proc in procs if proc.popen.poll() is not None]


@pytest.mark.restarts_servers
def test_postgresql_restarted_under_load_loses_no_run_and_repeats_no_refund(refunds):
    cluster = _postgres_cluster()
    if cluster is None:
        pytest.skip("needs the local PostgreSQL server, pg_ctlcluster and root")
    world = refunds.world
    world.env["HOLDFAST_WORKERS"] = "2"
    workers = [world.start_cluster("qcluster-a"), world.start_cluster("qcluster-b")]
    sweepers = [world.start_sweeper(), world.start_sweeper()]
    # Refunds answer slowly, so some are in flight when the server goes.
    refunds.sandbox.arm("delay", delay=0.8, count=len(ORDERS) * RUNS_PER_ORDER)
    run_ids = _start_runs(refunds, RUNS_PER_ORDER)

    def in_flight() -> bool:
        return any(
            step["name"] == "issue_refund" and step["status"] == "running"
            for run_id in run_ids
            for step in world.db.steps(run_id)
        )

    world.wait_until(in_flight, "a refund in flight")
    restarted = subprocess.run([*cluster, "restart"], capture_output=True, text=True, timeout=60)
    assert restarted.returncode == 0, restarted.stderr
    # This test's own connections were cut too.
    connections.close_all()

    statuses = _all_settled(refunds, run_ids, timeout=DEADLINE_SECONDS * 2)
    assert Counter(statuses.values()) == {"completed": len(run_ids)}, refunds.explain()
    _one_refund_per_run(refunds, run_ids)
    # Every process outlived the restart: none exited, none needed a person.
    assert _exited(*workers, *sweepers) == [], refunds.explain()
    for sweeper in sweepers:
        assert "Traceback" not in sweeper.stderr_path.read_text(errors="replace"), sweeper.tail()


def _claims(world: CrashWorld, run_id: str) -> list[dict]:
    return [event for event in world.db.events(run_id) if event["type"] == "claimed"]


def _owner_pid(event: dict) -> int:
    payload = event["payload"]
    if isinstance(payload, str):
        payload = json.loads(payload)
    return int(payload["owner"].split(":")[1])


def test_sigterm_hands_the_run_to_the_other_cluster_within_two_seconds(world):
    world.env["HOLDFAST_AGENT_MODULES"] = "tests.crash.agents"
    first = world.start_cluster("qcluster-first")
    # Long enough to be mid-run whenever the second cluster is up, on a busy machine too.
    run_id = world.startrun({"steps": 40, "seconds": 0.3}, agent="plodder")
    world.wait_until(lambda: len(world.ledger.executions("slow_note")) >= 2, "the run two steps in")
    second = world.start_cluster("qcluster-second")
    world.wait_until(
        lambda: "ready for work" in second.stderr_path.read_text(), "the second cluster up"
    )
    first_pids = set(group_members(first.pid))
    stopped_at = time.monotonic()
    os.killpg(first.pid, signal.SIGTERM)  # as honcho and systemd stop a cluster

    def taken_over() -> bool:
        return any(_owner_pid(event) not in first_pids for event in _claims(world, run_id))

    world.wait_until(taken_over, "another cluster to claim the run", timeout=10)
    took = time.monotonic() - stopped_at
    assert took < 2.0, f"took {took:.1f} s\n{world.diagnostics()}"
    world.wait_group_gone(first, timeout=6)
    world.wait_for_status(run_id, "completed")
    # Every step read once: the one in flight finished before the run was handed back.
    notes = Counter(json.loads(row["args"])["n"] for row in world.ledger.executions("slow_note"))
    assert notes == dict.fromkeys(range(40), 1), world.diagnostics()
    stopping = first.stdout_path.read_text() + first.stderr_path.read_text()
    assert "handing the run back" in stopping or "stopping (idle)" in stopping, first.tail()
    assert second.popen.poll() is None


@on_postgresql
def test_a_rolling_restart_of_every_process_loses_nothing_and_repeats_nothing(refunds):
    world = refunds.world
    processes = {
        "cluster-a": lambda: world.start_cluster("qcluster-a"),
        "cluster-b": lambda: world.start_cluster("qcluster-b"),
        "sweeper-a": world.start_sweeper,
        "sweeper-b": world.start_sweeper,
    }
    running = {name: start() for name, start in processes.items()}
    refunds.sandbox.arm("delay", delay=0.5, count=len(ORDERS))
    run_ids = _start_runs(refunds, 1)
    # A deploy: each process stopped (SIGTERM to its group) and started again, in turn.
    for name, start in processes.items():
        proc = running[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        world.wait_group_gone(proc, timeout=10)
        running[name] = start()
        time.sleep(0.5)
    statuses = _all_settled(refunds, run_ids, timeout=DEADLINE_SECONDS * 2)
    assert Counter(statuses.values()) == {"completed": len(run_ids)}, refunds.explain()
    _one_refund_per_run(refunds, run_ids)


@on_postgresql
def test_a_provider_refusing_connections_for_30_seconds_delays_runs_and_repeats_nothing(
    refunds,
):
    world = refunds.world
    cluster, sweeper = world.start_cluster("qcluster"), world.start_sweeper()
    # The sandbox closes its listening socket: every call is refused, none is sent.
    refunds.sandbox.arm("refuse", path="/", method="", delay=30)
    outage_began = time.monotonic()
    run_ids = _start_runs(refunds, 1)
    statuses = _all_settled(refunds, run_ids, timeout=DEADLINE_SECONDS * 2)
    assert time.monotonic() - outage_began >= 30
    assert Counter(statuses.values()) == {"completed": len(run_ids)}, refunds.explain()
    _one_refund_per_run(refunds, run_ids)
    # Waited out as "unreachable": never an unknown effect, never a person.
    for run_id in run_ids:
        refund = refunds.tool_steps(run_id)["issue_refund"]
        assert refund["ambiguous_attempts"] == 0, refunds.explain()
    assert _exited(cluster, sweeper) == []


def _redis(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)


@on_postgresql
@pytest.mark.restarts_servers
def test_redis_restarted_under_load_costs_only_pokes(refunds):
    if not shutil.which("redis-server") or _redis("redis-cli", "ping").stdout.strip() != "PONG":
        pytest.skip("needs the local Redis server")
    world = refunds.world
    world.env["REDIS_URL"] = "redis://127.0.0.1:6379/0"
    cluster, sweeper = world.start_cluster("qcluster"), world.start_sweeper()
    refunds.sandbox.arm("delay", delay=0.5, count=len(ORDERS))
    run_ids = _start_runs(refunds, 1)
    _redis("redis-cli", "shutdown", "nosave")
    try:
        time.sleep(3.0)
    finally:
        started = _redis(
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
        assert started.returncode == 0, started.stderr
    statuses = _all_settled(refunds, run_ids, timeout=DEADLINE_SECONDS)
    assert Counter(statuses.values()) == {"completed": len(run_ids)}, refunds.explain()
    _one_refund_per_run(refunds, run_ids)
    assert _exited(cluster, sweeper) == []
    log = cluster.stderr_path.read_text(errors="replace")
    assert "Traceback" not in log, cluster.tail()
