from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.core.management.base import BaseCommand

from accounts.models import Operator, Tenant
from agentruns.runtime import AdmissionError
from agentruns.services import get_registry, run_start
from approvals.models import ApprovalAuthority

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
]


class Command(BaseCommand):
    help = (
        "Create the demo tenant, an admin login, the sandbox's orders and payments, and a few "
        "demo runs; the first refund meets a lost reply so its recovery shows. Safe to run again."
    )

    def handle(self, *args, **options):
        tenant, _ = Tenant.objects.get_or_create(slug="default", defaults={"name": "Default"})
        username = "admin"
        password = settings.HOLDFAST_DEMO_PASSWORD
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
        self.stdout.write(
            f"Demo ready: {started} new run(s).\n"
            f"  Site:  http://127.0.0.1:8000/runs/  (admin: /admin/)\n"
            f"  Login: {username} / {password}  (set HOLDFAST_DEMO_PASSWORD to change)\n"
            f"  Approver: {approver.username} / {password}  (may approve up to 100.00)\n"
            f"  Sandbox: {settings.SANDBOX_URL}/_sandbox/stats"
        )

    def _operator(self, tenant, username: str, group_name: str, password: str):
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
