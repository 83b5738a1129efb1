"""An approval authority changed in the admin is on the tenant's record."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from accounts.models import AuditEntry
from approvals.models import ApprovalAuthority

pytestmark = pytest.mark.django_db(transaction=True)


def test_raising_an_approvers_limit_in_the_admin_is_audited(admin_client, tenant):
    group = Group.objects.get_or_create(name="approver")[0]
    authority = ApprovalAuthority.objects.create(
        tenant=tenant, group=group, currency="eur", max_amount=10_000
    )
    response = admin_client.post(
        f"/admin/approvals/approvalauthority/{authority.pk}/change/",
        {"tenant": tenant.pk, "group": group.pk, "currency": "eur", "up_to": "10,000.00"},
    )
    assert response.status_code == 302
    [entry] = AuditEntry.objects.filter(object_type="approvalauthority")
    assert entry.tenant == tenant and entry.actor == "user:admin"
    assert entry.action == "admin.change" and entry.object_id == str(authority.pk)
    assert entry.before["max_amount"] == 10_000 and entry.after["max_amount"] == 1_000_000


def test_an_authority_deleted_in_the_admin_is_audited(admin_client, tenant):
    group = Group.objects.get_or_create(name="approver")[0]
    authority = ApprovalAuthority.objects.create(
        tenant=tenant, group=group, currency="eur", max_amount=10_000
    )
    response = admin_client.post(
        f"/admin/approvals/approvalauthority/{authority.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 302
    assert not ApprovalAuthority.objects.filter(pk=authority.pk).exists()
    [entry] = AuditEntry.objects.filter(object_type="approvalauthority")
    assert entry.action == "admin.delete" and entry.before["max_amount"] == 10_000


def test_the_admin_shows_and_edits_an_authoritys_currency(admin_client, tenant):
    group = Group.objects.get_or_create(name="approver")[0]
    authority = ApprovalAuthority.objects.create(
        tenant=tenant, group=group, currency="eur", max_amount=10_000
    )
    listing = admin_client.get("/admin/approvals/approvalauthority/").content.decode()
    assert "100.00 EUR" in listing  # the limit with its currency, not 10000
    url = f"/admin/approvals/approvalauthority/{authority.pk}/change/"
    assert 'name="currency"' in admin_client.get(url).content.decode()
    upper = admin_client.post(
        url, {"tenant": tenant.pk, "group": group.pk, "currency": "JPY", "up_to": "8000"}
    )
    assert upper.status_code == 200  # refused: currencies are lower case, as approvals have them
    assert "A lower-case ISO 4217 code" in upper.content.decode()
    response = admin_client.post(
        url, {"tenant": tenant.pk, "group": group.pk, "currency": "jpy", "up_to": "8000"}
    )
    assert response.status_code == 302
    authority.refresh_from_db()
    assert (authority.currency, authority.max_amount) == ("jpy", 8_000)
    [entry] = AuditEntry.objects.filter(object_type="approvalauthority")
    assert entry.before["currency"] == "eur" and entry.after["currency"] == "jpy"


def test_a_role_may_hold_one_authority_per_currency(admin_client, tenant):
    group = Group.objects.get_or_create(name="approver")[0]
    ApprovalAuthority.objects.create(tenant=tenant, group=group, currency="eur", max_amount=1)
    response = admin_client.post(
        "/admin/approvals/approvalauthority/add/",
        {"tenant": tenant.pk, "group": group.pk, "currency": "jpy", "up_to": "8000"},
    )
    assert response.status_code == 302
    again = admin_client.post(
        "/admin/approvals/approvalauthority/add/",
        {"tenant": tenant.pk, "group": group.pk, "currency": "jpy", "up_to": "9000"},
    )
    assert again.status_code == 200  # the same role, tenant and currency twice is refused
    assert ApprovalAuthority.objects.filter(tenant=tenant, group=group).count() == 2


def test_a_limit_is_typed_in_its_currency_and_checked_against_it(admin_client, tenant):
    group = Group.objects.get_or_create(name="approver")[0]
    authority = ApprovalAuthority.objects.create(
        tenant=tenant, group=group, currency="eur", max_amount=10_000
    )
    url = f"/admin/approvals/approvalauthority/{authority.pk}/change/"
    assert 'value="100.00"' in admin_client.get(url).content.decode()
    fraction = {"tenant": tenant.pk, "group": group.pk, "currency": "jpy", "up_to": "80.5"}
    refused = admin_client.post(url, fraction)
    assert refused.status_code == 200
    assert "at most 0 decimals for JPY" in refused.content.decode()
    authority.refresh_from_db()
    assert (authority.currency, authority.max_amount) == ("eur", 10_000)
    unlimited = admin_client.post(
        url, {"tenant": tenant.pk, "group": group.pk, "currency": "eur", "up_to": ""}
    )
    assert unlimited.status_code == 302
    authority.refresh_from_db()
    assert authority.max_amount is None
    listing = admin_client.get("/admin/approvals/approvalauthority/").content.decode()
    assert "any amount in EUR" in listing
