from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from accounts.models import DEFAULT_TENANT_SLUG, ProviderAccount, Tenant
from accounts.provider_accounts import (
    SECRET_ENV_PREFIX,
    credentials,
    known_providers,
    provider_account_remove,
    provider_account_set,
)


class Command(BaseCommand):
    help = (
        "Give a tenant its own account at a provider (payments, shop, mail): where its "
        "secret is, never the secret. Without one, only the default tenant acts, with the "
        "deployment's settings; every other tenant's tools are refused that provider. "
        "With no options, shows the tenant's accounts."
    )

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("provider", nargs="?", choices=known_providers())
        parser.add_argument("--endpoint", default="", help="the provider's API (blank: ours)")
        parser.add_argument(
            "--secret",
            default="",
            help=f"env:{SECRET_ENV_PREFIX}NAME or file:name (in HOLDFAST_SECRETS_DIR)",
        )
        parser.add_argument("--sender", default="", help="the From address (mail)")
        parser.add_argument("--remove", action="store_true", help="take the account away")
        parser.add_argument(
            "--check", action="store_true", help="also read each secret now and say if it is there"
        )

    def handle(self, *args, tenant, provider, endpoint, secret, sender, remove, check, **options):
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"no tenant {tenant!r}")
        actor = "command:setprovideraccount"
        if provider is None:
            self._show(found, check=check)
            return
        if remove:
            if not provider_account_remove(tenant=found, provider=provider, actor=actor):
                raise CommandError(f"{tenant} has no {provider} account")
            self.stdout.write(f"Removed {tenant}'s {provider} account.")
            return
        try:
            provider_account_set(
                tenant=found,
                provider=provider,
                endpoint=endpoint,
                secret_ref=secret,
                sender=sender,
                actor=actor,
            )
        except ValidationError as exc:
            problems = "; ".join(
                f"{field}: {' '.join(messages)}" for field, messages in exc.message_dict.items()
            )
            raise CommandError(problems) from None
        self.stdout.write(f"Set {tenant}'s {provider} account.")
        self._show(found, check=check)

    def _show(self, tenant: Tenant, *, check: bool) -> None:
        accounts = {a.provider: a for a in ProviderAccount.objects.filter(tenant=tenant)}
        for provider in known_providers():
            account = accounts.get(provider)
            if account is None:
                where = (
                    "the deployment's settings" if tenant.slug == DEFAULT_TENANT_SLUG else "none"
                )
            else:
                where = _described(account)
            line = f"{tenant.slug} {provider}: {where}"
            if check:
                try:
                    credentials(tenant.pk, provider)
                    line += "  [usable]"
                except LookupError as exc:
                    line += f"  [NOT USABLE: {exc}]"
            self.stdout.write(line)


def _described(account: ProviderAccount) -> str:
    """The account's parts, as set: a blank endpoint is the deployment's own."""
    endpoint = account.endpoint
    if not endpoint and "endpoint" in settings.HOLDFAST_PROVIDER_DEFAULTS[account.provider]:
        endpoint = "(ours)"
    parts = (("endpoint", endpoint), ("secret", account.secret_ref), ("sender", account.sender))
    return ", ".join(f"{name}={value}" for name, value in parts if value)
