from __future__ import annotations

import getpass
import os
import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from accounts.services import TenantRefused, tenant_create

PASSWORD_ENV = "HOLDFAST_NEW_ADMIN_PASSWORD"  # noqa: S105 (the variable's name)


class Command(BaseCommand):
    help = (
        "Create a tenant, and with --admin its first login: an operator in the admin role "
        "(every console permission; not Django admin staff). Both are on the new tenant's "
        "audit log. Then give it provider accounts (setprovideraccount), approval "
        "authorities and settings (the admin's tenant page)."
    )

    def add_arguments(self, parser):
        parser.add_argument("slug", help="the tenant's short name, e.g. acme (letters, digits, -)")
        parser.add_argument("--name", default="", help="the tenant's name as shown (default: slug)")
        parser.add_argument("--admin", default="", help="username of its first login")
        parser.add_argument("--email", default="", help="that login's e-mail address")
        parser.add_argument(
            "--password-file",
            default="",
            help=f"read the login's password from this file (or set {PASSWORD_ENV}; "
            "in a terminal it is asked for)",
        )

    def handle(self, *args, slug, name, admin, email, password_file, **options):
        password = self._password(admin, password_file) if admin else ""
        try:
            tenant, user = tenant_create(
                slug=slug,
                name=name,
                actor="command:createtenant",
                admin_username=admin,
                admin_email=email,
                admin_password=password,
            )
        except TenantRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Created tenant {tenant.slug} ({tenant.name}).")
        if user is not None:
            self.stdout.write(f"{user.get_username()} may sign in to its console as its admin.")
        self.stdout.write(
            "Until it has provider accounts its tools are refused every provider: "
            f"manage.py setprovideraccount {tenant.slug} payments --secret env:… "
            "Approval authorities and agent settings: the admin's tenant page."
        )

    def _password(self, admin: str, password_file: str) -> str:
        if password_file:
            try:
                return Path(password_file).read_text().rstrip("\n")
            except OSError as exc:
                raise CommandError(f"cannot read {password_file}: {exc.strerror}") from None
        if os.environ.get(PASSWORD_ENV):
            return os.environ[PASSWORD_ENV]
        if not sys.stdin.isatty():
            raise CommandError(
                f"{admin} needs a password: give --password-file or set {PASSWORD_ENV} "
                "(or run the command in a terminal to be asked)"
            )
        first = getpass.getpass(f"Password for {admin}: ")
        if first != getpass.getpass("Again: "):
            raise CommandError("the two passwords differ; nothing was created")
        return first
