"""The store's SQL: statements whose text does not change with the values they write."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from agentruns.runtime.store import Store
from agentruns.runtime.writes import Fence, Increment

pytestmark = pytest.mark.django_db


def test_an_increment_is_a_bound_parameter_so_the_statement_is_prepared_once():
    store = Store()
    fence = Fence(uuid.uuid4(), 3, "worker")

    def statement(tokens: int):
        return store._run_update({"tokens_used": Increment(tokens)}, *store._fenced(fence))

    first_sql, first_params = statement(120)
    second_sql, second_params = statement(98_765)
    assert first_sql == second_sql
    assert "tokens_used = tokens_used + %s" in first_sql
    assert 120 in first_params and 98_765 in second_params


def _prepared_on_this_connection() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        return cursor.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="server-side preparation")
@pytest.mark.parametrize("prepare", [True, False])
@pytest.mark.django_db(transaction=True)  # the engine's statements run in autocommit
def test_the_engines_statements_are_prepared_unless_turned_off_for_a_pooler(prepare):
    store = Store(prepare=prepare)
    before = _prepared_on_this_connection()
    for _ in range(2):
        assert store.db.fetch_one("SELECT %s::int + 1", [41]) == (42,)
    # On: prepared once, reused; off (PgBouncer in transaction mode): nothing is left
    # on the server connection for the pooler to lose.
    assert _prepared_on_this_connection() - before == (1 if prepare else 0)
