"""The connections a process opens beside Django's: made from its settings, they
connect, prepare nothing and do not wait for ever on a server that does not answer."""

from __future__ import annotations

import os

import psycopg
import pytest
from django.db import connection

from agentruns.side_connections import CONNECT_TIMEOUT, side_connection_params

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="side connections are PostgreSQL's (LISTEN/NOTIFY)",
    ),
]


def test_a_side_connection_reaches_djangos_database_and_prepares_nothing():
    params = side_connection_params()
    assert "cursor_factory" not in params and "context" not in params
    assert params["prepare_threshold"] is None
    assert params["connect_timeout"] == CONNECT_TIMEOUT
    with psycopg.connect(**params, autocommit=True) as side:
        assert side.prepare_threshold is None
        assert side.info.dbname == connection.settings_dict["NAME"]
        for _ in range(10):
            side.execute("SELECT 1")
        prepared = side.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
    assert prepared == 0


def test_a_connect_timeout_in_the_settings_is_kept():
    options = {**connection.settings_dict.get("OPTIONS", {}), "connect_timeout": 2}
    connection.settings_dict["OPTIONS"] = options
    try:
        assert side_connection_params()["connect_timeout"] == 2
    finally:
        options.pop("connect_timeout")
