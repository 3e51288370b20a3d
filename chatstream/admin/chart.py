"""A stacked bar chart drawn on the server: geometry for an inline SVG, no JavaScript.

Coordinates are computed here and handed to the template as strings (never localised: an SVG
wants ``12.5``, not ``12,5``); every label goes through the template's autoescaping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date

from django.utils.dateformat import format as format_date
from django.utils.translation import pgettext

from ..quota.display import grouped


@dataclass(frozen=True)
class Rect:
    x: str
    y: str
    width: str
    height: str
    fill: str
    label: str  # the tooltip: "2026-03-09: 20 completed"


@dataclass(frozen=True)
class Tick:
    position: str
    text: str


@dataclass(frozen=True)
class Key:
    x: str
    text_x: str
    label: str
    colour: str


@dataclass
class Chart:
    width: int
    height: int
    plot_left: int
    plot_right: int
    baseline: int
    rects: list[Rect]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    legend: list[Key]

    @property
    def y_label_x(self) -> int:
        return self.plot_left - 6

    @property
    def x_label_y(self) -> int:
        return self.baseline + 16


def step_for(maximum: int) -> int:
    """A round tick step (1, 2 or 5 times a power of ten) giving at most five intervals."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if maximum <= 5 * factor * magnitude:
                return factor * magnitude
        magnitude *= 10


def _n(value: float) -> str:
    return f"{value:.1f}"


def draw(days: list[tuple[date, list[int]]], series: list[tuple[str, str]], *,
         width: int = 960, height: int = 280) -> Chart:
    """One bar per day, stacked bottom-up in the order of ``series`` ((label, colour) pairs)."""
    left, right, top, bottom = 44, 8, 30, 28
    plot_width, plot_height = width - left - right, height - top - bottom
    baseline = height - bottom
    largest = max((sum(counts) for _day, counts in days), default=0)
    step = step_for(largest)
    scale_top = max(step, math.ceil(largest / step) * step)
    slot = plot_width / max(len(days), 1)
    bar = max(slot * 0.72, 1.0)
    rects = []
    for i, (day, counts) in enumerate(days):
        x = left + i * slot + (slot - bar) / 2
        stacked = 0.0
        for (label, colour), count in zip(series, counts, strict=True):
            if not count:
                continue
            h = count / scale_top * plot_height
            stacked += h
            rects.append(Rect(_n(x), _n(baseline - stacked), _n(bar), _n(h), colour,
                              f"{day.isoformat()}: {grouped(count)} {label}"))
    every = math.ceil(len(days) / 10) or 1
    day_format = pgettext("date format: a day on the chart's axis", "M j")
    x_ticks = [Tick(_n(left + (i + 0.5) * slot), format_date(day, day_format))
               for i, (day, _counts) in enumerate(days) if i % every == 0]
    y_ticks = [Tick(_n(baseline - value / scale_top * plot_height), grouped(value))
               for value in range(0, scale_top + 1, step)]
    legend = [Key(_n(left + i * 120), _n(left + i * 120 + 14), label, colour)
              for i, (label, colour) in enumerate(series)]
    return Chart(width, height, left, width - right, baseline, rects, x_ticks, y_ticks, legend)
