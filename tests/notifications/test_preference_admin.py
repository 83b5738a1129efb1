"""An operator's choice of immediate, digest or off is set in the admin, on the record."""

from __future__ import annotations

import pytest

from accounts.models import AuditEntry
from notifications.models import NotificationPreference

pytestmark = pytest.mark.django_db


def test_a_preference_set_in_the_admin_is_audited_in_the_operators_tenant(
    admin_client, make_operator, tenant
):
    ann = make_operator(tenant, "approver", username="ann")
    response = admin_client.post(
        "/admin/notifications/notificationpreference/add/", {"user": ann.pk, "delivery": "digest"}
    )
    assert response.status_code == 302
    preference = NotificationPreference.objects.get(user=ann)
    assert preference.delivery == "digest"

    response = admin_client.post(
        f"/admin/notifications/notificationpreference/{preference.pk}/change/",
        {"user": ann.pk, "delivery": "off"},
    )
    assert response.status_code == 302
    added, changed = AuditEntry.objects.filter(object_type="notificationpreference").order_by("id")
    assert added.tenant == changed.tenant == tenant
    assert added.action == "admin.add" and added.after["delivery"] == "digest"
    assert changed.action == "admin.change"
    assert changed.before["delivery"] == "digest" and changed.after["delivery"] == "off"
