"""The management commands: startrun, showrun, sweep, advancerun."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agentruns.models import Run

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _call(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def test_startrun_prints_the_run_id_and_the_same_id_for_a_repeated_request(tenant):
    first = _call(
        "startrun", "order_status", "--input", '{"order_id": "A-1001"}', "--request-id", "r-1"
    )
    again = _call(
        "startrun", "order_status", "--input", '{"order_id": "A-1001"}', "--request-id", "r-1"
    )
    assert first == again
    run = Run.objects.get(pk=first)
    assert run.request_id == "r-1" and run.requested_by == "cli"
    assert run.enqueued_at is not None


def test_startrun_refuses_a_conflicting_request_id(tenant):
    _call("startrun", "order_status", "--input", '{"order_id": "A-1001"}', "--request-id", "r")
    with pytest.raises(CommandError, match="already used"):
        _call("startrun", "order_status", "--input", '{"order_id": "A-1002"}', "--request-id", "r")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input", "{not json"], "--input is not valid JSON"),
        (["--input", '{"follow_up_seconds": -1}'], "invalid input: follow_up_seconds"),
        (["--tenant", "nobody"], "no tenant with slug 'nobody'"),
    ],
)
def test_startrun_explains_bad_input(tenant, args, message):
    with pytest.raises(CommandError, match=message):
        _call("startrun", "order_status", *args)


def test_startrun_refuses_an_unknown_agent(tenant):
    with pytest.raises(CommandError, match="no agent named 'nope'"):
        _call("startrun", "nope")


def test_advancerun_and_showrun_drive_and_describe_a_run(tenant):
    run_id = _call(
        "startrun", "order_status", "--input", '{"order_id": "A-1001", "follow_up_seconds": 0}'
    )
    assert _call("advancerun", run_id) == "finished:completed"
    shown = json.loads(_call("showrun", run_id))
    assert shown["status"] == "completed"
    # The run page's and the API's step fields too (agentruns.selectors.run_step_rows).
    assert {"in_flight", "may_land_until", "approval_id", "case_id"} <= set(shown["steps"][1])
    assert shown["steps"][1]["in_flight"] is False and shown["steps"][1]["case_id"] is None
    assert [s["step_id"] for s in shown["steps"]] == [
        "0000.model.chat",
        "0001.tool.order_status",
        "0002.model.chat",
        "0003.tool.order_status",
    ]


def test_showrun_explains_an_unknown_run(tenant):
    with pytest.raises(CommandError, match="no run 'nope'"):
        _call("showrun", "nope")


def test_sweep_once_reports_what_it_did(tenant):
    assert _call("sweep") == "woke 0, recovered 0, requeued 0, orphaned 0"


def test_the_worker_task_advances_a_run(tenant):
    from agentruns.tasks import advance_run

    run_id = _call(
        "startrun", "order_status", "--input", '{"order_id": "A-1002", "follow_up_seconds": 30}'
    )
    assert advance_run(run_id) == "suspended:sleeping"
    assert advance_run(run_id) == "not_claimed"


def test_a_run_is_started_even_when_the_queue_cannot_take_the_wake_up(tenant, monkeypatch):
    def queue_locked(run_id):
        raise RuntimeError("database is locked")

    monkeypatch.setattr("agentruns.sweeper.push_advance", queue_locked)
    run_id = _call("startrun", "order_status", "--input", '{"order_id": "A-1001"}')
    run = Run.objects.get(pk=run_id)
    assert run.status == "queued" and run.enqueued_at is not None
