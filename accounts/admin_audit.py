"""The admin's two stances: records of truth it only shows, and settings it changes on the record.

Runs, steps, approvals, cases and the audit log are written by the engine and by the
audited dashboard pages; the admin shows them and nothing else (``RecordOfTruthAdmin``).
What the admin may still change (tenants, operators, tokens, authorities, logins and
roles) lands in the audit log of every tenant it touches (``AuditedAdmin``), in the
same transaction as the change: the admin's own views wrap each save and delete in one.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.contrib import admin
from django.contrib.auth.models import Permission
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction

from accounts.models import Tenant
from accounts.privacy import mask, mask_text
from accounts.services import audit_record, user_actor_name

log = logging.getLogger("holdfast.accounts")

# Never copied into the audit log: a password hash or a token hash is a secret, and
# last_login changes on every login without anyone deciding it.
UNAUDITED_FIELDS = frozenset({"password", "token_hash", "last_login"})


MASKED_PREFIX = "masked__"


class ShownThroughMask:
    """Every text and JSON field of a record shown through the one masking rule
    (``accounts.privacy``): a step's arguments, an error a provider wrote, an audit
    entry's before and after, an observation's note. ``shown`` names the fields, in
    order (all of them when empty)."""

    shown: tuple[str, ...] = ()

    def get_fields(self, request, obj=None):
        return self._shown_fields()

    def get_readonly_fields(self, request, obj=None):
        return self._shown_fields()

    def _shown_fields(self) -> list[str]:
        fields = [f for f in self.model._meta.fields if not f.auto_created]
        if self.shown:
            by_name = {f.name: f for f in fields}
            fields = [by_name[name] for name in self.shown]
        return [
            f"{MASKED_PREFIX}{field.name}"
            if isinstance(field, models.JSONField | models.TextField | models.CharField)
            and not field.primary_key
            else field.name
            for field in fields
        ]

    def __getattr__(self, name: str):
        if not name.startswith(MASKED_PREFIX):
            raise AttributeError(name)
        field_name = name.removeprefix(MASKED_PREFIX)
        field = self.model._meta.get_field(field_name)

        def shown(obj):
            value = getattr(obj, field.attname)
            if isinstance(field, models.JSONField):
                return json.dumps(mask(value), indent=2, ensure_ascii=False, default=str)
            return mask_text(value) if isinstance(value, str) else value

        shown.short_description = field.verbose_name
        return shown


class RecordOfTruthAdmin(ShownThroughMask, admin.ModelAdmin):
    """Shown, never added, changed or deleted, in one page or in bulk (no delete action),
    every field through the masking rule (``ShownThroughMask``)."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class RecordOfTruthInline(ShownThroughMask, admin.TabularInline):
    """An inline of a record of truth: read-only rows, none added or deleted."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _name(related: models.Model) -> str:
    if isinstance(related, Permission):
        # "accounts.decide_approvals", as has_perm() names it, not its verbose label
        return f"{related.content_type.app_label}.{related.codename}"
    return str(related)


def audit_snapshot(obj: models.Model) -> dict[str, Any]:
    """The object's fields as JSON (many-to-many as sorted names), secrets left out."""
    data: dict[str, Any] = {}
    for field in obj._meta.concrete_fields:
        if field.name in UNAUDITED_FIELDS:
            continue
        data[field.attname] = field.value_from_object(obj)
    if obj.pk is not None:
        for field in obj._meta.many_to_many:
            data[field.name] = sorted(_name(related) for related in getattr(obj, field.name).all())
    # JSONField needs plain JSON: dates, decimals and UUIDs as the admin's encoder writes them.
    return json.loads(json.dumps(data, cls=DjangoJSONEncoder))


class AuditedAdmin(admin.ModelAdmin):
    """Every add, change and delete made here is written to the tenants' audit logs.

    A subclass says which tenants an object belongs to (``audit_tenants``); a change
    that moves an object from one tenant to another is recorded in both.
    """

    def audit_tenants(self, request, obj) -> list[Tenant]:
        tenant = getattr(obj, "tenant", None)
        return [tenant] if tenant is not None else []

    def audit_object_type(self) -> str:
        return self.model._meta.model_name

    def audit(self, request, obj, *, action: str, before, after, tenants: list[Tenant]) -> None:
        unique = {tenant.pk: tenant for tenant in tenants if tenant is not None}
        if not unique:
            # Nothing names a tenant (a login that is nobody's operator, changed by an
            # admin who is no operator either): there is no tenant log to write to.
            log.warning(
                "admin %s of %s %s by %s touches no tenant; not in any audit log",
                action,
                self.audit_object_type(),
                obj.pk,
                user_actor_name(request.user),
            )
        for tenant in unique.values():
            audit_record(
                tenant=tenant,
                actor=user_actor_name(request.user),
                action=action,
                object_type=self.audit_object_type(),
                object_id=str(obj.pk),
                before=before,
                after=after,
                request=request,
            )

    def save_model(self, request, obj, form, change):
        # Read what is stored before the form's values are saved over it; the entry is
        # written in save_related, once the many-to-many fields (a login's groups) are saved.
        stored = type(obj)._default_manager.filter(pk=obj.pk).first() if change else None
        obj._audit_before = audit_snapshot(stored) if stored is not None else None
        obj._audit_tenants_before = (
            self.audit_tenants(request, stored) if stored is not None else []
        )
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        obj = form.instance
        before = getattr(obj, "_audit_before", None)
        after = audit_snapshot(obj)
        if change and before == after:
            return
        self.audit(
            request,
            obj,
            action="admin.change" if change else "admin.add",
            before=before,
            after=after,
            tenants=[*getattr(obj, "_audit_tenants_before", []), *self.audit_tenants(request, obj)],
        )

    def delete_model(self, request, obj):
        before, tenants, pk = audit_snapshot(obj), self.audit_tenants(request, obj), obj.pk
        super().delete_model(request, obj)
        obj.pk = pk  # Model.delete() clears it; the entry names what was deleted
        self.audit(request, obj, action="admin.delete", before=before, after=None, tenants=tenants)

    def delete_queryset(self, request, queryset):
        # The bulk action, one object at a time so each has its entry; all or none.
        with transaction.atomic():
            for obj in queryset:
                self.delete_model(request, obj)
