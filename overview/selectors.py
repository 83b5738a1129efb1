"""The overview page's numbers: one function per chart, each for one tenant and range.

Every read is bounded by the tenant and the range and aggregated in the database
(GROUP BY a truncated time). Buckets are hours for the last 24 hours and days (UTC)
for 7, 30 and 90 days. A percentile is PostgreSQL's ``percentile_cont`` there; on
SQLite the same interpolation runs over the durations read in order, so both give
the same numbers.

What each chart counts, and the index it reads by:

- runs: runs *started* in the range by bucket, agent and state, the state folded
  into how the run ended (or "not ended yet"); runs *ended* in the range by the bucket
  of their end (``finished_at``, written when a run ends). Both from an index alone:
  ``run_tenant_started`` (tenant, created_at, agent_name, status, cost_micros) and
  ``run_tenant_ended`` (tenant, finished_at).
- cost: the runs' ``cost_micros`` (micro-dollars) by agent and the bucket the run
  started in, from the same read as the runs chart.

  By day, the days before today are kept ``CLOSED_DAYS_SECONDS`` in the cache and
  today is read on every request: 90 days of the biggest benchmark tenant are 200,000
  index entries, while its page re-reads itself every 30 s.
- approval wait: approvals requested in the range and decided, the time from request
  to decision (``approval_inbox``); and those still waiting, with the oldest's age.
- open cases: reconciliation cases open now, by age (``case_queue``).
- recoveries: runs started in the range that a worker took over after the one holding
  them stopped (the ``recovered`` mark), by the bucket they started in
  (``run_tenant_recovered``). Reconciliations: cases resolved in the range, by the
  bucket of their resolution (``case_queue``).
- slowest tools: tool steps that completed, by name, p50, p95 and longest duration,
  over the newest ``TOOL_RUNS`` runs started in the range (the steps table is the
  biggest: a run's steps are read by ``step_unique_seq_per_run``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.core.cache import cache
from django.db import connection
from django.db.models import (
    Aggregate,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    FloatField,
    Max,
    Sum,
)
from django.db.models.functions import Trunc
from django.utils import timezone

from accounts.models import Tenant
from accounts.services import for_tenant
from agentruns.models import TERMINAL_STATUSES, Run, RunStatus, Step, StepKind
from approvals.models import Approval, ApprovalStatus
from reconciliation.models import CaseStatus, ReconciliationCase


@dataclass(frozen=True)
class Range:
    key: str
    label: str
    span: timedelta
    unit: str  # "hour" or "day": the bucket


RANGES = {
    r.key: r
    for r in [
        Range("24h", "last 24 hours", timedelta(hours=24), "hour"),
        Range("7d", "last 7 days", timedelta(days=7), "day"),
        Range("30d", "last 30 days", timedelta(days=30), "day"),
        Range("90d", "last 90 days", timedelta(days=90), "day"),
    ]
}
DEFAULT_RANGE = "7d"

# How a run ended, in the order the bars stack them (bottom first).
ENDINGS: list[tuple[str, str, frozenset[str]]] = [
    ("completed", "completed", frozenset({RunStatus.COMPLETED})),
    (
        "failed",
        "failed",
        frozenset({RunStatus.FAILED_BEFORE_EFFECT, RunStatus.FAILED_AFTER_EFFECT}),
    ),
    ("compensated", "compensated (undone)", frozenset({RunStatus.COMPENSATED})),
    (
        "cancelled",
        "cancelled",
        frozenset({RunStatus.CANCELLED_NO_EFFECT, RunStatus.CANCELLED_AFTER_EFFECT}),
    ),
    (
        "not_ended",
        "not ended yet",
        frozenset(s for s in RunStatus if s not in TERMINAL_STATUSES),
    ),
]
ENDING_OF = {status: key for key, _, statuses in ENDINGS for status in statuses}
DECIDED_APPROVALS = [s for s in ApprovalStatus if s != ApprovalStatus.PENDING]
# The slowest tools are read from the steps of at most this many runs: the newest
# of the range. A run has ~10 steps; 1,000 runs read ~10,000 steps by index.
TOOL_RUNS = 1_000
TOP_TOOLS = 8


@dataclass(frozen=True)
class Window:
    range: Range
    start: datetime
    end: datetime
    buckets: list[datetime]

    @property
    def unit(self) -> str:
        return self.range.unit


def window_for(key: str | None, now: datetime | None = None) -> Window:
    """The buckets of a range ending with the current hour (or day, UTC)."""
    chosen = RANGES.get(key or "", RANGES[DEFAULT_RANGE])
    now = (now or timezone.now()).astimezone(UTC)
    if chosen.unit == "hour":
        step = timedelta(hours=1)
        end = now.replace(minute=0, second=0, microsecond=0) + step
    else:
        step = timedelta(days=1)
        end = now.replace(hour=0, minute=0, second=0, microsecond=0) + step
    start = end - chosen.span
    count = round(chosen.span / step)
    return Window(chosen, start, end, [start + step * i for i in range(count)])


def _bucket(field_name: str, window: Window):
    return Trunc(field_name, window.unit, tzinfo=UTC)


def _index(window: Window, at: datetime | None) -> int | None:
    """The bucket number of a time (a Trunc result) in the window, None outside."""
    if at is None:
        return None
    at = at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)
    step = timedelta(hours=1) if window.unit == "hour" else timedelta(days=1)
    i = math.floor((at - window.start) / step)
    return i if 0 <= i < len(window.buckets) else None


# --- runs and cost -------------------------------------------------------------------


# How long the runs and cost of the days before today are kept; today is always read.
# A run started on an earlier day that ends now moves between stacks at most this late.
CLOSED_DAYS_SECONDS = 60


@dataclass
class RunCounts:
    """Runs started per bucket, by agent and ending; runs ended per bucket; cost."""

    started: dict[tuple[int, str, str], int] = field(default_factory=dict)  # (i, agent, ending)
    cost: dict[tuple[int, str], int] = field(default_factory=dict)  # (i, agent) → micros
    ended: dict[int, int] = field(default_factory=dict)
    agents: list[str] = field(default_factory=list)  # most runs first

    @property
    def total(self) -> int:
        return sum(self.started.values())

    def add(self, other: RunCounts) -> RunCounts:
        for mine, theirs in [
            (self.started, other.started),
            (self.cost, other.cost),
            (self.ended, other.ended),
        ]:
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        per_agent: dict[str, int] = defaultdict(int)
        for (_, agent, _), n in self.started.items():
            per_agent[agent] += n
        self.agents = sorted(per_agent, key=lambda name: (-per_agent[name], name))
        return self


def run_counts(tenant: Tenant, window: Window) -> RunCounts:
    if window.unit != "day":
        return _run_counts(tenant, window, window.start, window.end)
    today = window.end - timedelta(days=1)
    key = f"overview:runs:{tenant.pk}:{window.start:%Y-%m-%d}:{today:%Y-%m-%d}"
    closed = cache.get(key)
    if closed is None:
        closed = _run_counts(tenant, window, window.start, today)
        cache.set(key, closed, CLOSED_DAYS_SECONDS)
    return RunCounts().add(closed).add(_run_counts(tenant, window, today, window.end))


def _run_counts(tenant: Tenant, window: Window, start: datetime, end: datetime) -> RunCounts:
    """Runs started in [start, end) and runs ended then, by the window's buckets."""
    runs = for_tenant(Run.objects.all(), tenant)
    started = (
        runs.filter(created_at__gte=start, created_at__lt=end)
        .annotate(bucket=_bucket("created_at", window))
        .values_list("bucket", "agent_name", "status")
        .annotate(runs=Count("*"), cost=Sum("cost_micros"))
        .order_by()
    )
    counts = RunCounts()
    for at, agent_name, status, n, cost in started:
        i = _index(window, at)
        if i is None:
            continue
        key = (i, agent_name, ENDING_OF.get(status, "not_ended"))
        counts.started[key] = counts.started.get(key, 0) + n
        counts.cost[(i, agent_name)] = counts.cost.get((i, agent_name), 0) + (cost or 0)
    ended = (
        runs.filter(finished_at__gte=start, finished_at__lt=end)
        .annotate(bucket=_bucket("finished_at", window))
        .values_list("bucket")
        .annotate(runs=Count("*"))
        .order_by()
    )
    for at, n in ended:
        i = _index(window, at)
        if i is not None:
            counts.ended[i] = counts.ended.get(i, 0) + n
    return counts.add(RunCounts())


def usd(micros: int | None) -> str:
    """Micro-dollars as money: 1_234_567 → "1.23 USD"; under a dollar, four decimals."""
    if micros is None:
        return "—"
    value = Decimal(micros).scaleb(-6)
    places = 2 if abs(value) >= 1 or value == 0 else 4
    return f"{value:,.{places}f} USD"


# --- percentiles ---------------------------------------------------------------------


class PercentileCont(Aggregate):
    """PostgreSQL's ordered-set aggregate: the interpolated ``fraction`` percentile."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"
    output_field = FloatField()

    def __init__(self, expression, fraction: float, **extra):
        super().__init__(expression, fraction=float(fraction), **extra)


class EpochSeconds(ExpressionWrapper):
    """A duration in seconds (PostgreSQL): EXTRACT(EPOCH FROM interval)."""

    def as_sql(self, compiler, connection):
        sql, params = compiler.compile(self.expression)
        return f"EXTRACT(EPOCH FROM ({sql}))", params


def percentile(ordered: Sequence[float], fraction: float) -> float | None:
    """``percentile_cont`` of sorted values: linear between the two nearest ranks."""
    if not ordered:
        return None
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Durations:
    count: int
    p50: float | None
    p95: float | None
    longest: float | None


NO_DURATIONS = Durations(0, None, None, None)


def _durations_by(queryset, group: str | None, start: str, end: str) -> dict[str, Durations]:
    """p50, p95 and longest of (``end`` - ``start``) in seconds, per ``group`` ("" for all)."""
    if connection.vendor == "postgresql":
        seconds = EpochSeconds(F(end) - F(start), output_field=DurationField())
        measures = {
            "n": Count("*"),
            "p50": PercentileCont(seconds, 0.5),
            "p95": PercentileCont(seconds, 0.95),
            "longest": Max(seconds),
        }
        if group:
            rows = list(queryset.values(group).annotate(**measures).order_by())
        else:
            rows = [queryset.aggregate(**measures)]
        return {
            (row[group] if group else ""): Durations(
                row["n"], _float(row["p50"]), _float(row["p95"]), _float(row["longest"])
            )
            for row in rows
            if row["n"]
        }
    # SQLite: the same interpolation over the durations, read in one bounded pass.
    fields = [group, start, end] if group else [start, end]
    grouped: dict[str, list[float]] = defaultdict(list)
    for row in queryset.values_list(*fields).order_by():
        name = row[0] if group else ""
        began, ended = row[-2], row[-1]
        grouped[name].append((ended - began).total_seconds())
    result = {}
    for name, values in grouped.items():
        values.sort()
        result[name] = Durations(
            len(values), percentile(values, 0.5), percentile(values, 0.95), values[-1]
        )
    return result


def _float(value) -> float | None:
    return None if value is None else float(value)


# --- approvals and cases -------------------------------------------------------------


@dataclass(frozen=True)
class ApprovalWaits:
    decided: Durations
    waiting: int
    oldest_waiting: float | None  # seconds


def approval_waits(tenant: Tenant, window: Window, now: datetime | None = None) -> ApprovalWaits:
    now = now or timezone.now()
    approvals = for_tenant(Approval.objects.all(), tenant).filter(
        created_at__gte=window.start, created_at__lt=window.end
    )
    decided = approvals.filter(status__in=DECIDED_APPROVALS, decided_at__isnull=False)
    waits = _durations_by(decided, None, "created_at", "decided_at").get("", NO_DURATIONS)
    pending = for_tenant(Approval.objects.all(), tenant).filter(status=ApprovalStatus.PENDING)
    oldest = pending.order_by("created_at").values_list("created_at", flat=True).first()
    return ApprovalWaits(
        decided=waits,
        waiting=pending.count(),
        oldest_waiting=(now - oldest).total_seconds() if oldest else None,
    )


def open_case_ages(tenant: Tenant, now: datetime | None = None) -> Durations:
    """How long the tenant's open reconciliation cases have been open, now."""
    now = now or timezone.now()
    opened = sorted(
        for_tenant(ReconciliationCase.objects.all(), tenant)
        .filter(status=CaseStatus.OPEN)
        .values_list("opened_at", flat=True)
    )
    # Oldest first, so the ages are in increasing order from the end.
    ages = [(now - at).total_seconds() for at in reversed(opened)]
    if not ages:
        return NO_DURATIONS
    return Durations(len(ages), percentile(ages, 0.5), percentile(ages, 0.95), ages[-1])


# --- recoveries and reconciliations --------------------------------------------------


@dataclass
class Repairs:
    recoveries: dict[int, int] = field(default_factory=dict)
    reconciliations: dict[int, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.recoveries.values()) + sum(self.reconciliations.values())


def repairs(tenant: Tenant, window: Window) -> Repairs:
    result = Repairs()
    recoveries = (
        for_tenant(Run.objects.all(), tenant)
        .filter(recovered=True, created_at__gte=window.start, created_at__lt=window.end)
        .annotate(bucket=_bucket("created_at", window))
        .values_list("bucket")
        .annotate(n=Count("*"))
        .order_by()
    )
    _add(result.recoveries, window, recoveries)
    resolved = (
        for_tenant(ReconciliationCase.objects.all(), tenant)
        .filter(
            status=CaseStatus.RESOLVED,
            resolved_at__gte=window.start,
            resolved_at__lt=window.end,
        )
        .annotate(bucket=_bucket("resolved_at", window))
        .values_list("bucket")
        .annotate(n=Count("*"))
        .order_by()
    )
    _add(result.reconciliations, window, resolved)
    return result


def _add(into: dict[int, int], window: Window, rows: Iterable[tuple[datetime, int]]) -> None:
    for at, n in rows:
        i = _index(window, at)
        if i is not None:
            into[i] = into.get(i, 0) + n


# --- the slowest tools ---------------------------------------------------------------


@dataclass(frozen=True)
class ToolTimes:
    tools: list[tuple[str, Durations]]  # slowest p95 first
    runs_read: int
    capped: bool  # the range has more runs than TOOL_RUNS: the newest were read


def slowest_tools(tenant: Tenant, window: Window) -> ToolTimes:
    runs = for_tenant(Run.objects.all(), tenant).filter(
        created_at__gte=window.start, created_at__lt=window.end
    )
    # The newest runs of the range by run_tenant_recent, one more to know if capped.
    run_ids = list(
        runs.order_by("-created_at", "-id").values_list("id", flat=True)[: TOOL_RUNS + 1]
    )
    capped = len(run_ids) > TOOL_RUNS
    run_ids = run_ids[:TOOL_RUNS]
    steps = Step.objects.filter(
        run_id__in=run_ids,
        kind=StepKind.TOOL,
        started_at__isnull=False,
        completed_at__isnull=False,
    )
    times = _durations_by(steps, "name", "started_at", "completed_at") if run_ids else {}
    ordered = sorted(times.items(), key=lambda item: (-(item[1].p95 or 0), item[0]))
    return ToolTimes(ordered[:TOP_TOOLS], len(run_ids), capped)
