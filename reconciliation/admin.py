from django.contrib import admin

from reconciliation.models import ProviderLookup, ReconciliationCase


class ProviderLookupInline(admin.TabularInline):
    model = ProviderLookup
    extra = 0
    fields = ["created_at", "method", "actor", "outcome", "provider_reference", "note"]
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(ReconciliationCase)
class ReconciliationCaseAdmin(admin.ModelAdmin):
    list_display = ["id", "tenant", "tool", "status", "resolution", "opened_at", "resolved_at"]
    list_filter = ["tenant", "status", "tool", "resolution"]
    search_fields = ["=id", "effect_key", "resolved_by"]
    inlines = [ProviderLookupInline]

    # Settled in the case page (audited, through the engine's fenced transitions),
    # never edited by hand.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
