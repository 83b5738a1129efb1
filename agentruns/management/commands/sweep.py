from __future__ import annotations

import signal
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from agentruns.runtime.engine import new_owner_id
from agentruns.sweeper import push_advance, sweep


class Command(BaseCommand):
    help = (
        "Wake runs whose retry or timer is due, recover runs whose lease expired, and "
        "re-enqueue queued runs nobody picked up. --loop keeps doing it."
    )

    def add_arguments(self, parser):
        parser.add_argument("--loop", action="store_true", help="sweep until stopped")
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            help="seconds between passes (default: HOLDFAST_SWEEP_INTERVAL_SECONDS)",
        )

    def handle(self, *args, loop: bool, interval: float | None, **options):
        interval = interval or settings.HOLDFAST["SWEEP_INTERVAL_SECONDS"]
        owner = new_owner_id()
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        while True:
            report = sweep(owner=owner, push=push_advance)
            if not loop:
                if report is None:
                    self.stdout.write("another sweeper holds the lease; nothing done")
                else:
                    self.stdout.write(
                        f"woke {len(report.woken)}, recovered {len(report.recovered)}, "
                        f"requeued {len(report.requeued)}, orphaned {len(report.orphaned)}"
                    )
                return
            deadline = time.monotonic() + interval
            while not stopping and time.monotonic() < deadline:
                time.sleep(min(0.1, interval))
            if stopping:
                return
