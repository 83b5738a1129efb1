"""What the engine tells operators about its work: which run and step a log line is
about, and what it measured. Nothing here may slow a step down or fail one.

Log context: ``run_scoped`` (on ``Claim.execute``) names the run every log line
written meanwhile is about; ``call_started`` adds the step and its effect key
until the next step or the end of the claim. ``log_context()`` reads them (the
JSON log formatter in ``config/logging.py`` does, once the composition root
hands it this function).

Measurements go to a ``Sink`` the composition root installs
(``config/metrics.py``'s Prometheus sink); by default nothing is measured. The
engine calls, in order: ``call_started`` just before a model or tool call,
``call_returned`` just after it, ``step_settled`` once its answer is committed;
``claimed`` when a claim succeeds. A sink that raises is logged once and
ignored.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

log = logging.getLogger("holdfast.observe")

# What a step's recorded status means for its attempt: the rest ("planned",
# "running") is an attempt that will be made again.
SETTLED = frozenset({"succeeded", "failed", "unknown"})


class Sink(Protocol):
    def step_started(self, agent: str, kind: str, name: str) -> None: ...

    def step_settled(
        self, agent: str, kind: str, name: str, status: str, seconds: float | None
    ) -> None: ...

    def provider_call(self, agent: str, kind: str, name: str, outcome: str, seconds: float) -> None:
        """``outcome``: "ok", or "error" when the call raised."""

    def lease_taken_over(self, agent: str) -> None: ...


class NoSink:
    def step_started(self, agent: str, kind: str, name: str) -> None:
        pass

    def step_settled(
        self, agent: str, kind: str, name: str, status: str, seconds: float | None
    ) -> None:
        pass

    def provider_call(self, agent: str, kind: str, name: str, outcome: str, seconds: float) -> None:
        pass

    def lease_taken_over(self, agent: str) -> None:
        pass


_sink: Sink = NoSink()
_sink_failed = False


def install_sink(sink: Sink) -> None:
    """The composition root gives the engine somewhere to send measurements."""
    global _sink, _sink_failed
    _sink = sink
    _sink_failed = False


def _measure(method: str, *args: Any) -> None:
    global _sink_failed
    try:
        getattr(_sink, method)(*args)
    except Exception:
        if not _sink_failed:
            _sink_failed = True
            log.exception("metrics sink failed; further failures are not logged")


@dataclass(frozen=True)
class _Call:
    step_id: str
    effect_key: str | None
    agent: str
    kind: str
    name: str
    # time.monotonic() when the call began; None once its step's latency was measured.
    started: float | None


_run_id: ContextVar[str | None] = ContextVar("holdfast_run_id", default=None)
_call: ContextVar[_Call | None] = ContextVar("holdfast_call", default=None)

Method = TypeVar("Method", bound=Callable[..., Any])


def run_scoped(method: Method) -> Method:
    """Decorate a method of an object with a ``run_id``: log lines written while it
    runs are about that run (and, from ``call_started`` on, about that step)."""

    @functools.wraps(method)
    def scoped(self, *args: Any, **kwargs: Any) -> Any:
        run_token = _run_id.set(str(self.run_id))
        call_token = _call.set(None)
        try:
            return method(self, *args, **kwargs)
        finally:
            _call.reset(call_token)
            _run_id.reset(run_token)

    return scoped  # type: ignore[return-value]


def log_context() -> dict[str, str]:
    """The run, step and effect key the current log line is about, those known."""
    context: dict[str, str] = {}
    run_id = _run_id.get()
    if run_id is not None:
        context["run_id"] = run_id
    call = _call.get()
    if call is not None:
        context["step_id"] = call.step_id
        if call.effect_key:
            context["effect_key"] = call.effect_key
    return context


def call_started(agent: str, kind: str, name: str, step_id: str, effect_key: str | None) -> None:
    """A model or tool call is about to be made for ``step_id``."""
    if _run_id.get() is not None:
        # Only inside a claim's run scope, which clears it again; a call made outside
        # one (a cancel's undo) would otherwise leave its step on later log lines.
        _call.set(_Call(step_id, effect_key, agent, kind, name, time.monotonic()))
    _measure("step_started", agent, str(kind), name)


def call_returned(error: BaseException | None) -> None:
    """The call ``call_started`` announced returned (or raised ``error``)."""
    call = _call.get()
    if call is None or call.started is None:
        return
    outcome = "ok" if error is None else "error"
    _measure(
        "provider_call", call.agent, call.kind, call.name, outcome, time.monotonic() - call.started
    )


def step_settled(agent: str, kind: str, name: str, step_id: str, status: str) -> None:
    """An attempt's answer is committed with ``status`` (the step's new status).

    Its latency, from the call's start, is measured when this process made the call.
    """
    status = str(status)
    if status not in SETTLED:
        status = "retrying"
    seconds = None
    call = _call.get()
    if call is not None and call.step_id == step_id and call.started is not None:
        seconds = time.monotonic() - call.started
        # Once per call: a later answer for the same step (a lookup) has no call here.
        _call.set(_Call(call.step_id, call.effect_key, agent, call.kind, name, None))
    _measure("step_settled", agent, str(kind), name, status, seconds)


def claimed(agent: str, *, took_over: bool) -> None:
    """A claim succeeded; ``took_over``: the lease it took had been held, and expired."""
    if took_over:
        _measure("lease_taken_over", agent)
