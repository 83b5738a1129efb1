from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.models import ApiToken, Tenant


class Command(BaseCommand):
    help = "Create an API token for a tenant and print it once; only its hash is kept."

    def add_arguments(self, parser):
        parser.add_argument("name", help="what the token is for, e.g. 'helpdesk'")
        parser.add_argument("--tenant", default="default", help="tenant slug")
        parser.add_argument(
            "--scope",
            action="append",
            choices=[ApiToken.SCOPE_START, ApiToken.SCOPE_READ],
            help="repeat for several; default: both",
        )

    def handle(self, *args, name, tenant, scope, **options):
        try:
            tenant_obj = Tenant.objects.get(slug=tenant)
        except Tenant.DoesNotExist:
            raise CommandError(f"no tenant with slug {tenant!r}") from None
        token, secret = ApiToken.issue(tenant=tenant_obj, name=name, scopes=scope)
        self.stderr.write(f"Token {token.name} for {tenant_obj.slug}; it is shown only now:")
        self.stdout.write(secret)
