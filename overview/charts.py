"""Chart geometry for server-rendered SVG: numbers in, rectangles and labels out.

Pure functions, no database: ``templates/overview/overview.html``
draws what these return inside an SVG whose ``viewBox`` is ``WIDTH`` wide, so a
chart scales with its column down to a phone's width. Every bar carries the
sentence its ``<title>`` tooltip shows, and every chart keeps the numbers it was
drawn from for the table beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

WIDTH = 400
HEIGHT = 190
SMALL_HEIGHT = 120
LEFT = 46  # room for the y axis labels
RIGHT = 6
TOP = 8
BOTTOM = 24  # room for the x axis labels
MAX_X_LABELS = 6
TICKS = 4  # y axis ticks above zero
BAR_ROW = 36  # height of one row of a horizontal bar chart: its name, then its bars
BAR_THICKNESS = 14


@dataclass(frozen=True)
class Series:
    key: str
    label: str
    tone: int  # the palette index: .tone-<n> in static/css/overview.css


@dataclass(frozen=True)
class Rect:
    x: float
    y: float
    width: float
    height: float
    tone: int
    title: str


@dataclass(frozen=True)
class Label:
    x: float
    y: float
    text: str


def rects_svg(rects: Sequence[Rect], kind: str) -> SafeString:
    """The ``<rect>`` elements of a chart, each with its tooltip (escaped).

    Written here rather than looped over in the template: a 90-day page has thousands
    of rectangles. Only the tooltip is text; the rest are numbers made here."""
    return mark_safe(  # noqa: S308 - the one text, the title, is escaped
        "".join(
            f'<rect class="{kind} tone-{r.tone:d}" x="{r.x:g}" y="{r.y:g}" '
            f'width="{r.width:g}" height="{r.height:g}"><title>{escape(r.title)}</title></rect>'
            for r in rects
        )
    )


@dataclass
class StackedChart:
    """Vertical bars, one per bucket, each stacked by series."""

    height: int
    rects: list[Rect] = field(default_factory=list)
    marks: list[Rect] = field(default_factory=list)  # a second count per bucket, as a tick
    mark_label: str = ""
    x_labels: list[Label] = field(default_factory=list)
    y_ticks: list[Label] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)
    total: float = 0
    width: int = WIDTH
    left: int = LEFT
    right: int = WIDTH - RIGHT
    baseline: float = 0

    @property
    def bars_svg(self) -> SafeString:
        return rects_svg(self.rects, "bar")

    @property
    def marks_svg(self) -> SafeString:
        return rects_svg(self.marks, "mark")


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    text: str  # the value in words, written at the bar's end


@dataclass
class BarRow:
    label: str
    y: float
    rects: list[Rect]
    texts: list[Label]


@dataclass
class BarChart:
    """Horizontal bars, one row per name, one or more bars per row (p50 over p95)."""

    height: int
    rows: list[BarRow] = field(default_factory=list)
    width: int = WIDTH


def nice_step(value: float, *, whole: bool = False) -> float:
    """The smallest of 1, 2, 2.5, 5 times 10^k at or above ``value`` (1 for nothing);
    ``whole``: a whole number, and never 2.5 (for counts)."""
    if value <= 0:
        return 1
    exponent = math.floor(math.log10(value))
    steps = (1, 2, 5, 10) if whole else (1, 2, 2.5, 5, 10)
    for step in steps:
        candidate = step * 10**exponent
        if candidate >= value - 1e-12 and (not whole or candidate >= 1):
            return candidate if not whole else max(1, round(candidate))
    return 10 ** (exponent + 1)


def stacked_bars(
    buckets: Sequence[str],
    series: Sequence[Series],
    values: dict[tuple[int, str], float],
    *,
    describe: Callable[[str, Series, float], str],
    axis_text: Callable[[float], str],
    height: int = HEIGHT,
    short_labels: Sequence[str] | None = None,
    whole: bool = True,
    marks: dict[int, float] | None = None,
    mark_label: str = "",
    describe_mark: Callable[[str, float], str] | None = None,
) -> StackedChart:
    """``values[(bucket index, series key)]``; ``describe(bucket, series, value)`` is
    the tooltip of one segment, ``axis_text`` writes a y tick; ``whole``: the values
    are counts, so the ticks are whole numbers. ``marks[bucket index]`` is a second
    number per bucket drawn as a tick across its bar, ``describe_mark`` its tooltip."""
    marks = marks or {}
    chart = StackedChart(height=height, series=list(series), mark_label=mark_label)
    plot_height = height - TOP - BOTTOM
    chart.baseline = TOP + plot_height
    totals = [sum(values.get((i, s.key), 0) for s in series) for i in range(len(buckets))]
    chart.total = sum(totals)
    highest = max([*totals, *marks.values()], default=0)
    step = nice_step(highest / TICKS, whole=whole)
    top = step * TICKS
    for tick in range(TICKS + 1):
        value = step * tick
        y = chart.baseline - plot_height * tick / TICKS
        chart.y_ticks.append(Label(LEFT - 4, y, axis_text(value)))
    if not buckets:
        return chart
    band = (WIDTH - RIGHT - LEFT) / len(buckets)
    bar_width = max(1.0, band * 0.8)
    every = max(1, math.ceil(len(buckets) / MAX_X_LABELS))
    names = short_labels or buckets
    for i, bucket in enumerate(buckets):
        x = LEFT + band * i + (band - bar_width) / 2
        y = chart.baseline
        for s in series:
            value = values.get((i, s.key), 0)
            if not value:
                continue
            h = plot_height * value / top
            y -= h
            chart.rects.append(
                Rect(
                    round(x, 2),
                    round(y, 2),
                    round(bar_width, 2),
                    round(h, 2),
                    s.tone,
                    describe(bucket, s, value),
                )
            )
        if marks.get(i):
            y = chart.baseline - plot_height * marks[i] / top
            describe_mark = describe_mark or (lambda bucket, n: f"{bucket}: {n:,.0f}")
            chart.marks.append(
                Rect(
                    round(x - 1, 2),
                    round(y - 1.5, 2),
                    round(bar_width + 2, 2),
                    3,
                    14,
                    describe_mark(bucket, marks[i]),
                )
            )
        if i % every == 0:
            chart.x_labels.append(Label(round(LEFT + band * (i + 0.5), 2), height - 8, names[i]))
    return chart


def bar_rows(rows: Sequence[tuple[str, Sequence[Bar]]], *, tones: Sequence[int]) -> BarChart:
    """One row per name: its name and its values in words above, its bars below on the
    chart's one scale.

    A row's bars overlap from the longest (drawn full, lighter) to the shortest (thinner,
    darker), so p50 reads inside p95."""
    longest = max((bar.value for _, bars in rows for bar in bars), default=0)
    room = WIDTH
    chart = BarChart(height=max(BAR_ROW, BAR_ROW * len(rows)) + 2)
    for r, (name, bars) in enumerate(rows):
        y = BAR_ROW * r
        rects = []
        ordered = sorted(range(len(bars)), key=lambda i: -bars[i].value)
        for depth, i in enumerate(ordered):
            bar = bars[i]
            thickness = BAR_THICKNESS / (depth + 1)
            width = max(1.0, room * bar.value / longest) if bar.value and longest else 0
            top = y + 16 + (BAR_THICKNESS - thickness) / 2
            rects.append(
                Rect(
                    0,
                    round(top, 2),
                    round(width, 2),
                    round(thickness, 2),
                    tones[i % len(tones)],
                    f"{name}: {bar.label} {bar.text}",
                )
            )
        words = " · ".join(f"{bar.label} {bar.text}" for bar in bars)
        chart.rows.append(
            BarRow(
                name,
                y + 12,
                rects,
                [Label(WIDTH, y + 12, words)],
            )
        )
    return chart
