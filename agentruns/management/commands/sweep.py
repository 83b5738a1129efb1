from __future__ import annotations

import logging
import signal
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from agentruns.runtime.engine import new_owner_id
from agentruns.runtime.outages import Outage, close_broken, is_connection_loss
from agentruns.sweeper import push_advance, release_sweeper_lease, sweep

log = logging.getLogger("holdfast.sweeper")
# After a pass failed for another reason than a lost connection.
FAILED_PASS_PAUSE = 5.0


class Command(BaseCommand):
    help = (
        "Wake runs whose retry or timer is due, recover runs whose lease expired, and "
        "re-enqueue queued runs nobody picked up. --loop keeps doing it, through database "
        "outages; run two (on different hosts): one sweeps, the other takes over within "
        "seconds of it stopping."
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
        if not loop:
            report = sweep(owner=owner, push=push_advance)
            if report is None:
                self.stdout.write("another sweeper holds the lease; nothing done")
            else:
                self.stdout.write(
                    f"woke {len(report.woken)}, recovered {len(report.recovered)}, "
                    f"requeued {len(report.requeued)}, orphaned {len(report.orphaned)}"
                )
            return
        outage = Outage("sweeper", log)
        while not stopping:
            pause = interval
            try:
                sweep(owner=owner, push=push_advance)
            except Exception as exc:
                if is_connection_loss(exc):
                    # The database (and with it the ORM broker) is away: wait and sweep
                    # again; the lease, if lost meanwhile, is taken again or by another.
                    close_broken()
                    pause = max(interval, outage.failed(exc))
                else:
                    # A pass that failed otherwise is retried too, slower: one sweeper
                    # that dies leaves every expired lease to the workers alone.
                    log.exception("sweep pass failed; trying again in %.0f s", FAILED_PASS_PAUSE)
                    pause = FAILED_PASS_PAUSE
            else:
                outage.recovered()
            deadline = time.monotonic() + pause
            while not stopping and time.monotonic() < deadline:
                time.sleep(min(0.1, pause))
        try:
            release_sweeper_lease(owner)
        except Exception as exc:
            # The database is away: the lease lapses by itself within seconds.
            log.warning("could not hand the sweeper lease over: %s", exc)
