"""What a run's end and its admission leave out when there is nothing to do: no
approval withdrawal without an effect step, no refusal lookup without a failed one,
no read of a request id admission made itself, a tool's schema built once."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pydantic import BaseModel

from agentruns.models import Run, RunStatus
from agentruns.runtime import READ_ONLY, start_run, tool
from agentruns.runtime.raw_connection import RawConnection
from approvals.gate import DatabaseApprovalGate

# The engine's transitions refuse to run inside a test's transaction.
pytestmark = pytest.mark.django_db(transaction=True)


class RecordingGate(DatabaseApprovalGate):
    def __init__(self):
        self.withdrawn: list[str] = []

    def withdraw(self, run_id: str, reason: str) -> None:
        self.withdrawn.append(run_id)
        super().withdraw(run_id, reason)


def test_a_run_without_effect_steps_ends_without_asking_the_gate_to_withdraw(harness):
    gate = RecordingGate()
    engine = harness.build(approvals=gate)
    run = harness.start("values")
    assert engine.advance(run.id) == f"finished:{RunStatus.COMPLETED}"
    assert gate.withdrawn == []


def test_a_run_with_an_effect_step_still_has_its_approvals_withdrawn_at_its_end(harness, provider):
    gate = RecordingGate()
    engine = harness.build(approvals=gate)
    run = harness.start("flow", {"order_id": "o-1"})
    assert engine.advance(run.id) == f"finished:{RunStatus.COMPLETED}"
    assert gate.withdrawn == [str(run.id)]


def test_a_refused_effect_still_names_the_outcome(harness, provider):
    provider.script["charge"] = ["refuse"]
    run = harness.start("flow", {"order_id": "o-1"})
    harness.advance(run)
    run.refresh_from_db()
    assert run.outcome_code == "charge_refused"
    assert run.outcome_detail == "amount exceeds the remaining balance"


def test_admission_reads_nothing_back_for_a_request_id_it_made(harness):
    with CaptureQueriesContext(connection) as queries:
        run, created = start_run(
            registry=harness.registry,
            tenant=harness.tenant,
            agent_name="values",
            input={},
            enqueue=harness.enqueued.append,
        )
    assert created
    selects = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]
    assert selects == []
    # The database's enqueue stamp is read when first asked for.
    stored = Run.objects.values_list("enqueued_at", flat=True).get(pk=run.pk)
    assert stored is not None
    assert run.enqueued_at == stored


class PingArgs(BaseModel):
    n: int


def _ping(request, call):
    return request


@pytest.mark.django_db(transaction=False)
def test_a_tools_schema_is_built_once_and_follows_its_description():
    first = tool(name="ping_once", args=PingArgs, description="Ping.", recovery=READ_ONLY)(_ping)
    snapshot = first.snapshot()
    assert snapshot["schema"]["function"]["parameters"] == PingArgs.model_json_schema()
    # Each caller gets its own copy: changing one changes no other run's snapshot.
    snapshot["schema"]["function"]["name"] = "changed"
    assert first.snapshot()["schema"]["function"]["name"] == "ping_once"
    other = tool(name="ping_once", args=PingArgs, description="Pong.", recovery=READ_ONLY)(_ping)
    assert other.json_schema()["function"]["description"] == "Pong."
    assert other.snapshot()["schema_hash"] != snapshot["schema_hash"]


def test_a_run_without_effects_reads_the_run_once_and_its_steps_once(harness, monkeypatch):
    """The read before the claim is the run (the claim returns what it changed), the
    replay's load is the steps, and an end without effect steps reads no more."""
    run = harness.start("values")
    # The Store's reads go to the raw connection (prepared), the rest through Django's.
    store_reads: list[str] = []
    fetch_all = RawConnection.fetch_all

    def recording(self, sql, params):
        store_reads.append(sql)
        return fetch_all(self, sql, params)

    monkeypatch.setattr(RawConnection, "fetch_all", recording)
    with CaptureQueriesContext(connection) as queries:
        assert harness.advance(run) == f"finished:{RunStatus.COMPLETED}"
    reads = [q["sql"] for q in queries if q["sql"].lstrip().upper().startswith("SELECT")]
    reads += store_reads
    assert len([sql for sql in reads if 'FROM "agentruns_run"' in sql]) == 1
    assert len([sql for sql in reads if 'FROM "agentruns_step"' in sql]) == 1
