from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from accounts.models import ApiToken, Operator
from accounts.services import api_token_issue


class Command(BaseCommand):
    help = (
        "Issue an API token to an operator and print it once; only its hash is kept. "
        "The token acts as its owner: in the owner's tenant, with the owner's permissions."
    )

    def add_arguments(self, parser):
        parser.add_argument("name", help="what the token is for, e.g. 'helpdesk'")
        parser.add_argument(
            "--owner",
            required=True,
            help="username of the operator the token acts as (runs it starts are theirs)",
        )
        parser.add_argument(
            "--scope",
            action="append",
            choices=ApiToken.SCOPES,
            help="repeat for several; default: every scope (docs/api.md, Scopes)",
        )

    def handle(self, *args, name, owner, scope, **options):
        user = get_user_model()._default_manager.filter(username=owner).first()
        if user is None:
            raise CommandError(f"no user {owner!r}")
        if not user.is_active:
            raise CommandError(f"{owner} is deactivated; a token would be refused")
        if not Operator.objects.filter(user=user).exists():
            raise CommandError(f"{owner} is no operator of any tenant; make them one first")
        token, secret = api_token_issue(
            owner=user, name=name, scopes=scope, actor="command:createapitoken"
        )
        self.stderr.write(
            f"Token {token.name} for {owner} in {token.tenant.slug}; it is shown only now:"
        )
        self.stdout.write(secret)
