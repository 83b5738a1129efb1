from django.contrib import admin

from accounts.admin_audit import RecordOfTruthAdmin, RecordOfTruthInline
from agentruns.models import Blob, Run, RunEvent, Step

# The engine owns these rows and replay trusts them (a deleted succeeded effect step
# would be sent again): the admin is for reading them.


class StepInline(RecordOfTruthInline):
    model = Step
    fields = [
        "step_id",
        "status",
        "attempts",
        "effect_key",
        "provider_reference",
        "last_error_class",
        "completed_at",
    ]
    readonly_fields = fields
    show_change_link = True


@admin.register(Run)
class RunAdmin(RecordOfTruthAdmin):
    list_display = [
        "id",
        "tenant",
        "agent_name",
        "agent_version",
        "status",
        "current_step",
        "created_at",
        "updated_at",
    ]
    list_filter = ["status", "agent_name", "tenant"]
    search_fields = ["id", "request_id", "dedupe_key"]
    inlines = [StepInline]


@admin.register(Step)
class StepAdmin(RecordOfTruthAdmin):
    list_display = ["step_id", "run", "kind", "status", "attempts", "effect_key"]
    list_filter = ["kind", "status"]
    search_fields = ["effect_key", "provider_reference", "run__id"]


@admin.register(RunEvent)
class RunEventAdmin(RecordOfTruthAdmin):
    list_display = ["id", "run", "type", "state_version", "step_id", "created_at"]
    list_filter = ["type"]


@admin.register(Blob)
class BlobAdmin(RecordOfTruthAdmin):
    list_display = ["sha256", "size", "storage_name", "created_at"]
