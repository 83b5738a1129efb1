"""The store's SQL: statements whose text does not change with the values they write."""

from __future__ import annotations

import uuid

import pytest

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
