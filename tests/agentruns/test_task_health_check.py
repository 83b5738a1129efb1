"""A worker skips Django's per-task health check only on a connection just proven."""

from __future__ import annotations

import pytest
from django.db import connection

from agentruns import tasks

pytestmark = pytest.mark.django_db


@pytest.fixture
def open_connection():
    connection.ensure_connection()
    connection.health_check_done = False
    yield connection
    connection.health_check_done = False


@pytest.fixture
def clock(monkeypatch):
    now = {"t": 1000.0}
    monkeypatch.setattr(tasks.time, "monotonic", lambda: now["t"])
    return now


def test_a_task_right_after_a_finished_run_trusts_the_connection(
    open_connection, clock, monkeypatch
):
    monkeypatch.setattr(tasks, "_proven_at", clock["t"] - 0.2)
    tasks._trust_a_connection_just_proven()
    assert open_connection.health_check_done


@pytest.mark.parametrize("proven_ago", [None, tasks.PROVEN_SECONDS + 0.1])
def test_a_connection_idle_for_a_while_or_never_proven_is_checked(
    open_connection, clock, monkeypatch, proven_ago
):
    monkeypatch.setattr(
        tasks, "_proven_at", None if proven_ago is None else clock["t"] - proven_ago
    )
    tasks._trust_a_connection_just_proven()
    assert not open_connection.health_check_done


def test_a_connection_that_saw_an_error_is_checked(open_connection, clock, monkeypatch):
    monkeypatch.setattr(tasks, "_proven_at", clock["t"] - 0.2)
    monkeypatch.setattr(open_connection, "errors_occurred", True)
    tasks._trust_a_connection_just_proven()
    assert not open_connection.health_check_done
