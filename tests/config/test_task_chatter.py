"""django-q2's three INFO lines per task are dropped; its other lines and failures stay."""

from __future__ import annotations

import logging

import pytest

from config.logging import TaskChatterFilter


def _record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("django-q", level, __file__, 1, message, None, None)


@pytest.fixture
def info_root():
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    yield root
    root.setLevel(level)


@pytest.mark.parametrize(
    "message",
    [
        "Enqueued [holdfast] 1",
        "Process-6c1f processing mango-juliet-ten-alpha 'agentruns.tasks.advance_run' "
        "[advance_run]",
        "Processed 'agentruns.tasks.advance_run' (mango-juliet-ten-alpha)",
    ],
)
def test_a_tasks_own_info_lines_are_dropped(info_root, message):
    assert not TaskChatterFilter().filter(_record(message))


@pytest.mark.parametrize(
    "message",
    [
        "Process-6c1f ready for work at 4242",
        "Q Cluster holdfast running.",
        "Process-6c1f stopped doing work",
    ],
)
def test_the_clusters_start_and_stop_are_kept(info_root, message):
    assert TaskChatterFilter().filter(_record(message))


def test_a_failed_task_is_kept(info_root):
    failed = _record("Failed 'agentruns.tasks.advance_run' (x) - boom", logging.ERROR)
    assert TaskChatterFilter().filter(failed)


def test_at_debug_every_line_is_kept(info_root):
    info_root.setLevel(logging.DEBUG)
    assert TaskChatterFilter().filter(_record("Enqueued [holdfast] 1"))


def test_the_filter_sits_on_django_qs_logger():
    assert any(isinstance(f, TaskChatterFilter) for f in logging.getLogger("django-q").filters)
