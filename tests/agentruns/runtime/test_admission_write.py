"""Admission's write: the run, its "created" event and, on PostgreSQL, its first wake-up
in one statement; every column as the model would have saved it; a caller's
transaction rolled back takes all of it, and a repeated request id inside one leaves
that transaction usable."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django_q.conf import Conf
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from agentruns.models import Run, RunEvent
from agentruns.runtime import DuplicateActiveRun
from agentruns.runtime.inserts import insert_sql
from agentruns.services import run_start

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _start(tenant, request_id: str, **kwargs):
    return run_start(
        tenant=tenant,
        agent_name="order_status",
        input={"order_id": "ord_1001"},
        request_id=request_id,
        requested_by="user:ann",
        **kwargs,
    )


def _queued() -> list[dict]:
    return [SignedPackage.loads(row.payload) for row in OrmQ.objects.using(Conf.ORM).all()]


def test_every_column_of_the_run_is_written_as_the_model_holds_it(tenant):
    run, created = _start(tenant, "write-1")
    assert created
    stored = Run.objects.get(pk=run.pk)
    for field in Run._meta.concrete_fields:
        if field.name == "enqueued_at":
            continue  # the database's clock, compared below
        assert getattr(stored, field.attname) == getattr(run, field.attname), field.name
    assert stored.enqueued_at is not None
    assert run.enqueued_at == stored.enqueued_at  # read on first use, not before
    # A later save of the same object updates the row it wrote.
    run.requested_by = "user:bob"
    run.save(update_fields=["requested_by"])
    assert Run.objects.filter(pk=run.pk).values_list("requested_by", flat=True).get() == (
        "user:bob"
    )


def test_the_created_event_is_written_with_the_run(tenant):
    run, _ = _start(tenant, "write-2")
    event = RunEvent.objects.get(run_id=run.pk)
    assert (event.type, event.state_version, event.payload) == (
        "created",
        0,
        {"by": "user:ann"},
    )


def test_the_first_wake_up_is_one_advance_task_for_the_run(tenant):
    run, _ = _start(tenant, "write-3")
    tasks = _queued()
    assert [(task["func"], task["args"], task["group"]) for task in tasks] == [
        ("agentruns.tasks.advance_run", (str(run.id),), "advance_run")
    ]


def test_a_caller_rolling_back_takes_the_run_its_event_and_its_wake_up(tenant):
    # PostgreSQL: the queue row was in the run's own statement. SQLite: the enqueue
    # waited for a commit that never came.
    with pytest.raises(RuntimeError), transaction.atomic():
        _start(tenant, "write-4")
        raise RuntimeError("the caller changed its mind")
    assert not Run.objects.filter(request_id="write-4").exists()
    assert not RunEvent.objects.exists()
    assert _queued() == []


def test_a_refused_insert_inside_a_callers_transaction_leaves_it_usable(tenant):
    first, _ = _start(tenant, "write-5", dedupe_key="order-ord_1001")
    with transaction.atomic():
        # Another request id with the same dedupe key: the INSERT itself is refused.
        with pytest.raises(DuplicateActiveRun):
            _start(tenant, "write-5b", dedupe_key="order-ord_1001")
        # It rolled back to its savepoint only: the caller's transaction goes on.
        assert Run.objects.filter(dedupe_key="order-ord_1001").count() == 1
        again, created = _start(tenant, "write-5")
    assert (again.id, created) == (first.id, False)
    assert not Run.objects.filter(request_id="write-5b").exists()
    assert len(_queued()) == 1


def test_an_insert_leaves_out_only_a_database_made_id(tenant):
    run, _ = _start(tenant, "write-6")
    run_sql, run_params = insert_sql(Run(tenant=tenant, agent_name="x"), connection)
    event_sql, event_params = insert_sql(RunEvent(run=run, type="t", state_version=1), connection)
    run_columns = {field.column for field in Run._meta.concrete_fields}
    named = run_sql.split("(", 1)[1].split(")", 1)[0].split(", ")
    assert {name.strip('"') for name in named} == run_columns
    assert run_sql.count("%s") == len(run_params) == len(run_columns)  # no expression here
    assert '"id"' in run_sql  # a run's id is its own UUID
    assert '"id"' not in event_sql.split("VALUES")[0]  # an event's is the database's
    assert len(event_params) == len(RunEvent._meta.concrete_fields) - 1


def test_each_value_is_written_as_djangos_own_preparation_makes_it(tenant):
    from agentruns.models import RunStatus

    run = Run(
        tenant=tenant,
        agent_name="order_status",
        agent_version=3,
        status=RunStatus.RUNNING,  # a str subclass: prepared by Django, not as given
        input={"order_id": "ord_1001"},
        request_id="as-given",
        dedupe_key=None,
        retried=True,
        cost_micros=1_250_000,
    )
    _, params = insert_sql(run, connection)
    fields = [f for f in Run._meta.local_concrete_fields if not getattr(f, "generated", False)]
    expected = [
        field.get_db_prep_save(field.pre_save(run, add=True), connection=connection)
        for field in fields
    ]
    assert len(params) == len(expected)
    for field, written, prepared in zip(fields, params, expected, strict=True):
        assert type(written) is type(prepared), field.name  # Int4, Jsonb: as Django wraps
        # A JSON wrapper compares by what it holds.
        assert getattr(written, "obj", written) == getattr(prepared, "obj", prepared), field.name
