from django import forms
from django.contrib import admin, messages
from django.db import models
from django.template.response import TemplateResponse

from accounts.admin_audit import AuditedAdmin, RecordOfTruthAdmin
from accounts.models import ApiToken, AuditEntry, Operator, ProviderAccount, Tenant
from accounts.provider_accounts import SECRET_ENV_PREFIX
from accounts.services import api_token_issue, api_token_revoke, user_actor_name


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]

    def audit_tenants(self, request, obj):
        return [obj]

    # A tenant's audit log protects it, and a deleted tenant would leave no log to
    # record its deletion in.
    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Operator)
class OperatorAdmin(AuditedAdmin):
    list_display = ["user", "tenant", "time_zone"]
    list_filter = ["tenant"]


@admin.register(ProviderAccount)
class ProviderAccountAdmin(AuditedAdmin):
    """Where a tenant's secrets are, never the secrets: every change is audited."""

    list_display = ["tenant", "provider", "endpoint", "secret_ref", "sender", "updated_at"]
    list_filter = ["tenant", "provider"]
    list_select_related = ["tenant"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.base_fields["secret_ref"].help_text = (
            f"env:{SECRET_ENV_PREFIX}NAME (an environment variable of the web and worker "
            "processes) or file:name (a file in the secrets directory). Read at each call; "
            "the secret itself is never stored here."
        )
        form.base_fields["endpoint"].help_text = "Blank: the deployment's own endpoint."
        return form


class ApiTokenIssueForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=[(scope, scope) for scope in ApiToken.SCOPES],
        initial=list(ApiToken.SCOPES),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: the token may do nothing.",
    )

    class Meta:
        model = ApiToken
        fields = ["owner", "name", "scopes"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "owner",
        "tenant",
        "prefix",
        "scopes",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["tenant"]
    list_select_related = ["tenant", "owner"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        # Issued to an operator, in the operator's tenant: the tenant is not chosen.
        if obj is None:
            return ["owner", "name", "scopes"]
        return [
            "owner",
            "tenant",
            "name",
            "prefix",
            "scopes",
            "created_at",
            "last_used_at",
            "revoked_at",
        ]

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = ApiTokenIssueForm
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None:
            owner = form.base_fields["owner"]
            owner.required = True
            owner.queryset = owner.queryset.filter(is_active=True, operator__isnull=False)
            owner.help_text = "The operator the token acts as: their tenant, their role."
        return form

    # Issued once, then fixed: no page changes a token's tenant or scopes, or takes
    # back a revocation; the one change is the audited "Revoke selected tokens".
    def has_change_permission(self, request, obj=None):
        return False

    # Deleting would erase which token started which runs; revoke it instead.
    def has_delete_permission(self, request, obj=None):
        return False

    def has_revoke_permission(self, request):
        return request.user.has_perm("accounts.change_apitoken")

    @admin.action(description="Revoke selected tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        actor = user_actor_name(request.user)
        revoked = sum(
            api_token_revoke(token=token, actor=actor, request=request)
            for token in queryset.select_related("tenant")
        )
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)

    # Issuing writes its own audit entry (token.issue); a token has no related rows.
    def save_model(self, request, obj, form, change):
        token, secret = api_token_issue(
            owner=obj.owner,
            name=obj.name,
            scopes=list(form.cleaned_data["scopes"]),
            actor=user_actor_name(request.user),
            request=request,
        )
        # The admin logs and links the form's object: make it the issued one.
        obj.pk, obj.tenant, obj.prefix = token.pk, token.tenant, token.prefix
        # Shown once, in the answer to this request: never through messages (a cookie)
        # or a log line.
        request._issued_secret = secret

    def response_add(self, request, obj, post_url_continue=None):
        secret = getattr(request, "_issued_secret", None)
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        response = TemplateResponse(
            request,
            "admin/accounts/apitoken/issued.html",
            {
                **self.admin_site.each_context(request),
                "title": "Token issued",
                "token": obj,
                "secret": secret,
                "opts": self.model._meta,
            },
        )
        response["Cache-Control"] = "no-store"
        return response


@admin.register(AuditEntry)
class AuditEntryAdmin(RecordOfTruthAdmin):
    """Append-only: nobody edits or deletes the trail."""

    list_display = ["created_at", "tenant", "actor", "action", "object_type", "object_id"]
    list_filter = ["tenant", "action"]
    search_fields = ["actor", "object_id"]
