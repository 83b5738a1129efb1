"""A worker cluster SIGKILLed at each named fault point: the run finishes, no effect twice.

Each test starts a real ``qcluster`` armed with ``HOLDFAST_FAULTS=<point>@<tool>=killgroup``
(the worker kills its whole process group when it reaches the point), starts a
run, waits for the cluster to die, then starts a clean cluster and the sweeper
and checks the outcome against the provider's own ledger.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.crash.agents import CHARGE_ARGS, EMAIL_ARGS, INTRO_NOTE, RECEIPT_NOTE
from tests.crash.harness import TERMINAL, CrashWorld

pytestmark = pytest.mark.crash


def _compact(args: dict[str, Any]) -> str:
    """Arguments as the ledger records them."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"))


READ_INTRO = ("read_note", _compact(INTRO_NOTE))
READ_RECEIPT = ("read_note", _compact(RECEIPT_NOTE))
FIRST_CHAT = ("chat", _compact({"turn": 0}))
CHARGE_JSON = _compact(CHARGE_ARGS)


@dataclass(frozen=True)
class Kill:
    fault: str  # "<point>@<tool>"
    effect_tool: str  # the effect the model asks for in this run
    # Steps (step_id, status) recorded when the cluster died: proves where it died.
    recorded_at_kill: tuple[tuple[str, str], ...]
    # Effects that already existed at the provider when the cluster died.
    effects_at_kill: int
    # Bodies that run twice by design: the interrupted call was made again.
    ran_twice: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def scenario(self) -> str:
        return "charge_lookup_only" if self.effect_tool == "charge_lookup_only" else "charge"


READ = ("0000.tool.read_note", "succeeded")
CHAT = ("0001.model.chat", "succeeded")

KILLS = [
    # Nothing about the charge is on record yet: after the restart it is sent once.
    Kill("before_step_recorded@charge", "charge", (READ, CHAT), effects_at_kill=0),
    # Cleared to send (effect key committed) but never sent: the resend is the only send.
    Kill(
        "after_step_running@charge",
        "charge",
        (READ, CHAT, ("0002.tool.charge", "running")),
        effects_at_kill=0,
    ),
    # The charge happened and its answer was lost: the resend under the same
    # idempotency key gets the saved charge back, not a second one.
    Kill(
        "after_call_returned@charge",
        "charge",
        (READ, CHAT, ("0002.tool.charge", "running")),
        effects_at_kill=1,
        ran_twice=(("charge", CHARGE_JSON),),
    ),
    # The answer is on record: replay returns it without calling the provider.
    Kill(
        "after_result_recorded@charge",
        "charge",
        (READ, CHAT, ("0002.tool.charge", "succeeded")),
        effects_at_kill=1,
    ),
    # A read whose answer was lost is simply read again.
    Kill("after_call_returned@read_note", "charge", (), effects_at_kill=0, ran_twice=(READ_INTRO,)),
    # No idempotency at this provider, only a search: the lookup finds the charge
    # by the effect key in its metadata, and nothing is sent again.
    Kill(
        "after_call_returned@charge_lookup_only",
        "charge_lookup_only",
        (READ, CHAT, ("0002.tool.charge_lookup_only", "running")),
        effects_at_kill=1,
    ),
    # Cleared but never sent, at a provider without idempotency: the lookup,
    # made once the send budget has passed, finds nothing, and it is sent once.
    Kill(
        "after_step_running@charge_lookup_only",
        "charge_lookup_only",
        (READ, CHAT, ("0002.tool.charge_lookup_only", "running")),
        effects_at_kill=0,
    ),
    # A model answer that was never recorded is asked for again; the run records
    # one model step and one model call.
    Kill("after_call_returned@chat", "charge", (READ,), effects_at_kill=0, ran_twice=(FIRST_CHAT,)),
]


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _kill_cluster_at(world: CrashWorld, fault: str, run_input: dict[str, Any]) -> str:
    """Start a cluster armed to kill its group at ``fault``, start a run, wait for the death."""
    cluster = world.start_cluster("qcluster-armed", faults=f"{fault}=killgroup")
    run_id = world.startrun(run_input)
    world.wait_group_gone(cluster)
    return run_id


def _restart(world: CrashWorld) -> None:
    world.start_cluster("qcluster-clean")
    world.start_sweeper()


@pytest.mark.parametrize("kill", [pytest.param(k, id=k.fault) for k in KILLS])
def test_a_run_whose_cluster_is_killed_at_a_fault_point_completes_with_one_charge(
    world: CrashWorld, kill: Kill
) -> None:
    run_id = _kill_cluster_at(world, kill.fault, {"scenario": kill.scenario})

    killed = world.db.run(run_id)
    assert killed["status"] not in TERMINAL, world.diagnostics()
    recorded = tuple((s["step_id"], s["status"]) for s in world.db.steps(run_id))
    assert recorded == kill.recorded_at_kill, world.diagnostics()
    assert len(world.ledger.charges()) == kill.effects_at_kill, world.diagnostics()

    _restart(world)
    run = world.wait_for_status(run_id, "completed")

    # The provider's own records: one charge, and every body ran once except
    # the interrupted call that had to be made again.
    charges = world.ledger.charges()
    assert len(charges) == 1, world.diagnostics()
    expected_runs = Counter(
        {READ_INTRO: 1, FIRST_CHAT: 1, (kill.effect_tool, CHARGE_JSON): 1, READ_RECEIPT: 1}
    )
    for body in kill.ran_twice:
        expected_runs[body] = 2
    assert world.ledger.execution_counts() == expected_runs, world.diagnostics()
    created = [e for e in world.ledger.executions(kill.effect_tool) if e["outcome"] == "created"]
    assert len(created) == 1, world.diagnostics()

    # The engine's record agrees with the provider's.
    steps = world.db.steps(run_id)
    assert [(s["step_id"], s["status"]) for s in steps] == [
        ("0000.tool.read_note", "succeeded"),
        ("0001.model.chat", "succeeded"),
        (f"0002.tool.{kill.effect_tool}", "succeeded"),
        ("0003.tool.read_note", "succeeded"),
    ], world.diagnostics()
    effect_step = steps[2]
    assert effect_step["provider_reference"] == charges[0]["charge_id"], world.diagnostics()
    assert effect_step["effect_key"] == charges[0]["metadata_key"], world.diagnostics()
    assert run["model_calls_used"] == 1, world.diagnostics()
    output = _json(run["output"])
    assert output["effects"] == [
        {
            "ok": True,
            "result": {
                "id": charges[0]["charge_id"],
                "order_id": CHARGE_ARGS["order_id"],
                "amount": CHARGE_ARGS["amount"],
                "metadata": {"effect_key": effect_step["effect_key"]},
            },
        }
    ], world.diagnostics()


def test_an_email_whose_answer_was_lost_waits_for_an_operator_and_is_never_sent_twice(
    world: CrashWorld,
) -> None:
    run_id = _kill_cluster_at(world, "after_call_returned@send_email", {"scenario": "email"})
    assert world.db.run(run_id)["status"] not in TERMINAL, world.diagnostics()
    assert len(world.ledger.emails()) == 1, world.diagnostics()

    _restart(world)
    # SMTP has neither an idempotency key nor a lookup: only a person can tell.
    world.wait_for_status(run_id, "effect_unknown_reconciliation_required")

    assert len(world.ledger.emails()) == 1, world.diagnostics()
    assert world.ledger.execution_counts()[("send_email", _compact(EMAIL_ARGS))] == 1
    steps = {s["step_id"]: s for s in world.db.steps(run_id)}
    assert steps["0002.tool.send_email"]["status"] == "unknown", world.diagnostics()
    # The run stopped at the unknown effect: nothing after it ran.
    assert "0003.tool.read_note" not in steps, world.diagnostics()
    assert world.ledger.execution_counts()[READ_RECEIPT] == 0, world.diagnostics()
