"""Named fault points the engine passes through, for crash tests.

Production code calls ``faults.reach(point, step_name)`` at each point; nothing
happens unless a point was armed. Tests arm points in-process with a callable,
or in a real worker process through the environment::

    HOLDFAST_FAULTS="after_call_returned@charge_card=killgroup"

``kill`` sends SIGKILL to the process, ``killgroup`` to its whole process group
(a django-q2 cluster with its pusher and monitor), ``stop`` sends SIGSTOP so a
test can resume the process later with SIGCONT.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass

BEFORE_STEP_RECORDED = "before_step_recorded"
AFTER_STEP_RUNNING = "after_step_running"
AFTER_CALL_RETURNED = "after_call_returned"
AFTER_RESULT_RECORDED = "after_result_recorded"
POINTS = (BEFORE_STEP_RECORDED, AFTER_STEP_RUNNING, AFTER_CALL_RETURNED, AFTER_RESULT_RECORDED)

ENV_VAR = "HOLDFAST_FAULTS"


def _kill_process() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_group() -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _stop_process() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


ACTIONS: dict[str, Callable[[], None]] = {
    "kill": _kill_process,
    "killgroup": _kill_group,
    "stop": _stop_process,
}


@dataclass
class _Armed:
    action: Callable[[], None]
    step_name: str | None
    remaining: int


class FaultPoints:
    def __init__(self) -> None:
        self._armed: dict[str, list[_Armed]] = {}

    def arm(
        self,
        point: str,
        action: Callable[[], None],
        *,
        step_name: str | None = None,
        times: int = 1,
    ) -> None:
        if point not in POINTS:
            raise ValueError(f"unknown fault point {point!r}; known: {', '.join(POINTS)}")
        self._armed.setdefault(point, []).append(_Armed(action, step_name, times))

    def reach(self, point: str, step_name: str) -> None:
        for armed in self._armed.get(point, ()):
            if armed.remaining <= 0:
                continue
            if armed.step_name is not None and armed.step_name != step_name:
                continue
            armed.remaining -= 1
            armed.action()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FaultPoints:
        """Arm points from ``HOLDFAST_FAULTS``: ``point[@step_name]=action;...``."""
        faults = cls()
        spec = (environ if environ is not None else os.environ).get(ENV_VAR, "")
        for item in filter(None, (part.strip() for part in spec.split(";"))):
            target, _, action_name = item.partition("=")
            point, _, step_name = target.partition("@")
            if action_name not in ACTIONS:
                raise ValueError(f"{ENV_VAR}: unknown action {action_name!r} in {item!r}")
            faults.arm(point, ACTIONS[action_name], step_name=step_name or None)
        return faults
