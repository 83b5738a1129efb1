from __future__ import annotations

import logging
import signal
import threading

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from sandbox.control import ControlTokenMissing, ensure_control_token
from sandbox.idempotency import forget_in_flight
from sandbox.models import DB
from sandbox.server import SandboxService

# The sandbox serves concurrent requests from one process; its writes are short, so a
# writer that finds SQLite's lock taken waits for it rather than failing fast.
SQLITE_BUSY_TIMEOUT = 10.0


class Command(BaseCommand):
    help = "Run the sandbox: Stripe-shaped payments API, shop API and SMTP sink."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--host", default=settings.SANDBOX_HOST)
        parser.add_argument("--port", type=int, default=settings.SANDBOX_PORT)
        parser.add_argument("--smtp-port", type=int, default=settings.SANDBOX_SMTP_PORT)

    def handle(self, *args, host: str, port: int, smtp_port: int, **options) -> None:
        try:
            control_token, token_file = ensure_control_token()
        except (ControlTokenMissing, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from None
        database = connections.settings[DB]
        if database["ENGINE"].endswith("sqlite3"):
            database.setdefault("OPTIONS", {})["timeout"] = max(
                float(database["OPTIONS"].get("timeout", 0)), SQLITE_BUSY_TIMEOUT
            )
        # aiosmtpd logs every connection at INFO; the sink logs each accepted message.
        logging.getLogger("mail.log").setLevel(logging.WARNING)
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        forgotten = forget_in_flight()
        if forgotten:
            self.stdout.write(f"Forgot {forgotten} idempotency key(s) left in flight by a crash")
        connections.close_all()
        service = SandboxService(host, port, smtp_port, control_token=control_token)
        service.start()
        self.stdout.write(
            f"Sandbox on http://{host}:{port} (SMTP {host}:{smtp_port}), "
            f"database {connections.settings[DB]['NAME']}",
        )
        where = token_file or "SANDBOX_CONTROL_TOKEN"
        self.stdout.write(
            f"Control routes (/_sandbox/) need 'Authorization: Bearer <token>' with the token "
            f"in {where}"
        )
        self.stdout.flush()
        try:
            stop.wait()
        finally:
            service.stop()
            self.stdout.write("Sandbox stopped")
