"""Two hosts against one database: one dies whole, the other carries on alone.

A host is a worker cluster and a sweeper in one process group, named by
``HOLDFAST_HOST_ID`` in every lease it takes. Killing the group with SIGKILL is a
machine that loses power: nothing of it hands anything back. Judged by the engine's
tables read from outside and by the sandbox's own records (one refund per run,
counted by effect key).
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter

import pytest

from tests.crash.harness import DEADLINE_SECONDS, CrashWorld, RefundWorld
from tests.crash.test_infrastructure import ORDERS, _all_settled, _one_refund_per_run

pytestmark = pytest.mark.crash

# Runs for the host killed to hold mid-step (two workers per host), few enough that
# starting them (a process each) stays short on two busy cores.
RUNS = 3
# The sweeper's lease lives 4 sweep intervals, at least 5 s (agentruns.sweeper.sweep);
# the crash tests sweep every 0.2 s.
SWEEPER_LEASE_SECONDS = 5.0


def _lease_holder(world: CrashWorld) -> str | None:
    """The host whose sweeper holds the lease now, by the database's own rows."""
    rows = world.db.query("SELECT owner FROM agentruns_sweeperlease WHERE name = 'sweeper'")
    if not rows or not rows[0]["owner"]:
        return None
    return rows[0]["owner"].split(":")[0]


def _held_by(world: CrashWorld, run_ids: list[str], host: str) -> list[str]:
    """The runs the host's workers hold mid-step now."""
    runs = {run_id: world.db.run(run_id) for run_id in run_ids}
    return [
        run_id
        for run_id, run in runs.items()
        if run["status"] == "running" and (run["lease_owner"] or "").startswith(f"{host}:")
    ]


def _claimed_by(world: CrashWorld, run_id: str) -> list[str]:
    """The hosts that claimed the run, in order."""
    hosts = []
    for event in world.db.events(run_id):
        if event["type"] != "claimed":
            continue
        payload = event["payload"]
        if isinstance(payload, str):
            payload = json.loads(payload)
        hosts.append(payload["owner"].split(":")[0])
    return hosts


def _start_runs(refunds: RefundWorld) -> list[str]:
    """Start one 7.00 EUR refund run per order, side by side (one startrun process each)."""
    procs = [
        refunds.world.start(
            "startrun",
            "startrun",
            "refund_support",
            "--input",
            json.dumps({"order_id": order_id, "amount": 700, "email_customer": False}),
        )
        for order_id in ORDERS[:RUNS]
    ]
    run_ids = []
    for proc in procs:
        refunds.world.wait_exit(proc)
        assert proc.popen.returncode == 0, refunds.explain()
        run_ids.append(proc.output().strip().splitlines()[-1])
    refunds.run_ids.extend(run_ids)
    return run_ids


def test_a_host_killed_whole_leaves_its_runs_and_the_sweepers_lease_to_the_other(
    refunds: RefundWorld,
):
    world = refunds.world
    world.env["HOLDFAST_WORKERS"] = "2"
    host_a = world.start_host("host-a")
    world.wait_until(lambda: _lease_holder(world) == "host-a", "host-a's sweeper to sweep")
    host_b = world.start_host("host-b")
    world.wait_until(
        lambda: "ready for work" in host_b.stderr_path.read_text(errors="replace"),
        "host-b's cluster up",
    )
    assert _lease_holder(world) == "host-a"  # host-b's sweeper waits as the standby
    # host-b paused while the runs start, so host-a surely holds some when it dies.
    os.killpg(host_b.pid, signal.SIGSTOP)
    try:
        # Refunds answer slowly, so host-a is mid-call on some run when it dies.
        refunds.sandbox.arm("delay", delay=1.0, count=RUNS)
        run_ids = _start_runs(refunds)
        orphaned = world.wait_until(lambda: _held_by(world, run_ids, "host-a"), "host-a mid-run")
    finally:
        os.killpg(host_b.pid, signal.SIGCONT)
    world.kill_group(host_a)
    world.wait_group_gone(host_a, timeout=10)

    # The standby takes the lease once host-a's lapses: within its time to live (with
    # room for a busy machine), not at once, since nothing handed it over.
    world.wait_until(
        lambda: _lease_holder(world) == "host-b",
        "host-b's sweeper to take the lease",
        timeout=SWEEPER_LEASE_SECONDS + 10,
    )
    statuses = _all_settled(refunds, run_ids, timeout=DEADLINE_SECONDS)
    assert Counter(statuses.values()) == {"completed": len(run_ids)}, refunds.explain()
    _one_refund_per_run(refunds, run_ids)
    # What host-a held, host-b's workers finished: the last claim of each is theirs.
    for run_id in orphaned:
        hosts = _claimed_by(world, run_id)
        assert "host-a" in hosts and hosts[-1] == "host-b", (hosts, refunds.explain())
    assert host_b.popen.poll() is None, refunds.explain()
