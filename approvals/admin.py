from django.contrib import admin

from approvals.models import Approval, ApprovalAuthority


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "tool", "status", "amount", "created_at", "expires_at"]
    list_filter = ["tenant", "status", "tool"]
    search_fields = ["=id", "effect_key", "requested_by", "decided_by_name"]

    # A record of who allowed what: decided in the inbox (audited), used by the
    # engine, never edited by hand.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(ApprovalAuthority)
class ApprovalAuthorityAdmin(admin.ModelAdmin):
    list_display = ["tenant", "group", "max_amount"]
    list_filter = ["tenant"]
