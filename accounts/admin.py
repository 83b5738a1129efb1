from django.contrib import admin, messages

from accounts.models import ApiToken, AuditEntry, Operator, Tenant


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]


@admin.register(Operator)
class OperatorAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "time_zone"]
    list_filter = ["tenant"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "tenant",
        "prefix",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["tenant"]
    fields = ["tenant", "name", "scopes", "revoked_at"]

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)
            return
        token, secret = ApiToken.issue(tenant=obj.tenant, name=obj.name, scopes=obj.scopes or None)
        obj.pk = token.pk
        messages.warning(request, f"Copy the token now; it is not shown again: {secret}")


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["created_at", "tenant", "actor", "action", "object_type", "object_id"]
    list_filter = ["tenant", "action"]
    search_fields = ["actor", "object_id"]

    # Append-only: nobody edits or deletes the trail.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
