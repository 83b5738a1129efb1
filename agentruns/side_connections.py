"""Connections a process opens to PostgreSQL beside Django's own, one job each: the live
pages' listener (``agentruns.follower``), the doorbell that notifies them
(``agentruns.doorbell``) and each worker cluster's queue listener (``agentruns.broker``).

They are made from Django's settings for the alias (host, credentials, the server's
options) without what only Django's cursors use (their cursor class and adapters),
never prepare a statement (a pooler in front may not keep one: docs/scaling.md §5), and
give up connecting after ``CONNECT_TIMEOUT`` seconds unless the settings say otherwise:
a server that does not answer is an outage to wait out, not a thread hung on connect.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

CONNECT_TIMEOUT = 5


def side_connection_params(alias: str = "default") -> dict[str, Any]:
    """``psycopg.connect`` (or ``AsyncConnection.connect``) arguments for ``alias``."""
    params = {
        key: value
        for key, value in connections[alias].get_connection_params().items()
        if key not in ("cursor_factory", "context")
    }
    params["prepare_threshold"] = None
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    return params
