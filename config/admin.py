"""The admin as a whole, once every app has registered its models (this app is listed last).

- django-q2's models leave the admin: its Schedule page lets whoever may add a schedule
  run any importable function on the workers, its task pages resubmit pickled calls,
  and none of it is audited. The project's own schedules are made in code.
- Logins and roles are changed on the record: Django's user and group pages, audited.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import ObjectDoesNotExist

from accounts.admin_audit import AuditedAdmin
from accounts.models import Tenant

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
