from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db(databases=["default", "sandbox"])
def test_seedsandbox_creates_the_demo_orders_once():
    first, second = StringIO(), StringIO()
    call_command("seedsandbox", stdout=first)
    call_command("seedsandbox", stdout=second)
    created = first.getvalue().splitlines()
    assert len(created) == 6
    assert all(line.startswith("created ord_") for line in created)
    assert created[0].split()[1:4] == ["ord_1001", "pi_3SbxOrd1001", "8900"]
    assert all(line.startswith("exists  ord_") for line in second.getvalue().splitlines())
