"""django-q2 entry points. A task only wakes a run; the run's lease decides who advances it."""

from __future__ import annotations

import logging

from agentruns.services import build_engine

log = logging.getLogger("holdfast.tasks")


def advance_run(run_id: str) -> str:
    outcome = build_engine().advance(run_id)
    log.info("run %s: %s", run_id, outcome)
    return outcome
