"""A worker that is told to stop hands its run back instead of dying in the middle of it.

honcho and systemd stop a worker cluster by sending SIGTERM to every process in it,
then SIGKILL a few seconds later (honcho 5 s, systemd 90 s). django-q2's worker
processes take SIGTERM's default action, which is to die on the spot: the run they
held would wait out its lease (and a send its send budget) before anyone continued
it. Each worker process instead, on SIGTERM:

- when idle, exits at once;
- when advancing a run, lets the engine stop at the next step boundary: the run is
  released (``queued``) and knocked on again, so another worker continues it at
  once; then the process exits;
- when a call is still in flight after ``SHUTDOWN_GRACE_SECONDS`` (4 s), exits
  without waiting for it: the run is recovered the usual way once its lease lapses,
  exactly as after a crash, and nothing is sent twice.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from django.conf import settings

log = logging.getLogger("holdfast.worker")

_stopping = threading.Event()
_busy = threading.Event()


def stopping() -> bool:
    """Whether this process was told to stop (the engine's boundary check asks)."""
    return _stopping.is_set()


def install(**kwargs) -> None:
    """django-q2's ``post_spawn``: runs in each worker process as it starts."""
    _stopping.clear()
    _busy.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)


class Working:
    """Marks the process busy while a task advances a run; exits after it if told to stop."""

    def __enter__(self) -> None:
        _busy.set()

    def __exit__(self, *exc_info) -> None:
        _busy.clear()
        if _stopping.is_set():
            log.info("worker %s: run handed back; exiting", os.getpid())
            # Out of django-q2's worker loop (it catches Exception, not this): the
            # process ends instead of taking the next task of a stopping cluster.
            raise SystemExit(0)


def _on_sigterm(signum, frame) -> None:
    if _stopping.is_set():
        return
    _stopping.set()
    if not _busy.is_set():
        log.info("worker %s: stopping (idle)", os.getpid())
        raise SystemExit(0)
    grace = settings.HOLDFAST["SHUTDOWN_GRACE_SECONDS"]
    log.info(
        "worker %s: stopping; handing the run back at its next step (at most %.0f s)",
        os.getpid(),
        grace,
    )
    timer = threading.Timer(grace, _abandon)
    timer.daemon = True
    timer.start()


def _abandon() -> None:
    # A call still in flight: its answer cannot be waited for. Leaving now is what a
    # crash does, and the engine is built for that (the lease lapses, recovery runs).
    log.warning("worker %s: a call was still in flight past the grace period; exiting", os.getpid())
    logging.shutdown()
    os._exit(0)
