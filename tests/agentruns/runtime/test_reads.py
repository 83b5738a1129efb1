"""The worker's compiled reads give the same models as the ORM, on either database."""

from __future__ import annotations

import uuid

import pytest
from django.db.models import Count

from agentruns.models import Run, Step
from agentruns.runtime.reads import compiled_read
from agentruns.runtime.store import Store

pytestmark = pytest.mark.django_db(transaction=True)


def _fields(instance) -> dict:
    return {
        field.attname: getattr(instance, field.attname)
        for field in type(instance)._meta.concrete_fields
    }


def test_the_run_and_its_steps_read_as_the_orm_reads_them(harness, provider):
    run = harness.start("flow")
    assert harness.advance(run) == "finished:completed"
    store = Store()

    read = store.run_read(run.id)
    assert type(read) is Run
    assert _fields(read) == _fields(Run.objects.get(pk=run.id))
    # Typed as the model holds them: a UUID key, aware timestamps, JSON decoded.
    assert isinstance(read.id, uuid.UUID)
    assert read.finished_at is not None and read.finished_at.tzinfo is not None
    assert isinstance(read.input, dict)

    steps = store.steps_read(run.id)
    expected = list(Step.objects.filter(run_id=run.id))
    assert len(steps) == len(expected) > 0
    assert sorted(map(_fields, steps), key=lambda s: s["seq"]) == sorted(
        map(_fields, expected), key=lambda s: s["seq"]
    )
    # Loaded from the database, as the ORM's would be: saving one updates, not inserts.
    assert all(not step._state.adding for step in steps)


def test_a_run_that_is_not_there_reads_as_none(harness):
    assert Store().run_read(uuid.uuid4()) is None
    assert Store().steps_read(uuid.uuid4()) == []


def test_a_read_that_is_not_one_models_columns_by_run_id_is_refused():
    with pytest.raises(ValueError, match="run id once"):
        compiled_read("no_run_id", lambda run_id: Run.objects.filter(status="queued"), "default")
    with pytest.raises(ValueError, match="one model's columns"):
        compiled_read(
            "annotated",
            lambda run_id: Run.objects.filter(pk=run_id).annotate(n=Count("steps")),
            "default",
        )
