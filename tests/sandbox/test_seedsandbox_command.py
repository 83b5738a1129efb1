from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command


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


@pytest.mark.django_db(databases=["default", "sandbox"])
def test_seedsandbox_seeds_another_account_from_another_number():
    call_command("seedsandbox", stdout=StringIO())
    out = StringIO()
    call_command("seedsandbox", "--api-key", "sk_test_two", "--first-number", "2001", stdout=out)
    created = out.getvalue().splitlines()
    assert [line.split()[1] for line in created] == [f"ord_{n}" for n in range(2001, 2007)]
    assert created[0].split()[:3] == ["created", "ord_2001", "pi_3SbxOrd2001"]


@pytest.mark.django_db(databases=["default", "sandbox"])
def test_seedsandbox_refuses_ids_that_another_account_holds():
    call_command("seedsandbox", stdout=StringIO())
    with pytest.raises(CommandError, match="pi_3SbxOrd1001 belongs to another account"):
        call_command("seedsandbox", "--api-key", "sk_test_two", stdout=StringIO())
