"""An approval authority changed in the admin is on the tenant's record."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from accounts.models import AuditEntry
from approvals.models import ApprovalAuthority

pytestmark = pytest.mark.django_db(transaction=True)


def test_raising_an_approvers_limit_in_the_admin_is_audited(admin_client, tenant):
    group = Group.objects.get_or_create(name="approver")[0]
    authority = ApprovalAuthority.objects.create(tenant=tenant, group=group, max_amount=10_000)
    response = admin_client.post(
        f"/admin/approvals/approvalauthority/{authority.pk}/change/",
        {"tenant": tenant.pk, "group": group.pk, "max_amount": 1_000_000},
    )
    assert response.status_code == 302
    [entry] = AuditEntry.objects.filter(object_type="approvalauthority")
    assert entry.tenant == tenant and entry.actor == "user:admin"
    assert entry.action == "admin.change" and entry.object_id == str(authority.pk)
    assert entry.before["max_amount"] == 10_000 and entry.after["max_amount"] == 1_000_000


def test_an_authority_deleted_in_the_admin_is_audited(admin_client, tenant):
    group = Group.objects.get_or_create(name="approver")[0]
    authority = ApprovalAuthority.objects.create(tenant=tenant, group=group, max_amount=10_000)
    response = admin_client.post(
        f"/admin/approvals/approvalauthority/{authority.pk}/delete/", {"post": "yes"}
    )
    assert response.status_code == 302
    assert not ApprovalAuthority.objects.filter(pk=authority.pk).exists()
    [entry] = AuditEntry.objects.filter(object_type="approvalauthority")
    assert entry.action == "admin.delete" and entry.before["max_amount"] == 10_000
