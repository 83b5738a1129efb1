"""A tenant's settings page: approval settings per agent and currency, the rest checked
against what the deployed agents declare, each change on the tenant's record."""

from __future__ import annotations

import importlib
import re

import pytest
from django.apps import apps
from django.contrib.auth.models import Group

from accounts.models import AuditEntry, ProviderAccount, Tenant
from agentruns.services import get_registry
from approvals.models import ApprovalAuthority
from config.tenant_settings import (
    approving_agents,
    effective_approvals,
    parse_limits,
    settings_problems,
)
from support.agents import refund_support
from support.tools import _refund_needs_approval

pytestmark = pytest.mark.django_db(transaction=True)


def _url(tenant) -> str:
    return f"/admin/accounts/tenant/{tenant.pk}/change/"


def _form(tenant, **changes) -> dict[str, str]:
    data = {
        "slug": tenant.slug,
        "name": tenant.name,
        "retention_days": str(tenant.retention_days),
        "personal_data_days": ""
        if tenant.personal_data_days is None
        else str(tenant.personal_data_days),
        "other_settings": "{}",
    }
    for agent in approving_agents(get_registry()):
        # Each approving agent's fields as the page shows them for its own settings.
        data[f"{agent.name}__approvals_enabled"] = "on"
        data[f"{agent.name}__auto_approve"] = "50.00 EUR"
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def _pinned(tenant) -> dict:
    tenant.refresh_from_db()
    return effective_approvals(refund_support, tenant.agent_config)


def test_the_page_shows_each_agents_approval_settings_as_a_new_run_would_pin_them(
    admin_client, tenant
):
    page = admin_client.get(_url(tenant)).content.decode()
    assert "refund_support: no approval needed up to" in page
    assert "50.00 EUR</textarea>" in page
    assert re.search(r'<input[^>]*name="refund_support__approvals_enabled"[^>]*checked', page)


def test_limits_are_saved_per_currency_and_audited(admin_client, tenant):
    response = admin_client.post(
        _url(tenant), _form(tenant, refund_support__auto_approve="80.00 EUR\nJPY 10,000")
    )
    assert response.status_code == 302
    tenant.refresh_from_db()
    assert tenant.agent_config == {
        "refund_support": {"approvals": {"auto_approve_up_to": {"eur": 8000, "jpy": 10000}}}
    }
    [entry] = AuditEntry.objects.filter(object_type="tenant")
    assert entry.before["agent_config"] == {} and entry.after == {**entry.after, "name": "Default"}
    assert "10,000 JPY" in admin_client.get(_url(tenant)).content.decode()


def test_a_currency_taken_out_needs_an_approver_for_every_refund_in_it(admin_client, tenant):
    response = admin_client.post(_url(tenant), _form(tenant, refund_support__auto_approve=""))
    assert response.status_code == 302
    approvals = _pinned(tenant)
    assert approvals["auto_approve_up_to"] == {"eur": None}
    assert _refund_needs_approval({"amount": 1, "currency": "eur"}, {"approvals": approvals})


def test_unticked_the_agent_needs_no_approver_and_back_to_defaults_stores_nothing(
    admin_client, tenant
):
    admin_client.post(_url(tenant), _form(tenant, refund_support__approvals_enabled=None))
    tenant.refresh_from_db()
    assert tenant.agent_config == {"refund_support": {"approvals": {"enabled": False}}}
    admin_client.post(_url(tenant), _form(tenant))
    tenant.refresh_from_db()
    assert tenant.agent_config == {}  # the agent's own settings apply again


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ("50 euros", "line 1: write an amount and its currency, e.g. 50.00 EUR"),
        ("12.345 EUR", "line 1: the amount must be positive with at most 2 decimals for EUR"),
        ("1.5 JPY", "at most 0 decimals for JPY"),
        ("1 EUR\n\n2 eur", "line 3: EUR is given twice"),
        ("5000", "line 1: write an amount and its currency"),
    ],
)
def test_a_limit_without_its_currency_or_with_a_wrong_amount_is_refused(
    admin_client, tenant, typed, error
):
    response = admin_client.post(_url(tenant), _form(tenant, refund_support__auto_approve=typed))
    assert response.status_code == 200
    assert error in response.content.decode()
    tenant.refresh_from_db()
    assert tenant.agent_config == {} and not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ('{"refund_suport": {}}', "no agent named &#x27;refund_suport&#x27; is deployed"),
        ('{"refund_support": {"approvals": {}}}', "set with the approval fields above"),
        ('{"refund_support": {"budget": 3}}', "refund_support.budget: the agent declares no"),
        ('["refund_support"]', "must be a JSON object of agent names"),
    ],
)
def test_other_settings_must_be_what_the_agents_declare(admin_client, tenant, typed, error):
    response = admin_client.post(_url(tenant), _form(tenant, other_settings=typed))
    assert response.status_code == 200
    assert error in response.content.decode()
    tenant.refresh_from_db()
    assert tenant.agent_config == {}


def test_a_declared_setting_of_the_wrong_type_is_refused():
    registry = get_registry()
    flow = next(a for a in (registry.latest(n) for n in registry.names()) if a.config)
    key, default = next(iter(flow.config.items()))
    wrong = "text" if not isinstance(default, str) else 3
    problems = settings_problems({flow.name: {key: wrong}}, registry)
    assert problems and f"{flow.name}.{key}: must be" in problems[0]


def test_the_page_lists_what_else_the_tenant_has_with_money_in_its_currency(
    admin_client, tenant, make_operator
):
    make_operator(tenant, "approver", username="ann")
    ApprovalAuthority.objects.create(
        tenant=tenant, group=Group.objects.get(name="approver"), currency="eur", max_amount=10_000
    )
    ProviderAccount.objects.create(tenant=tenant, provider="payments", secret_ref="env:X")
    page = admin_client.get(_url(tenant)).content.decode()
    assert "ann (<a" in page
    assert "approver: up to 100.00 EUR" in page
    assert "payments (the deployment&#x27;s endpoint)" in page


def test_a_new_tenant_is_added_with_its_settings(admin_client):
    response = admin_client.post(
        "/admin/accounts/tenant/add/",
        _form(Tenant(slug="acme", name="Acme"), refund_support__auto_approve="20.00 USD"),
    )
    assert response.status_code == 302
    acme = Tenant.objects.get(slug="acme")
    assert _pinned(acme)["auto_approve_up_to"] == {"eur": None, "usd": 2000}
    assert AuditEntry.objects.get(tenant=acme).action == "admin.add"


def test_retention_is_set_on_the_page_and_audited(admin_client, tenant):
    page = admin_client.get(_url(tenant)).content.decode()
    assert "Retention" in page and 'name="retention_days" value="30"' in page

    response = admin_client.post(
        _url(tenant), _form(tenant, retention_days="90", personal_data_days="14")
    )

    assert response.status_code == 302
    tenant.refresh_from_db()
    assert (tenant.retention_days, tenant.personal_data_days) == (90, 14)
    [entry] = AuditEntry.objects.filter(object_type="tenant")
    assert entry.before["retention_days"] == 30 and entry.after["personal_data_days"] == 14


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"retention_days": "30", "personal_data_days": "31"}, "at most the retention period"),
        ({"retention_days": "0"}, "greater than or equal to 1"),
        ({"retention_days": ""}, "This field is required"),
    ],
)
def test_a_redaction_period_longer_than_retention_is_refused(admin_client, tenant, changes, error):
    response = admin_client.post(_url(tenant), _form(tenant, **changes))
    assert response.status_code == 200 and error in response.content.decode()
    tenant.refresh_from_db()
    assert (tenant.retention_days, tenant.personal_data_days) == (30, None)


def test_typed_limits_read_as_minor_units_of_their_currency():
    assert parse_limits("50.00 EUR\nJPY 700\n 1,250.5 usd ") == {
        "eur": 5000,
        "jpy": 700,
        "usd": 125050,
    }


def test_the_refund_limit_is_per_currency_and_a_pinned_bare_amount_still_applies():
    per_currency = {"approvals": {"auto_approve_up_to": {"eur": 5000}}}
    assert not _refund_needs_approval({"amount": 5000, "currency": "eur"}, per_currency)
    assert _refund_needs_approval({"amount": 5001, "currency": "eur"}, per_currency)
    # 1 yen is not covered by an amount in euros.
    assert _refund_needs_approval({"amount": 1, "currency": "jpy"}, per_currency)
    pinned_before = {"approvals": {"auto_approve_up_to": 5000}}
    assert not _refund_needs_approval({"amount": 5000, "currency": "eur"}, pinned_before)


def test_the_migration_gives_a_bare_amount_its_currency(tenant, other_tenant):
    tenant.agent_config = {"refund_support": {"approvals": {"auto_approve_up_to": 8000}}}
    tenant.save()
    other_tenant.agent_config = {"refund_support": {"approvals": {"enabled": False}}}
    other_tenant.save()
    migration = importlib.import_module("accounts.migrations.0009_make_auto_approval_per_currency")
    migration.make_per_currency(apps, None)
    tenant.refresh_from_db()
    other_tenant.refresh_from_db()
    assert tenant.agent_config["refund_support"]["approvals"]["auto_approve_up_to"] == {"eur": 8000}
    assert other_tenant.agent_config == {"refund_support": {"approvals": {"enabled": False}}}


def test_the_default_tenant_without_accounts_of_its_own_uses_the_deployments(
    admin_client, tenant, other_tenant
):
    assert (
        "it uses the deployment&#x27;s settings" in admin_client.get(_url(tenant)).content.decode()
    )
    other = admin_client.get(_url(other_tenant)).content.decode()
    assert "none: its tools are refused every provider" in other
