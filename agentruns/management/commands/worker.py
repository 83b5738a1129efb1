"""``manage.py worker``: a django-q2 cluster that stops cleanly when told to.

Use it instead of ``qcluster`` (the Procfile and deploy/ do). It is the same
cluster, started the same way, with one difference in how it stops. django-q2's
own main process answers SIGTERM by setting an event the cluster's processes
share; when honcho or systemd signal the whole process group at once, the process
that held that event's lock may already be gone, and the main process waits on it
forever until it is killed (every ``make run`` stopped with Ctrl-C ended that way).

Here the main process only forwards the signal to its process group (once) and
waits: each worker process hands its run back at the next step and exits
(``agentruns.shutdown``), the cluster's supervisor, pusher and monitor end on the
signal, and the main process returns when none of them is left, or after the grace
period and a margin.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand
from django_q.cluster import Cluster

log = logging.getLogger("holdfast.worker")
# Beyond the workers' grace: the supervisor and the monitor end within it.
MARGIN_SECONDS = 2.0


def group_members(pgid: int) -> list[int]:
    """Every live process of the process group (Linux: read from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


class Command(BaseCommand):
    help = (
        "Start a worker cluster (django-q2) that, on SIGTERM, hands each run back at its "
        "next step and exits within HOLDFAST_SHUTDOWN_GRACE_SECONDS."
    )

    def handle(self, *args, **options):
        settings.SECRET_KEY  # noqa: B018 - django-q2 signs its task packages with it
        cluster = Cluster()
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            if stopping:
                return
            stopping = True
            log.info("worker cluster %s: stopping on %s", os.getpid(), signal.Signals(signum).name)
            # Every process of the cluster hears it, also when only this one was
            # signalled (kill PID, systemd KillMode=mixed); this one is already stopping.
            os.killpg(os.getpgid(0), signal.SIGTERM)

        # After Cluster() installed its own: its handler is the one that hangs.
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            cluster.start()
        except RuntimeError:
            if not stopping:
                raise
            # Told to stop while starting: the supervisor ended before it was ready.
            log.info("worker cluster %s: stopped while starting", os.getpid())
            return
        while cluster.sentinel.is_alive() and not stopping:
            time.sleep(0.2)
        deadline = time.monotonic() + settings.HOLDFAST["SHUTDOWN_GRACE_SECONDS"] + MARGIN_SECONDS
        me = os.getpid()
        while time.monotonic() < deadline:
            others = [pid for pid in group_members(os.getpgid(0)) if pid != me]
            cluster.sentinel.join(timeout=0)  # reap it, so it is not counted as alive
            if not [pid for pid in others if pid != os.getppid()]:
                break
            time.sleep(0.1)
        log.info("worker cluster %s: stopped", me)
