from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

DEFAULT_TENANT_SLUG = "default"
DEFAULT_RETENTION_DAYS = 30


class Tenant(models.Model):
    """An organisation whose runs, operators and settings are kept apart from every other's."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # Per-agent configuration that overrides the agent's own, pinned into every
    # new run: {"refund_support": {"approvals": {"auto_approve_up_to": {"eur": 10000}}}}.
    # Edited through the tenant settings form (config/tenant_settings.py), which checks
    # it against the registered agents' own configuration.
    agent_config = models.JSONField(default=dict, blank=True)
    # Retention (docs/architecture.md §3.14): the events and step payloads of a run that
    # ended longer ago than this move to its archive document and leave the hot tables.
    retention_days = models.PositiveIntegerField(
        default=DEFAULT_RETENTION_DAYS,
        db_default=DEFAULT_RETENTION_DAYS,
        validators=[MinValueValidator(1)],
        help_text=(
            "Days after a run ends before its events and step inputs and results are "
            "archived (the run, its outcome and its steps' timeline stay)."
        ),
    )
    # Payloads of tools that declare personal data are replaced by a redaction marker
    # this many days after their run ended; null: kept as long as the rest.
    personal_data_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        verbose_name="redact personal data after (days)",
        help_text=(
            "Days after a run ends before the inputs and results of its tools that "
            "declare personal data (and its model steps, which read them) are redacted, "
            "here and in its archive. At most the retention period; empty: never earlier."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name or self.slug

    def clean(self) -> None:
        super().clean()
        if (
            self.personal_data_days is not None
            and self.retention_days is not None
            and self.personal_data_days > self.retention_days
        ):
            raise ValidationError(
                {
                    "personal_data_days": (
                        f"at most the retention period ({self.retention_days} days): "
                        "personal data is redacted before its run is archived, never after"
                    )
                }
            )


class Operator(models.Model):
    """A person who works in the dashboard, for exactly one tenant."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="operator"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="operators")
    time_zone = models.CharField(max_length=64, default="UTC")

    class Meta:
        # Permissions the groups are built from (see migration create_operator_groups).
        permissions = [
            ("view_runs", "Can see the tenant's runs"),
            ("start_runs", "Can start runs"),
            ("cancel_runs", "Can cancel runs"),
            ("retry_runs", "Can make a waiting run retry now"),
            ("decide_approvals", "Can approve or reject actions"),
            ("settle_effects", "Can settle effects whose outcome is unknown"),
            ("view_audit", "Can read the audit log"),
            ("view_provider_errors", "Can read providers' own error messages"),
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.tenant.slug})"


TOKEN_PREFIX = "hft_"  # noqa: S105  (a marker that makes leaked tokens findable)


def _digest(token: str) -> str:
    # Tokens are 256 random bits: a fast hash is enough, there is nothing to guess.
    return hashlib.sha256(token.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet):
    def active(self) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiToken(models.Model):
    """A client system's credential, issued to one operator; only its hash is stored.

    The token acts as its owner: in the owner's tenant, with the owner's permissions,
    and what it starts is requested by the owner (who therefore cannot approve it).
    """

    # What a token may be used for (docs/api.md, "Scopes"). A scope is what the client
    # system was trusted with; the owner's permission (the second column) is what the
    # person may do: a request needs both. A token keeps the list it was issued with,
    # so one issued with the first two can still do exactly what it could.
    SCOPE_START = "runs:start"
    SCOPE_READ = "runs:read"
    SCOPE_CANCEL = "runs:cancel"
    SCOPE_RETRY = "runs:retry"
    SCOPE_APPROVALS_READ = "approvals:read"
    SCOPE_APPROVALS_DECIDE = "approvals:decide"
    SCOPE_CASES_READ = "cases:read"
    SCOPE_CASES_SETTLE = "cases:settle"
    SCOPE_AUDIT_READ = "audit:read"
    # scope -> (the owner's permission it needs, what it allows)
    SCOPE_RIGHTS = {
        SCOPE_START: ("start_runs", "start runs"),
        SCOPE_READ: ("view_runs", "list and read runs and their steps"),
        SCOPE_CANCEL: ("cancel_runs", "cancel runs"),
        SCOPE_RETRY: ("retry_runs", "make a waiting run retry now"),
        SCOPE_APPROVALS_READ: ("view_runs", "list and read approvals"),
        SCOPE_APPROVALS_DECIDE: ("decide_approvals", "approve or reject actions"),
        SCOPE_CASES_READ: ("view_runs", "list and read reconciliation cases"),
        SCOPE_CASES_SETTLE: (
            "settle_effects",
            "look up, record observations on and resolve reconciliation cases",
        ),
        SCOPE_AUDIT_READ: ("view_audit", "read the audit log"),
    }
    SCOPES = tuple(SCOPE_RIGHTS)

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    # Null only for tokens issued before tokens had owners: the API refuses those.
    # PROTECT: a login that holds tokens is deactivated, not deleted, so the trail
    # of who acted through them stays whole.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        related_name="api_tokens",
    )
    name = models.CharField(max_length=100)
    # The first characters, kept in clear so an operator can tell tokens apart.
    prefix = models.CharField(max_length=16)
    token_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.tenant.slug})"

    @classmethod
    def issue(cls, *, owner, name: str, scopes: list[str] | None = None) -> tuple[ApiToken, str]:
        """Create a token for an operator, in the operator's tenant, and return it with its
        secret, which is never shown again. ``Operator.DoesNotExist`` if the owner is none."""
        scopes = cls.checked_scopes(list(cls.SCOPES) if scopes is None else scopes)
        tenant = Operator.objects.select_related("tenant").get(user=owner).tenant
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            tenant=tenant,
            owner=owner,
            name=name,
            prefix=secret[:12],
            token_hash=_digest(secret),
            scopes=scopes,
        )
        return token, secret

    @classmethod
    def checked_scopes(cls, scopes: Any) -> list[str]:
        """A list of known scope names (``[]`` grants nothing); ``ValueError`` otherwise."""
        if not isinstance(scopes, list | tuple) or not all(isinstance(s, str) for s in scopes):
            raise ValueError(f"scopes must be a list of names among {', '.join(cls.SCOPES)}")
        unknown = sorted(set(scopes) - set(cls.SCOPES))
        if unknown:
            raise ValueError(f"unknown scope {', '.join(unknown)}; known: {', '.join(cls.SCOPES)}")
        return list(dict.fromkeys(scopes))

    @classmethod
    def authenticate(cls, secret: str) -> ApiToken | None:
        return (
            cls.objects.active()
            .select_related("tenant", "owner")
            .filter(token_hash=_digest(secret))
            .first()
        )

    def allows(self, scope: str) -> bool:
        # A list of names, never a substring of some other shape ("runs:read, runs:start").
        return isinstance(self.scopes, list) and scope in self.scopes


class ProviderAccount(models.Model):
    """Where and as whom one tenant's tools act on one provider.

    The secret is never stored here: ``secret_ref`` names where it is read from when
    a call is made (``accounts.provider_accounts``): ``env:HOLDFAST_SECRET_…`` or
    ``file:<name>`` in the deployment's secrets directory.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="provider_accounts")
    # The name a tool asks for (``call.credentials("payments")``), one of the
    # providers the deployment knows (settings.HOLDFAST_PROVIDER_DEFAULTS).
    provider = models.SlugField(max_length=32)
    # The provider's API; blank means the deployment's own (api.stripe.com, say).
    endpoint = models.URLField(blank=True)
    secret_ref = models.CharField("secret reference", max_length=200, blank=True)
    # The address mail is sent from (a mail account).
    sender = models.EmailField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "provider"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "provider"], name="provider_account_one_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}: {self.provider}"

    def clean(self) -> None:
        from accounts.provider_accounts import check_account

        check_account(self)


class AuditEntry(models.Model):
    """Append-only record of an action taken by a person or a client system."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="audit_entries")
    actor = models.CharField(max_length=200)  # "user:ann", "token:ci (hft_abc…)"
    action = models.CharField(max_length=100)
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=100)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # the audit entries shown on one object's page
            models.Index(fields=["tenant", "object_type", "object_id"], name="audit_object"),
            # the audit page: a tenant's entries, newest first
            models.Index(fields=["tenant", "-created_at"], name="audit_tenant_recent"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.object_type}:{self.object_id}"
