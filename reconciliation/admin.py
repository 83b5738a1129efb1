from django.contrib import admin

from accounts.admin_audit import RecordOfTruthAdmin, RecordOfTruthInline
from reconciliation.models import ProviderLookup, ReconciliationCase


class ProviderLookupInline(RecordOfTruthInline):
    model = ProviderLookup
    shown = ("created_at", "method", "actor", "outcome", "provider_reference", "note")


@admin.register(ReconciliationCase)
class ReconciliationCaseAdmin(RecordOfTruthAdmin):
    """Settled in the case page (audited, through the engine's fenced transitions), never here."""

    list_display = ["id", "tenant", "tool", "status", "resolution", "opened_at", "resolved_at"]
    list_filter = ["tenant", "status", "tool", "resolution"]
    search_fields = ["=id", "effect_key", "resolved_by"]
    inlines = [ProviderLookupInline]
