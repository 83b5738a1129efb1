"""django-q2 entry points. A task only wakes a run; the run's lease decides who advances it."""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from agentruns.consumers import tenant_group
from agentruns.models import Run
from agentruns.services import build_engine

log = logging.getLogger("holdfast.tasks")


def advance_run(run_id: str) -> str:
    outcome = build_engine().advance(run_id)
    log.info("run %s: %s", run_id, outcome)
    _poke_pages(run_id)
    return outcome


def _poke_pages(run_id: str) -> None:
    """With Redis, tell the web processes' live pages to look at the event log now.

    Only a hint: without it (or if it is lost) pages find the change at their next
    poll of the event log.
    """
    if not settings.REDIS_URL:
        return
    tenant_id = Run.objects.filter(pk=run_id).values_list("tenant_id", flat=True).first()
    if tenant_id is None:
        return
    try:
        async_to_sync(get_channel_layer().group_send)(
            tenant_group(tenant_id), {"type": "runs.poke"}
        )
    except Exception:
        log.warning("run %s: could not poke live pages", run_id, exc_info=True)
