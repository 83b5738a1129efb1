"""The demo data ``make run`` starts with."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from agentruns.models import Run
from approvals.models import ApprovalAuthority

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def test_seeddemo_creates_the_logins_the_authorities_and_the_runs_once(
    tenant, make_operator, settings
):
    # As `make run` runs it: the published demo password, given explicitly.
    settings.HOLDFAST_DEMO_PASSWORD = "holdfast-demo"
    # Transactional tests flush the groups the data migration made; make them again.
    make_operator(tenant, "approver", "admin", username="groups-maker")
    out = io.StringIO()
    call_command("seeddemo", stdout=out)
    assert "Approver: ann / holdfast-demo" in out.getvalue()
    ann = get_user_model().objects.get(username="ann")
    assert ann.check_password("holdfast-demo")
    assert ann.operator.tenant == tenant
    assert ann.has_perm("accounts.decide_approvals")
    limits = ApprovalAuthority.objects.values_list("group__name", "currency", "max_amount")
    assert sorted(limits, key=str) == [("admin", "eur", None), ("approver", "eur", 10_000)]
    runs = Run.objects.filter(tenant=tenant).count()
    assert runs >= 5
    # One run of the refund agent written with Pydantic AI, whose model runs offline.
    twin = Run.objects.get(tenant=tenant, agent_name="refund_support_pydantic_ai")
    assert twin.request_id == "demo-refund-pydantic-ai"
    assert twin.input["order_id"] == "ord_1005"
    call_command("seeddemo", stdout=io.StringIO())
    assert Run.objects.filter(tenant=tenant).count() == runs
    assert get_user_model().objects.filter(username="ann").count() == 1
