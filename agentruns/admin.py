from django.contrib import admin

from agentruns.models import Blob, Run, RunEvent, Step


class StepInline(admin.TabularInline):
    model = Step
    extra = 0
    can_delete = False
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
class RunAdmin(admin.ModelAdmin):
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

    # The engine owns these rows: the admin is for reading them.
    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ["step_id", "run", "kind", "status", "attempts", "effect_key"]
    list_filter = ["kind", "status"]
    search_fields = ["effect_key", "provider_reference", "run__id"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False


@admin.register(RunEvent)
class RunEventAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "type", "state_version", "step_id", "created_at"]
    list_filter = ["type"]

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request):
        return False


@admin.register(Blob)
class BlobAdmin(admin.ModelAdmin):
    list_display = ["sha256", "size", "storage_name", "created_at"]

    def has_change_permission(self, request, obj=None):
        return False
