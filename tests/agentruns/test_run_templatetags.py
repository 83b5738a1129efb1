"""The run pages' display helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentruns.templatetags.runs import duration

START = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.34, "340 ms"),
        (2.44, "2.4 s"),
        (185, "3 min 5 s"),
        (3 * 3600 + 120, "3 h 2 min"),
    ],
)
def test_a_step_duration_is_shown_as_precisely_as_it_matters(seconds, shown):
    assert duration(START, START + timedelta(seconds=seconds)) == shown


def test_a_step_without_both_ends_shows_no_duration():
    assert duration(START, None) == ""
    assert duration(None, START) == ""
