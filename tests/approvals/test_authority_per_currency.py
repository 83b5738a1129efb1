"""Approval authority is per currency: a limit in one currency never covers another."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.contrib.auth.models import Group

from approvals.models import Approval, ApprovalAuthority
from approvals.policy import approver_problem
from approvals.selectors import Viewer

# A decision wakes the run through the task queue (its own database on SQLite).
from approvals.services import approval_decide
from tests.harness import post_decision

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


def _only_in_yen(tenant, max_amount=None):
    """The approver role's one authority becomes JPY (no limit in it by default)."""
    ApprovalAuthority.objects.filter(tenant=tenant, group__name="approver").update(
        currency="jpy", max_amount=max_amount
    )


def test_a_yen_limit_does_not_cover_euros(approver, tenant):
    _only_in_yen(tenant, max_amount=8_000)
    assert approver_problem(approver, tenant, 8_000, "jpy") is None
    assert approver_problem(approver, tenant, 100, "eur") == "you have no approval authority in EUR"


def test_a_euro_limit_covers_euros_up_to_its_amount(approver, tenant):
    assert approver_problem(approver, tenant, 50_000, "eur") is None
    assert approver_problem(approver, tenant, 50_001, "eur") == (
        "the amount 500.01 EUR is above the role's limit of 500.00 EUR"
    )
    assert approver_problem(approver, tenant, 1, "jpy") == "you have no approval authority in JPY"


def test_no_limit_in_one_currency_is_no_limit_in_that_currency_only(approver, tenant):
    ApprovalAuthority.objects.create(
        tenant=tenant, group=Group.objects.get(name="approver"), currency="jpy", max_amount=None
    )
    assert approver_problem(approver, tenant, 10**12, "jpy") is None
    assert "above the role's limit of 500.00 EUR" in approver_problem(
        approver, tenant, 50_001, "eur"
    )


def test_a_decision_on_euros_by_an_approver_with_only_yen_is_refused_with_the_reason(
    client, approver, tenant, pending
):
    _only_in_yen(tenant)
    client.force_login(approver)
    page = client.get("/approvals/").content.decode()
    assert "Your limit: no limit in JPY." in page
    assert "You cannot decide this one: you have no approval authority in EUR." in page
    assert 'name="decision"' not in page
    response = post_decision(client, pending)
    assert response.status_code == 403
    assert "you have no approval authority in EUR" in response.content.decode()
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_a_euro_limit_lets_the_approver_approve_euros_within_it(client, approver, pending):
    client.force_login(approver)
    page = client.get("/approvals/").content.decode()
    assert 'name="decision" value="approve"' in page
    assert post_decision(client, pending).status_code == 302
    pending.refresh_from_db()
    assert pending.status == "approved"


def test_the_card_shows_each_limit_with_its_currency(client, approver, tenant, pending):
    ApprovalAuthority.objects.create(
        tenant=tenant, group=Group.objects.get(name="approver"), currency="jpy", max_amount=8_000
    )
    client.force_login(approver)
    page = client.get("/approvals/").content.decode()
    assert "Your limit: 500.00 EUR, 8,000 JPY." in page


def test_the_largest_of_the_roles_limits_in_a_currency_counts(tenant, make_operator):
    user = make_operator(tenant, "approver", "admin", username="cy")
    approver, admin = Group.objects.get(name="approver"), Group.objects.get(name="admin")
    ApprovalAuthority.objects.create(tenant=tenant, group=approver, currency="eur", max_amount=100)
    ApprovalAuthority.objects.create(tenant=tenant, group=admin, currency="eur", max_amount=900)
    ApprovalAuthority.objects.create(tenant=tenant, group=admin, currency="jpy", max_amount=5)
    viewer = Viewer.of(user, tenant, actor="user:cy")
    assert viewer.limits == {"eur": 900, "jpy": 5}
    assert viewer.limit_text == "9.00 EUR, 5 JPY"


def test_the_guard_refuses_an_approval_whose_approver_holds_authority_only_in_another_currency(
    world, approver, tenant
):
    run = world.start_refund()
    world.harness.advance(run)
    approval = world.waiting_approval(run)
    approval_decide(
        approval=approval, user=approver, decision="approve", seen_args_hash=approval.args_hash
    )
    # Everything else about the approver still holds; only the authority's currency
    # differs from the approval's, and that alone must refuse the send, even with
    # no limit in that other currency.
    _only_in_yen(tenant, max_amount=None)
    assert world.harness.advance(run) == "suspended:waiting_for_approval"
    approval.refresh_from_db()
    assert approval.status == "invalidated"
    assert "you have no approval authority in EUR" in approval.invalidated_reason
    assert world.waiting_approval(run).replaces_id == approval.pk
    assert world.refunds()["count"] == 0


def test_existing_authorities_get_the_currency_of_their_tenants_approvals(
    world, approver, tenant, other_tenant
):
    migration = importlib.import_module(
        "approvals.migrations.0004_give_authorities_their_tenants_currency"
    )
    run = world.start_refund()
    world.harness.advance(run)
    Approval.objects.filter(run=run).update(currency="jpy")
    ApprovalAuthority.objects.update(currency="")
    quiet = ApprovalAuthority.objects.create(
        tenant=other_tenant, group=Group.objects.get(name="approver"), currency=""
    )
    migration.give_authorities_their_tenants_currency(apps, None)
    assert ApprovalAuthority.objects.get(tenant=tenant).currency == "jpy"
    quiet.refresh_from_db()
    assert quiet.currency == "eur"  # no approvals yet: the demo shop's currency
