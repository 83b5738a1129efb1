"""Admission is idempotent per (tenant, request_id); dedupe keys allow one active run."""

from __future__ import annotations

import pytest

from agentruns.models import Run
from agentruns.runtime import (
    AdmissionError,
    DuplicateActiveRun,
    InvalidRunInput,
    RequestConflict,
    start_run,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _start(harness, tenant=None, **kwargs):
    kwargs.setdefault("agent_name", "flow")
    kwargs.setdefault("input", {"order_id": "o-1"})
    return start_run(
        registry=harness.registry,
        tenant=tenant or harness.tenant,
        enqueue=harness.enqueued.append,
        **kwargs,
    )


def test_a_new_request_creates_a_run_and_enqueues_it_after_commit(harness):
    run, created = _start(harness, request_id="req-1")
    assert created
    assert harness.enqueued == [run.id]
    assert run.status == "queued"
    assert run.agent_version == 1
    assert run.agent_snapshot["tools"]["charge"]["recovery"]["idempotency_window_seconds"] == (
        86400
    )
    assert run.events.filter(type="created").exists()


def test_the_same_request_id_and_input_returns_the_existing_run(harness):
    first, _ = _start(harness, request_id="req-1")
    again, created = _start(harness, request_id="req-1")
    assert not created
    assert again.id == first.id
    assert Run.objects.count() == 1
    assert harness.enqueued == [first.id]


def test_the_same_input_in_another_key_order_is_the_same_request(harness):
    first, _ = _start(harness, request_id="r", input={"order_id": "o-1", "amount": 5})
    again, created = _start(harness, request_id="r", input={"amount": 5, "order_id": "o-1"})
    assert (again.id, created) == (first.id, False)


def test_the_same_request_id_with_different_input_is_a_conflict(harness):
    first, _ = _start(harness, request_id="req-1")
    with pytest.raises(RequestConflict) as raised:
        _start(harness, request_id="req-1", input={"order_id": "o-2"})
    assert raised.value.existing.id == first.id
    assert "already used" in str(raised.value)
    assert Run.objects.count() == 1


def test_request_ids_are_scoped_per_tenant(harness, other_tenant):
    mine, _ = _start(harness, request_id="req-1")
    theirs, created = _start(
        harness, tenant=other_tenant, request_id="req-1", input={"order_id": "o-2"}
    )
    assert created and theirs.id != mine.id


def test_a_dedupe_key_allows_one_active_run(harness):
    first, _ = _start(harness, dedupe_key="order-o-1")
    with pytest.raises(DuplicateActiveRun) as raised:
        _start(harness, dedupe_key="order-o-1", input={"order_id": "o-1", "amount": 1})
    assert raised.value.existing.id == first.id
    # Once it has ended, the key is free again.
    harness.advance(first)
    second, created = _start(
        harness, dedupe_key="order-o-1", input={"order_id": "o-1", "amount": 2}
    )
    assert created and second.id != first.id


def test_a_blocked_run_still_holds_its_dedupe_key(harness):
    first, _ = _start(harness, dedupe_key="k")
    Run.objects.filter(pk=first.id).update(status="blocked")
    with pytest.raises(DuplicateActiveRun):
        _start(harness, dedupe_key="k", input={"order_id": "o-9"})


def test_invalid_input_is_refused_with_field_errors(harness):
    with pytest.raises(InvalidRunInput) as raised:
        _start(harness, input={"order_id": "o-1", "amount": "lots"})
    assert raised.value.errors == [
        {
            "field": "amount",
            "message": "Input should be a valid integer, unable to parse string as an integer",
        }
    ]
    assert Run.objects.count() == 0


def test_an_unknown_agent_is_refused(harness):
    with pytest.raises(AdmissionError, match="no agent named 'nope'"):
        _start(harness, agent_name="nope")
