"""DESIGN §12.1: a worker that stalls between clearing a send and sending it never sends.

The first worker (``advancerun``) marks the charge running and then stops
itself with SIGSTOP. Its lease runs out; a second worker takes the run over and
completes it. When the first worker is resumed it must notice it no longer may
send: the provider's ledger shows exactly one charge, made by the second worker.
"""

from __future__ import annotations

import signal

import pytest

from tests.crash.agents import CHARGE_ARGS
from tests.crash.harness import CrashWorld, process_state

pytestmark = pytest.mark.crash


def test_a_worker_paused_past_its_lease_after_clearing_a_charge_never_sends_it(
    world: CrashWorld,
) -> None:
    # No cluster runs: the two advancerun processes are the only workers.
    run_id = world.startrun({"scenario": "charge"})
    paused = world.start(
        "advancerun-paused", "advancerun", run_id, faults="after_step_running@charge=stop"
    )

    def stopped() -> bool:
        state = process_state(paused.pid)
        if state is None or paused.popen.poll() is not None:
            pytest.fail(f"the first worker exited instead of stopping\n{world.diagnostics()}")
        return state == "T"

    world.wait_until(stopped, "the first worker to stop itself after clearing the charge")
    steps = {s["step_id"]: s for s in world.db.steps(run_id)}
    assert steps["0002.tool.charge"]["status"] == "running", world.diagnostics()
    assert world.ledger.charges() == [], world.diagnostics()

    # The claim compares lease expiry with the database's clock; so does this wait.
    world.wait_until(lambda: world.db.lease_expired(run_id), "the paused worker's lease to lapse")
    second = world.start("advancerun-second", "advancerun", run_id)
    assert world.wait_exit(second) == 0, world.diagnostics()
    assert second.output().strip() == "finished:completed", world.diagnostics()
    assert world.db.run(run_id)["status"] == "completed", world.diagnostics()

    paused.popen.send_signal(signal.SIGCONT)
    assert world.wait_exit(paused) == 0, world.diagnostics()
    # It woke up past its send budget: it stopped without sending.
    assert paused.output().strip() == "lease_lost", world.diagnostics()

    charges = world.ledger.charges()
    assert len(charges) == 1, world.diagnostics()
    executions = world.ledger.executions("charge")
    assert len(executions) == 1, world.diagnostics()
    assert executions[0]["pid"] == second.pid, world.diagnostics()
    assert executions[0]["outcome"] == "created", world.diagnostics()
    assert charges[0]["pid"] == second.pid, world.diagnostics()
    assert charges[0]["amount"] == CHARGE_ARGS["amount"], world.diagnostics()

    run = world.db.run(run_id)
    assert run["status"] == "completed", world.diagnostics()
    charge_step = {s["step_id"]: s for s in world.db.steps(run_id)}["0002.tool.charge"]
    assert charge_step["status"] == "succeeded", world.diagnostics()
    assert charge_step["provider_reference"] == charges[0]["charge_id"], world.diagnostics()
