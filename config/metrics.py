"""Prometheus metrics at ``/metrics`` (and ``manage.py metricsserver`` on a host with no
web process), made with the official ``prometheus_client``.

Two sources:

- what each process measured while it worked: the engine reports through
  ``agentruns.runtime.observe`` to the sink below (steps started and their results,
  step and provider-call latency, lease takeovers);
- what the database says now, read at scrape time by ``DatabaseCollector`` with a
  few aggregate queries, each bounded in time (``config.health.probe``).

django-q2's workers are processes of their own, so every process writes its
measurements to files in ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's
multiprocess mode, chosen by settings before anything imports prometheus_client)
and a scrape adds up every process on the host, the dead ones' counts included.
"""

from __future__ import annotations

import atexit
import hmac
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.db.models import Count, Min
from django.http import HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as prometheus_text
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from agentruns.models import Run, RunStatus
from approvals.models import Approval, ApprovalStatus
from config.health import Backlog, SweeperLeaseState, backlog, probe, sweeper_lease
from reconciliation.models import CaseStatus, ReconciliationCase

log = logging.getLogger("holdfast.metrics")

# From a quick read-only call to a model call that takes a while.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0)

# --- what each process measures -------------------------------------------------------
# Labels stay few: agents and tools are declared in code. ``kind`` is the step's kind
# (model, tool, compensation); ``name`` the tool, or "chat" for a model step.

STEPS_STARTED = Counter(
    "holdfast_steps_started",
    "Model and tool calls begun (one per attempt).",
    ["agent", "kind", "name"],
    registry=None,
)
STEP_RESULTS = Counter(
    "holdfast_step_results",
    "Attempts whose answer was committed, by the step's status: succeeded, failed, "
    "unknown (may have taken effect), retrying (to be made again).",
    ["agent", "kind", "name", "status"],
    registry=None,
)
STEP_DURATION = Histogram(
    "holdfast_step_duration_seconds",
    "From a call's start until its answer was committed.",
    ["agent", "kind", "name"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)
PROVIDER_CALL_DURATION = Histogram(
    "holdfast_provider_call_duration_seconds",
    "How long a tool's call or a model call took; outcome ok, or error when it raised.",
    ["agent", "kind", "name", "outcome"],
    buckets=LATENCY_BUCKETS,
    registry=None,
)
LEASE_TAKEOVERS = Counter(
    "holdfast_lease_takeovers",
    "Claims of a run whose previous holder never released its lease (it expired).",
    ["agent"],
    registry=None,
)


@cache
def _series(metric, *labels: str):
    """One labelled series, looked up once: ``labels()`` validates and locks on every
    call, four times a step. The label values are few (agents and tools are declared
    in code), so the cache stays small."""
    return metric.labels(*labels)


class PrometheusSink:
    """Where ``agentruns.runtime.observe`` sends the engine's measurements."""

    def step_started(self, agent: str, kind: str, name: str) -> None:
        _series(STEPS_STARTED, agent, kind, name).inc()

    def step_settled(
        self, agent: str, kind: str, name: str, status: str, seconds: float | None
    ) -> None:
        _series(STEP_RESULTS, agent, kind, name, status).inc()
        if seconds is not None:
            _series(STEP_DURATION, agent, kind, name).observe(seconds)

    def provider_call(self, agent: str, kind: str, name: str, outcome: str, seconds: float) -> None:
        _series(PROVIDER_CALL_DURATION, agent, kind, name, outcome).observe(seconds)

    def lease_taken_over(self, agent: str) -> None:
        _series(LEASE_TAKEOVERS, agent).inc()


def multiprocess_dir() -> Path:
    return Path(settings.PROMETHEUS_MULTIPROC_DIR)


def process_sink() -> PrometheusSink:
    """This process's sink, its metrics directory made (wiring.install(), at start-up)."""
    directory = multiprocess_dir()
    directory.mkdir(parents=True, exist_ok=True)
    # Removes this process's files of live gauges (none so far), which would otherwise
    # outlive it; its counters and histograms stay, so the host's totals never go
    # down. django-q2 does the same for each worker it replaces.
    atexit.register(lambda: mark_process_dead(os.getpid(), str(directory)))
    return PrometheusSink()


# --- what the database says now -----------------------------------------------------


@dataclass(frozen=True)
class Aggregates:
    runs: list[tuple[str, str, int]]  # state, agent, count
    blocked_by_crash_loop: int
    blocked: int
    open_cases: int
    approvals_pending: int
    oldest_approval_seconds: float
    sweeper: SweeperLeaseState
    backlog: Backlog


def read_aggregates() -> Aggregates:
    runs = [
        (row["status"], row["agent_name"], row["n"])
        for row in Run.objects.order_by().values("status", "agent_name").annotate(n=Count("pk"))
    ]
    blocked = Run.objects.filter(status=RunStatus.BLOCKED)
    # "crash loop: …" is the reason Claim writes when a run was claimed too often
    # without progress (agentruns/runtime/claim.py).
    crash_loops = blocked.filter(outcome_detail__startswith="crash loop").count()
    approvals = Approval.objects.filter(status=ApprovalStatus.PENDING).aggregate(
        n=Count("pk"), oldest=Min("created_at")
    )
    lease = sweeper_lease()
    oldest = approvals["oldest"]
    return Aggregates(
        runs=runs,
        blocked_by_crash_loop=crash_loops,
        blocked=sum(n for state, _, n in runs if state == RunStatus.BLOCKED),
        open_cases=ReconciliationCase.objects.filter(status=CaseStatus.OPEN).count(),
        approvals_pending=approvals["n"],
        oldest_approval_seconds=max(0.0, (lease.now - oldest).total_seconds()) if oldest else 0.0,
        sweeper=lease,
        backlog=backlog(),
    )


def _sweeper_lease_seconds() -> float:
    # The time to live each pass renews the lease with (agentruns/sweeper.py, sweep()).
    return max(5.0, settings.HOLDFAST["SWEEP_INTERVAL_SECONDS"] * 4)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class DatabaseCollector:
    """Reads the database's aggregates when Prometheus scrapes, within the probe timeout."""

    def __init__(self) -> None:
        self.failing = False

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        try:
            found = probe(read_aggregates, timeout=settings.HOLDFAST_PROBE_TIMEOUT_SECONDS)
        except Exception as exc:
            # One line per outage, not one per scrape.
            if not self.failing:
                log.warning(
                    "metrics: database aggregates not read: %s: %s", type(exc).__name__, exc
                )
            self.failing = True
            yield _gauge("holdfast_database_up", "Whether the aggregates below were read.", 0)
            return
        if self.failing:
            log.warning("metrics: database aggregates read again")
        self.failing = False
        yield _gauge("holdfast_database_up", "Whether the aggregates below were read.", 1)

        runs = GaugeMetricFamily(
            "holdfast_runs", "Runs in each state, by agent.", labels=["state", "agent"]
        )
        for state, agent, n in found.runs:
            runs.add_metric([state, agent], n)
        yield runs

        blocked = GaugeMetricFamily(
            "holdfast_runs_blocked",
            "Blocked runs (they wait for a person): crash_loop, claimed too often without "
            "progress; other (an agent version not deployed).",
            labels=["reason"],
        )
        blocked.add_metric(["crash_loop"], found.blocked_by_crash_loop)
        blocked.add_metric(["other"], found.blocked - found.blocked_by_crash_loop)
        yield blocked

        yield _gauge(
            "holdfast_effects_awaiting_reconciliation",
            "Effects whose outcome is unknown: open reconciliation cases.",
            found.open_cases,
        )
        yield _gauge(
            "holdfast_approvals_pending",
            "Approvals waiting for a decision.",
            found.approvals_pending,
        )
        yield _gauge(
            "holdfast_approval_oldest_pending_age_seconds",
            "How long the oldest pending approval has waited (0: none waits).",
            found.oldest_approval_seconds,
        )

        yield _gauge(
            "holdfast_sweeper_lease_held",
            "Whether a sweeper holds its lease now.",
            1 if found.sweeper.held else 0,
        )
        overdue = found.sweeper.overdue_seconds
        if overdue is not None:
            yield _gauge(
                "holdfast_sweeper_lag_seconds",
                "Seconds since a sweeper last renewed its lease (absent: none ever held it, "
                "or the last one handed it back).",
                max(0.0, _sweeper_lease_seconds() + overdue),
            )

        depth = GaugeMetricFamily(
            "holdfast_queue_depth",
            "Due runs no worker holds: queued; due (a retry or timer came due); "
            "lease_expired (their worker stopped renewing).",
            labels=["reason"],
        )
        lag = GaugeMetricFamily(
            "holdfast_queue_lag_seconds",
            "How long the longest-waiting of those runs has waited.",
            labels=["reason"],
        )
        for reason, n in found.backlog.depth.items():
            depth.add_metric([reason], n)
            lag.add_metric([reason], found.backlog.waited_seconds[reason])
        yield depth
        yield lag


# --- serving ---------------------------------------------------------------------------


def registry(*, database: bool = True) -> CollectorRegistry:
    """Every process's measurements on this host, and (``database``) the aggregates."""
    scraped = CollectorRegistry()
    MultiProcessCollector(scraped, path=str(multiprocess_dir()))
    if database:
        scraped.register(DatabaseCollector())
    return scraped


@cache
def _web_registry() -> CollectorRegistry:
    return registry(database=True)


def token_accepted(authorization: str) -> bool:
    """Whether ``Authorization`` carries HOLDFAST_METRICS_TOKEN (always, when none is set)."""
    token = settings.HOLDFAST_METRICS_TOKEN
    if not token:
        return True
    scheme, _, given = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )


@login_not_required
@never_cache
@require_GET
def metrics_view(request):
    if not token_accepted(request.headers.get("Authorization", "")):
        refused = HttpResponse(
            "a bearer token is required\n", status=401, content_type="text/plain"
        )
        refused["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return refused
    return HttpResponse(prometheus_text(_web_registry()), content_type=CONTENT_TYPE_LATEST)
