"""The admin as a whole, once every app has registered its models (this app is listed last).

- django-q2's models leave the admin: its Schedule page lets whoever may add a schedule
  run any importable function on the workers, its task pages resubmit pickled calls,
  and none of it is audited. The project's own schedules are made in code.
- Logins and roles are changed on the record: Django's user and group pages, audited.
- A tenant's page is its settings page: the approval settings of each deployed agent as
  fields of their own, the rest checked against what the agents declare
  (``config.tenant_settings``), and what else the tenant has, linked.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import ObjectDoesNotExist
from django.urls import reverse
from django.utils.html import format_html

from accounts.admin import TenantAdmin
from accounts.admin_audit import AuditedAdmin
from accounts.models import DEFAULT_TENANT_SLUG, Tenant
from agentruns.money import format_amount
from agentruns.services import get_registry
from config.tenant_settings import approval_field_names, tenant_settings_form

for model in [m for m in admin.site._registry if m._meta.app_label == "django_q"]:
    admin.site.unregister(model)


def _operator_tenant(user):
    try:
        return user.operator.tenant
    except ObjectDoesNotExist:
        return None


User = get_user_model()
admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(AuditedAdmin, UserAdmin):
    def audit_tenants(self, request, obj):
        # The tenant the login works for; a login that is nobody's operator (yet) is
        # recorded in the tenant of the admin who changed it.
        return [_operator_tenant(obj) or _operator_tenant(request.user)]

    def user_change_password(self, request, id, form_url=""):
        response = super().user_change_password(request, id, form_url)
        # The password form saves itself (not through save_model); a redirect is a change.
        if request.method == "POST" and response.status_code == 302:
            user = User._default_manager.get(pk=id)
            self.audit(
                request,
                user,
                action="admin.password_change",
                before=None,
                after={"username": user.get_username()},
                tenants=self.audit_tenants(request, user),
            )
        return response


@admin.register(Group)
class AuditedGroupAdmin(AuditedAdmin, GroupAdmin):
    def audit_tenants(self, request, obj):
        # Roles are shared by every tenant: a change to one changes what every tenant's
        # operators may do, so every tenant's log shows it.
        return list(Tenant.objects.all())


admin.site.unregister(Tenant)
DEPLOYMENT_ENDPOINT = "the deployment's endpoint"


@admin.register(Tenant)
class TenantSettingsAdmin(TenantAdmin):
    readonly_fields = ["operators_of", "provider_accounts_of", "authorities_of"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        kwargs["form"] = tenant_settings_form(get_registry())
        kwargs["fields"] = None  # the fieldsets say
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fieldsets(self, request, obj=None):
        fieldsets = [
            (None, {"fields": ["slug", "name"]}),
            (
                "Retention (manage.py archive_runs applies it now; the sweeper, every minute)",
                {"fields": ["retention_days", "personal_data_days"]},
            ),
            (
                "Approvals, per agent (pinned into each new run, never into a started one)",
                {"fields": approval_field_names(get_registry())},
            ),
            ("Other agent settings", {"fields": ["other_settings"]}),
        ]
        if obj is not None:
            fieldsets.append(
                (
                    "Also the tenant's (each changed on its own page, on the record)",
                    {"fields": self.readonly_fields},
                )
            )
        return fieldsets

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is not None else []

    @admin.display(description="Operators")
    def operators_of(self, obj):
        operators = obj.operators.select_related("user").order_by("user__username")
        return _linked(
            [f"{o.user.get_username()}" for o in operators],
            reverse("admin:accounts_operator_changelist") + f"?tenant__id__exact={obj.pk}",
            empty="none yet: add one, or run manage.py createtenant with --admin",
        )

    @admin.display(description="Provider accounts")
    def provider_accounts_of(self, obj):
        accounts = obj.provider_accounts.order_by("provider")
        return _linked(
            [f"{a.provider} ({a.endpoint or DEPLOYMENT_ENDPOINT})" for a in accounts],
            reverse("admin:accounts_provideraccount_changelist") + f"?tenant__id__exact={obj.pk}",
            empty=(
                "none of its own: it uses the deployment's settings"
                if obj.slug == DEFAULT_TENANT_SLUG
                else "none: its tools are refused every provider (manage.py setprovideraccount)"
            ),
        )

    @admin.display(description="Approval authorities")
    def authorities_of(self, obj):
        rows = obj.approval_authorities.select_related("group").order_by("group__name", "currency")
        return _linked(
            [
                f"{row.group.name}: "
                + (
                    f"up to {format_amount(row.max_amount, row.currency)}"
                    if row.max_amount is not None
                    else f"any amount in {row.currency.upper()}"
                )
                for row in rows
            ],
            reverse("admin:approvals_approvalauthority_changelist")
            + f"?tenant__id__exact={obj.pk}",
            empty="none: no one may approve an amount of money yet",
        )


def _linked(lines: list[str], url: str, *, empty: str):
    text = "; ".join(lines) if lines else empty
    return format_html('{} (<a href="{}">manage</a>)', text, url)
