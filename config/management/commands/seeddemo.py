from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from accounts.models import Operator, Tenant
from agentruns.runtime import AdmissionError
from agentruns.services import get_registry, run_start
from approvals.models import ApprovalAuthority

# The demo logins' password when none is given. It is published (README), so it is
# used unasked only with DEBUG on; with DEBUG off it must be given like any other
# (`make run` gives it for its local demo).
PUBLISHED_DEMO_PASSWORD = "holdfast-demo"  # noqa: S105
# The demo logins: username and email.
DEMO_LOGINS = (("admin", "admin@example.com"), ("ann", "ann@example.com"))

DEMO_RUNS = [
    ("demo-status-1", "order_status", {"order_id": "A-1001", "follow_up_seconds": 5}),
    ("demo-status-2", "order_status", {"order_id": "A-1002", "follow_up_seconds": 20}),
    ("demo-status-3", "order_status", {"order_id": "A-9999", "follow_up_seconds": 0}),
    ("demo-refund-1", "refund_support", {"order_id": "ord_1001", "amount": 1500}),
    ("demo-refund-2", "refund_support", {"order_id": "ord_1002", "email_customer": True}),
    # Over the auto-approval amount (50.00): it waits in /approvals/ for a person.
    ("demo-refund-3", "refund_support", {"order_id": "ord_1003", "amount": 6000}),
    ("demo-refund-5", "refund_support", {"order_id": "ord_1006", "amount": 15900}),
    ("demo-refund-4", "refund_support", {"order_id": "ord_4040"}),
    # The same agent written with Pydantic AI (support/pydantic_agent.py), offline too.
    (
        "demo-refund-pydantic-ai",
        "refund_support_pydantic_ai",
        {"order_id": "ord_1005", "amount": 700},
    ),
]


class Command(BaseCommand):
    help = (
        "Create the demo tenant, an admin login, the sandbox's orders and payments, and a few "
        "demo runs; the first refund meets a lost reply so its recovery shows. Safe to run again."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--password",
            default="",
            help="the demo logins' password (default: HOLDFAST_DEMO_PASSWORD; with DEBUG on, "
            f"{PUBLISHED_DEMO_PASSWORD!r})",
        )

    def handle(self, *args, **options):
        password = self._password(options["password"])
        tenant, _ = Tenant.objects.get_or_create(slug="default", defaults={"name": "Default"})
        username = "admin"
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User.objects.create_superuser(username, "admin@example.com", password)
        Operator.objects.get_or_create(user=user, defaults={"tenant": tenant})
        admin_group = Group.objects.filter(name="admin").first()
        if admin_group is not None:
            user.groups.add(admin_group)
        approver = self._operator(tenant, "ann", "approver", password)
        self._authority(tenant, "approver", 10_000)  # 100.00 EUR
        self._authority(tenant, "admin", None)  # no limit in EUR
        call_command("seedsandbox", stdout=self.stdout)
        known = set(get_registry().names())
        started = 0
        for request_id, agent_name, payload in DEMO_RUNS:
            if agent_name not in known:
                continue
            try:
                _, created = run_start(
                    tenant=tenant,
                    agent_name=agent_name,
                    input=payload,
                    request_id=request_id,
                    requested_by="seeddemo",
                )
            except AdmissionError as exc:
                self.stderr.write(f"demo run {request_id}: {exc}")
                continue
            if created and request_id == "demo-refund-1":
                # The provider commits the refund, then the reply is lost on the way.
                call_command("sandboxfault", "drop_after_commit", stdout=self.stdout)
            started += created
        # A password that was given is not echoed to the console (or a deployment's log).
        if password is None:
            shown = "(its password, unchanged)"
        else:
            shown = password if password == PUBLISHED_DEMO_PASSWORD else "(the password given)"
        self.stdout.write(
            f"Demo ready: {started} new run(s).\n"
            f"  Site:  http://127.0.0.1:8000/runs/  (admin: /admin/)\n"
            f"  Login: {username} / {shown}\n"
            f"  Approver: {approver.username} / {shown}  (may approve up to 100.00)\n"
            f"  Sandbox: {settings.SANDBOX_URL}/_sandbox/stats"
        )

    def _password(self, given: str) -> str | None:
        """The password for the demo logins still to be created; None when none is.

        Refuses the published password with DEBUG off, and any password the validators
        (AUTH_PASSWORD_VALIDATORS) refuse for one of the logins.
        """
        User = get_user_model()
        missing = [
            (username, email)
            for username, email in DEMO_LOGINS
            if not User.objects.filter(username=username).exists()
        ]
        if not missing:
            return None
        password = given or settings.HOLDFAST_DEMO_PASSWORD
        if not password:
            if not settings.DEBUG:
                raise CommandError(
                    "DEBUG is off: seeddemo will not create logins with the published demo "
                    "password unasked. Give a password with --password or "
                    "HOLDFAST_DEMO_PASSWORD."
                )
            password = PUBLISHED_DEMO_PASSWORD
        for username, email in missing:
            try:
                validate_password(password, user=User(username=username, email=email))
            except ValidationError as exc:
                raise CommandError(
                    f"the password for the demo login {username!r} is refused: "
                    + " ".join(exc.messages)
                ) from None
        return password

    def _operator(self, tenant, username: str, group_name: str, password: str | None):
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            user = User.objects.create_user(username, f"{username}@example.com", password)
        Operator.objects.get_or_create(user=user, defaults={"tenant": tenant})
        group = Group.objects.filter(name=group_name).first()
        if group is not None:
            user.groups.add(group)
        return user

    def _authority(self, tenant, group_name: str, max_amount: int | None) -> None:
        group = Group.objects.filter(name=group_name).first()
        if group is not None:
            # In EUR: the sandbox shop's orders are.
            ApprovalAuthority.objects.get_or_create(
                tenant=tenant, group=group, currency="eur", defaults={"max_amount": max_amount}
            )
