"""The database clock in SQL survives DEBUG's query log (it formats every query once more)."""

from __future__ import annotations

import pytest
from django.db import connection

from agentruns.dbclock import DbNow
from agentruns.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_starts_and_is_found_by_the_database_clock_with_the_query_log_on(harness):
    connection.force_debug_cursor = True  # what DEBUG=True does to every cursor
    try:
        run = harness.start("flow", {})
        assert Run.objects.filter(pk=run.id, enqueued_at__lte=DbNow()).exists()
        logged = connection.queries[-1]["sql"]
        assert "strftime('%Y" in logged or "statement_timestamp()" in logged
    finally:
        connection.force_debug_cursor = False
