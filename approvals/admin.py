from django.contrib import admin

from accounts.admin_audit import AuditedAdmin, RecordOfTruthAdmin
from approvals.models import Approval, ApprovalAuthority


@admin.register(Approval)
class ApprovalAdmin(RecordOfTruthAdmin):
    """Who allowed what: decided in the inbox (audited), used by the engine, never edited."""

    list_display = ["id", "tenant", "tool", "status", "amount", "created_at", "expires_at"]
    list_filter = ["tenant", "status", "tool"]
    search_fields = ["=id", "effect_key", "requested_by", "decided_by_name"]


@admin.register(ApprovalAuthority)
class ApprovalAuthorityAdmin(AuditedAdmin):
    """A limit per role, tenant and currency: no row for a currency, no authority in it."""

    list_display = ["tenant", "group", "currency", "max_amount"]
    list_filter = ["tenant", "currency"]
    fields = ["tenant", "group", "currency", "max_amount"]
