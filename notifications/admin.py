from __future__ import annotations

from django.contrib import admin

from accounts.admin_audit import AuditedAdmin
from notifications.models import NotificationPreference


@admin.register(NotificationPreference)
class NotificationPreferenceAdmin(AuditedAdmin):
    """How each operator is told; a change lands in the operator's tenant's audit log."""

    list_display = ["user", "delivery"]
    list_filter = ["delivery"]
    raw_id_fields = ["user"]
