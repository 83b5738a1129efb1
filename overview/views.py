"""The overview page: the tenant's runs, cost, waits and repairs over a chosen range, drawn."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from accounts.access import operator_required
from accounts.models import Tenant
from overview import selectors
from overview.charts import Bar, Series, bar_rows, stacked_bars

# Seconds between the page's re-reads of its charts (hx-trigger="every 30s").
REFRESH_SECONDS = 30
SMALL_MULTIPLES = 6  # agents drawn each in a chart of its own
AGENT_TONES = 6  # .tone-5 … .tone-10; more agents share "other agents"
ENDING_SERIES = [Series(key, label, tone) for tone, (key, label, _) in enumerate(selectors.ENDINGS)]


@require_GET
@operator_required("view_runs")
def overview_page(request: HttpRequest) -> HttpResponse:
    context = overview_context(request.tenant, request.GET.get("range"))
    template = "overview/overview.html#charts" if request.htmx else "overview/overview.html"
    return render(request, template, context)


def overview_context(tenant: Tenant, range_key: str | None) -> dict[str, Any]:
    now = timezone.now()
    window = selectors.window_for(range_key, now)
    counts = selectors.run_counts(tenant, window)
    labels = [_bucket_label(window, at) for at in window.buckets]
    short = [_short_label(window, at) for at in window.buckets]
    return {
        "ranges": selectors.RANGES.values(),
        "window": window,
        "now": now,
        "refresh_seconds": REFRESH_SECONDS,
        "unit_word": _unit_word(window),
        "counts": counts,
        "ended_total": sum(counts.ended.values()),
        "rows": _run_rows(window, counts, labels),
        "runs_chart": _runs_chart(window, counts, labels, short, agent=None),
        "agent_charts": [
            (agent, _runs_chart(window, counts, labels, short, agent=agent, small=True))
            for agent in counts.agents[:SMALL_MULTIPLES]
        ],
        "agent_totals": _agent_totals(counts),
        **_cost(window, counts, labels, short),
        **_waits(tenant, window, now),
        **_repairs(tenant, window, labels, short),
        **_tools(tenant, window),
    }


def _unit_word(window: selectors.Window) -> str:
    return "hour" if window.unit == "hour" else "day"


def _bucket_label(window: selectors.Window, at: datetime) -> str:
    if window.unit == "hour":
        end = at + timedelta(hours=1)
        return f"{at:%d %b %H:%M} to {end:%H:%M} UTC"
    return f"{at:%a %d %b %Y} (UTC)"


def _short_label(window: selectors.Window, at: datetime) -> str:
    return f"{at:%H:%M}" if window.unit == "hour" else f"{at:%d %b}"


def _count_text(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def _runs_chart(window, counts, labels, short, *, agent: str | None, small: bool = False):
    # The runs that ended in each bucket are a tick across its bar (all agents only:
    # the ended read is not split by agent).
    values: dict[tuple[int, str], float] = {}
    for (i, name, ending), n in counts.started.items():
        if agent is None or name == agent:
            values[(i, ending)] = values.get((i, ending), 0) + n
    who = f" of {agent}" if agent else ""
    return stacked_bars(
        labels,
        ENDING_SERIES,
        values,
        describe=lambda bucket, series, n: (
            f"{bucket}: {n:,.0f} run{'' if n == 1 else 's'}{who} started, {series.label}"
        ),
        axis_text=_count_text,
        height=120 if small else 190,
        short_labels=short,
        marks=counts.ended if agent is None else None,
        mark_label="" if agent else f"ended in this {_unit_word(window)}",
        describe_mark=lambda bucket, n: f"{bucket}: {n:,.0f} run{'' if n == 1 else 's'} ended",
    )


def _run_rows(window, counts, labels) -> list[dict[str, Any]]:
    """The runs chart's numbers, one row per bucket, for its table."""
    rows = []
    for i, label in enumerate(labels):
        by_ending = {key: 0 for key, _, _ in selectors.ENDINGS}
        for (j, _, ending), n in counts.started.items():
            if j == i:
                by_ending[ending] += n
        rows.append(
            {
                "label": label,
                "started": sum(by_ending.values()),
                "endings": [by_ending[key] for key, _, _ in selectors.ENDINGS],
                "ended": counts.ended.get(i, 0),
            }
        )
    return rows


def _agent_totals(counts) -> list[dict[str, Any]]:
    totals = []
    for agent in counts.agents:
        by_ending = {key: 0 for key, _, _ in selectors.ENDINGS}
        for (_, name, ending), n in counts.started.items():
            if name == agent:
                by_ending[ending] += n
        cost = sum(c for (_, name), c in counts.cost.items() if name == agent)
        totals.append(
            {
                "agent": agent,
                "started": sum(by_ending.values()),
                "endings": [by_ending[key] for key, _, _ in selectors.ENDINGS],
                "cost": selectors.usd(cost),
            }
        )
    return totals


def _cost(window, counts, labels, short) -> dict[str, Any]:
    named = counts.agents[:AGENT_TONES]
    series = [Series(agent, agent, 5 + n) for n, agent in enumerate(named)]
    if len(counts.agents) > AGENT_TONES:
        series.append(Series("", "other agents", 11))
    values: dict[tuple[int, str], float] = {}
    for (i, agent), micros in counts.cost.items():
        key = agent if agent in named else ""
        values[(i, key)] = values.get((i, key), 0) + micros
    chart = stacked_bars(
        labels,
        series,
        values,
        describe=lambda bucket, s, micros: f"{bucket}: {s.label} cost {selectors.usd(int(micros))}",
        axis_text=_axis_usd,
        short_labels=short,
        whole=False,
    )
    rows = [
        {
            "label": label,
            "costs": [selectors.usd(int(values.get((i, s.key), 0))) for s in series],
            "total": selectors.usd(int(sum(values.get((i, s.key), 0) for s in series))),
        }
        for i, label in enumerate(labels)
    ]
    return {
        "cost_chart": chart,
        "cost_rows": rows,
        "cost_total": selectors.usd(sum(counts.cost.values())),
    }


def _axis_usd(micros: float) -> str:
    dollars = micros / 1_000_000
    if dollars == 0:
        return "0"
    if dollars >= 100:
        return f"{dollars:,.0f}"
    if dollars >= 1:
        return f"{dollars:,.2f}".rstrip("0").rstrip(".")
    return f"{dollars:.4f}".rstrip("0").rstrip(".")


def duration_text(seconds: float | None) -> str:
    """Seconds in words an operator reads at a glance: "850 ms", "12.5 s", "4 min 10 s"."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _durations_chart(rows: list[tuple[str, selectors.Durations]]):
    return bar_rows(
        [
            (
                name,
                [
                    Bar("p50", d.p50 or 0, duration_text(d.p50)),
                    Bar("p95", d.p95 or 0, duration_text(d.p95)),
                ],
            )
            for name, d in rows
        ],
        tones=[12, 13],
    )


def _waits(tenant, window, now) -> dict[str, Any]:
    waits = selectors.approval_waits(tenant, window, now)
    cases = selectors.open_case_ages(tenant, now)
    rows = []
    if waits.decided.count:
        rows.append(("approval wait (decided)", waits.decided))
    if cases.count:
        rows.append(("open case age", cases))
    return {
        "waits": waits,
        "cases": cases,
        "waits_chart": _durations_chart(rows) if rows else None,
        "oldest_waiting_text": duration_text(waits.oldest_waiting),
        "wait_text": {
            "p50": duration_text(waits.decided.p50),
            "p95": duration_text(waits.decided.p95),
            "longest": duration_text(waits.decided.longest),
        },
        "case_text": {
            "p50": duration_text(cases.p50),
            "p95": duration_text(cases.p95),
            "longest": duration_text(cases.longest),
        },
    }


REPAIR_SERIES = [
    Series("recoveries", "runs recovered from a stopped worker (by start)", 5),
    Series("reconciliations", "reconciliation cases resolved", 6),
]


def _repairs(tenant, window, labels, short) -> dict[str, Any]:
    found = selectors.repairs(tenant, window)
    values: dict[tuple[int, str], float] = {}
    for i, n in found.recoveries.items():
        values[(i, "recoveries")] = n
    for i, n in found.reconciliations.items():
        values[(i, "reconciliations")] = n
    chart = stacked_bars(
        labels,
        REPAIR_SERIES,
        values,
        describe=lambda bucket, s, n: f"{bucket}: {n:,.0f} {s.label}",
        axis_text=_count_text,
        height=140,
        short_labels=short,
    )
    rows = [
        {
            "label": label,
            "recoveries": found.recoveries.get(i, 0),
            "reconciliations": found.reconciliations.get(i, 0),
        }
        for i, label in enumerate(labels)
        if found.recoveries.get(i) or found.reconciliations.get(i)
    ]
    return {"repairs": found, "repairs_chart": chart, "repair_rows": rows}


def _tools(tenant, window) -> dict[str, Any]:
    times = selectors.slowest_tools(tenant, window)
    return {
        "tool_times": times,
        "tools_chart": _durations_chart(times.tools) if times.tools else None,
        "tool_rows": [
            {
                "name": name,
                "count": d.count,
                "p50": duration_text(d.p50),
                "p95": duration_text(d.p95),
                "longest": duration_text(d.longest),
            }
            for name, d in times.tools
        ],
    }
