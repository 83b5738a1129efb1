"""A tenant's own accounts at the providers its tools act on.

Each tenant's tools act as that tenant: its payments API key, its shop, its mail
sender. A ``ProviderAccount`` row holds where the secret is, never the secret:

- ``env:HOLDFAST_SECRET_<NAME>``: an environment variable of the worker and web
  processes. Only names with that prefix can be named, so a reference can never
  send the deployment's own secrets (``DJANGO_SECRET_KEY``, ``DATABASE_URL``) to a
  provider endpoint;
- ``file:<name>``: a file in the secrets directory (``HOLDFAST_SECRETS_DIR``; a
  mounted Docker or Kubernetes secret, a systemd credential). A plain file name,
  never a path.

References are read when a call is made, so a rotated key is used from the next
call on, and nothing secret is ever written to the database, a log or a page.

The deployment's settings (``PAYMENTS_API_KEY``, ``SHOP_API_BASE``, …; which ones
is ``settings.HOLDFAST_PROVIDER_DEFAULTS``) are the default tenant's accounts when
it has no row of its own, and nobody else's: any other tenant without an account
for a provider is refused that provider, and nothing is sent.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from accounts.models import DEFAULT_TENANT_SLUG, ProviderAccount, Tenant
from accounts.services import audit_record

SECRET_ENV_PREFIX = "HOLDFAST_SECRET_"  # noqa: S105  (a name prefix, not a secret)
_ENV_NAME = re.compile(rf"^{SECRET_ENV_PREFIX}[A-Z0-9_]+$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Credentials:
    """One tenant's account at one provider (``agentruns.runtime.Credentials``)."""

    provider: str
    tenant: str
    endpoint: str = ""
    secret: str = field(default="", repr=False)
    sender: str = ""


class NoProviderAccount(LookupError):
    """The tenant has no account for the provider that can be used now."""


def known_providers() -> list[str]:
    return sorted(settings.HOLDFAST_PROVIDER_DEFAULTS)


def parse_secret_ref(reference: str) -> tuple[str, str]:
    """``("env", NAME)`` or ``("file", name)``; ``ValueError`` saying what is allowed."""
    kind, _, name = reference.partition(":")
    if kind == "env" and _ENV_NAME.match(name):
        return kind, name
    if kind == "file" and _FILE_NAME.match(name):
        return kind, name
    raise ValueError(
        f"{reference!r} is not a secret reference: write env:{SECRET_ENV_PREFIX}<NAME> "
        "(an environment variable whose name starts with "
        f"{SECRET_ENV_PREFIX}) or file:<name> (a file in the secrets directory)"
    )


def check_account(account: ProviderAccount) -> None:
    """What an account row must say to be usable; ``ValidationError`` per field."""
    errors: dict[str, str] = {}
    defaults = settings.HOLDFAST_PROVIDER_DEFAULTS
    if account.provider not in defaults:
        errors["provider"] = (
            f"unknown provider; this deployment knows {', '.join(known_providers())}"
        )
    needs = defaults.get(account.provider, {})
    if "secret" in needs and not account.secret_ref:
        errors["secret_ref"] = "this provider needs a secret reference"  # noqa: S105
    if account.secret_ref:
        try:
            parse_secret_ref(account.secret_ref)
        except ValueError as exc:
            errors["secret_ref"] = str(exc)
    if "sender" in needs and not account.sender:
        errors["sender"] = "a mail account needs the address mail is sent from"
    if account.endpoint and not account.endpoint.startswith(("https://", "http://")):
        errors["endpoint"] = "an http(s) URL, or blank for the deployment's own"
    if errors:
        raise ValidationError(errors)


def read_secret(reference: str, *, tenant: str, provider: str) -> str:
    """The secret the reference names, read now."""
    try:
        kind, name = parse_secret_ref(reference)
    except ValueError as exc:
        raise NoProviderAccount(f"tenant {tenant!r}'s {provider} account: {exc}") from None
    if kind == "env":
        value = os.environ.get(name, "").strip()
        where = f"the environment variable {name} is not set in this process"
    else:
        path = Path(settings.HOLDFAST_SECRETS_DIR) / name
        try:
            value = path.read_text().strip()
        except OSError:
            value = ""
        where = f"the secret file {name} is missing or empty in {settings.HOLDFAST_SECRETS_DIR}"
    if not value:
        raise NoProviderAccount(f"tenant {tenant!r}'s {provider} secret is unavailable: {where}")
    return value


def _deployment(provider: str, tenant: str) -> Credentials:
    names = settings.HOLDFAST_PROVIDER_DEFAULTS[provider]
    return Credentials(
        provider=provider,
        tenant=tenant,
        **{part: str(getattr(settings, setting)) for part, setting in names.items()},
    )


def credentials(tenant_id: int, provider: str) -> Credentials:
    """The tenant's account at ``provider``, its secret read now.

    ``NoProviderAccount`` (a ``LookupError``) says what is missing; the deployment's
    settings stand in only for the default tenant.
    """
    if provider not in settings.HOLDFAST_PROVIDER_DEFAULTS:
        raise NoProviderAccount(f"this deployment knows no provider {provider!r}")
    slug = Tenant.objects.filter(pk=tenant_id).values_list("slug", flat=True).first()
    if slug is None:
        raise NoProviderAccount(f"there is no tenant {tenant_id}")
    account = ProviderAccount.objects.filter(tenant_id=tenant_id, provider=provider).first()
    if account is None:
        if slug == DEFAULT_TENANT_SLUG:
            return _deployment(provider, slug)
        raise NoProviderAccount(
            f"tenant {slug!r} has no {provider} account; an administrator gives it one "
            f"(manage.py setprovideraccount {slug} {provider} …)"
        )
    deployment = _deployment(provider, slug)
    return Credentials(
        provider=provider,
        tenant=slug,
        endpoint=account.endpoint or deployment.endpoint,
        secret=(
            read_secret(account.secret_ref, tenant=slug, provider=provider)
            if account.secret_ref
            else ""
        ),
        sender=account.sender,
    )


class TenantCredentials:
    """The engine's credential source (``agentruns.runtime.CredentialSource``)."""

    def credentials(self, tenant_id: int, provider: str) -> Credentials:
        return credentials(tenant_id, provider)


ACCOUNT_FIELDS = ("endpoint", "secret_ref", "sender")


def _fields(account: ProviderAccount | None) -> dict[str, str] | None:
    return None if account is None else {name: getattr(account, name) for name in ACCOUNT_FIELDS}


@transaction.atomic
def provider_account_set(
    *, tenant: Tenant, provider: str, endpoint: str, secret_ref: str, sender: str, actor: str
) -> ProviderAccount:
    """Give the tenant its account at ``provider`` (or change it), on the record.

    ``ValidationError`` when the account could not be used as written.
    """
    account = (
        ProviderAccount.objects.select_for_update().filter(tenant=tenant, provider=provider).first()
    )
    before = _fields(account)
    if account is None:
        account = ProviderAccount(tenant=tenant, provider=provider)
    account.endpoint, account.secret_ref, account.sender = endpoint, secret_ref, sender
    account.full_clean(exclude=["tenant"])
    account.save()
    audit_record(
        tenant=tenant,
        actor=actor,
        action="provider_account.set",
        object_type="provideraccount",
        object_id=str(account.pk),
        before=before,
        after={"provider": provider, **_fields(account)},
    )
    return account


@transaction.atomic
def provider_account_remove(*, tenant: Tenant, provider: str, actor: str) -> bool:
    """Take the tenant's account at ``provider`` away; its tools are refused from then on."""
    account = (
        ProviderAccount.objects.select_for_update().filter(tenant=tenant, provider=provider).first()
    )
    if account is None:
        return False
    audit_record(
        tenant=tenant,
        actor=actor,
        action="provider_account.remove",
        object_type="provideraccount",
        object_id=str(account.pk),
        before={"provider": provider, **_fields(account)},
    )
    account.delete()
    return True
