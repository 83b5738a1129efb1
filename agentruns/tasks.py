"""django-q2 entry points. A task only wakes a run; the run's lease decides who advances it."""

from __future__ import annotations

import logging
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from agentruns import shutdown, sweeper
from agentruns.consumers import tenant_group
from agentruns.models import Run
from agentruns.runtime.engine import new_owner_id
from agentruns.runtime.outages import Outage, through_outages
from agentruns.services import build_engine

log = logging.getLogger("holdfast.tasks")
# One per worker process: an outage is two log lines, not one per task.
TASK_OUTAGE = Outage("worker", logging.getLogger("holdfast.tasks"))
# How often one worker process also looks for runs whose lease expired, so that
# recovery does not depend on the sweeper alone.
HELP_RECOVER_EVERY_SECONDS = 5.0
HELP_RECOVER_LIMIT = 20
_last_help = 0.0


# When this process last finished advancing a run (its connection then worked). A task
# that starts soon after skips Django's per-task health check (CONN_HEALTH_CHECKS: a
# SELECT 1 before the first statement of every task): the connection was proven a
# moment ago, and one lost since is waited out below like any other loss.
PROVEN_SECONDS = 1.0
_proven_at: float | None = None


def advance_run(run_id: str) -> str:
    global _proven_at
    with shutdown.Working():
        _trust_a_connection_just_proven()
        # A lost connection before the run is claimed (the first read, the claim) is
        # waited out; every statement after it retries on its own (the Store).
        outcome = through_outages(
            lambda: build_engine().advance(run_id),
            outage=TASK_OUTAGE,
            budget=settings.HOLDFAST["RECONNECT_SECONDS"],
        )
        _proven_at = time.monotonic()
        log.info("run %s: %s", run_id, outcome)
        _poke_pages(run_id)
        _help_recover()
    return outcome


def _trust_a_connection_just_proven() -> None:
    connection = connections[DEFAULT_DB_ALIAS]
    if (
        _proven_at is not None
        and connection.connection is not None
        and not connection.errors_occurred
        and time.monotonic() - _proven_at < PROVEN_SECONDS
    ):
        connection.health_check_done = True


def _help_recover() -> None:
    """Knock on runs whose worker died (their lease expired), as the sweeper does.

    At most every few seconds per process, and never twice on one run: the knock is
    a compare-and-set on ``enqueued_at`` shared with the sweeper, and the claim
    decides who advances.
    """
    global _last_help
    now = time.monotonic()
    if now - _last_help < HELP_RECOVER_EVERY_SECONDS:
        return
    _last_help = now
    sweep_pass = sweeper.SweepPass(
        owner=new_owner_id(),
        push=sweeper.push_advance,
        limit=HELP_RECOVER_LIMIT,
        report=sweeper.SweepReport(),
    )
    try:
        sweeper.recover_expired(sweep_pass)
    except Exception:
        log.warning("could not look for runs whose lease expired", exc_info=True)
        return
    if sweep_pass.report.recovered:
        log.info(
            "recovered %d run(s) whose lease expired: %s",
            len(sweep_pass.report.recovered),
            ", ".join(sweep_pass.report.recovered),
        )


def _poke_pages(run_id: str) -> None:
    """With Redis on SQLite, tell the web processes' live pages to look at the event
    log now.

    Only a hint: without it (or if it is lost) pages find the change at their
    follower's next poll. On PostgreSQL the engine's doorbell has told them already
    (agentruns/doorbell.py), so nothing is sent here.
    """
    if not settings.REDIS_URL or connections[DEFAULT_DB_ALIAS].vendor == "postgresql":
        return
    try:
        tenant_id = Run.objects.filter(pk=run_id).values_list("tenant_id", flat=True).first()
        if tenant_id is None:
            return
        async_to_sync(get_channel_layer().group_send)(
            tenant_group(tenant_id), {"type": "runs.poke"}
        )
    except Exception as exc:
        # Redis away: the pages find the change at their next poll. One line per
        # outage, not a traceback per run.
        if not POKE_OUTAGE.down:
            POKE_OUTAGE.failed(exc)
        return
    POKE_OUTAGE.recovered()


# Redis (the channel layer) being away costs the pages one poll interval, nothing more.
POKE_OUTAGE = Outage("live-page pokes", logging.getLogger("holdfast.tasks"), resource="Redis")
