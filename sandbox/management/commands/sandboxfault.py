from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from sandbox.faults import DEFAULT_SMTP_CODE, SMTP_KINDS, arm
from sandbox.models import Fault
from sandbox.responses import ApiError

# "refuse" closes the running server's listening socket: only the server can do it.
PER_REQUEST_KINDS = [kind for kind in Fault.Kind.values if kind != "refuse"]


class Command(BaseCommand):
    help = (
        "Arm a sandbox fault for the next N matching requests (or, for the smtp_* kinds, "
        "the next N messages), as POST /_sandbox/faults does, without the sandbox having "
        "to be running (for demos and scripted setups)."
    )

    def add_arguments(self, parser):
        parser.add_argument("kind", choices=PER_REQUEST_KINDS)
        parser.add_argument("--count", type=int, default=1)
        parser.add_argument("--method", default="POST")
        parser.add_argument("--path", default="/v1/refunds")
        parser.add_argument("--delay", type=float, default=0)
        parser.add_argument("--retry-after", type=int, default=1)
        parser.add_argument(
            "--code",
            type=int,
            default=DEFAULT_SMTP_CODE,
            help=f"smtp_refuse's reply to each recipient (default {DEFAULT_SMTP_CODE})",
        )

    def handle(self, *args, kind, count, method, path, delay, retry_after, code, **options):
        try:
            fault = arm(
                {
                    "kind": kind,
                    "count": count,
                    "method": method,
                    "path": path,
                    "delay": delay,
                    "retry_after": retry_after,
                    "code": code,
                }
            )
        except ApiError as exc:
            raise CommandError(str(exc)) from None
        if fault.kind in SMTP_KINDS:
            self.stdout.write(f"armed {fault.kind} for the next {count} message(s)")
        else:
            self.stdout.write(f"armed {fault.kind} for the next {count} {method} {path}")
