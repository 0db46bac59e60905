"""One description of a figure, drawn the same way as a PNG (matplotlib) and as inline SVG.

A :class:`Figure` holds panels; a :class:`Panel` holds its two :class:`Axis` and its series. An
axis is decided once, here, from the values it shows: logarithmic when they are positive and
span more than a decade, else linear; its limits are round numbers around the values (a linear
one with a 5% margin, so that no point sits on the frame) and its ticks lie between them (1-2-5
steps on a linear axis; decades, with 2 and 5 between them when there are at most two decades,
on a log axis), each with its label. The renderers draw exactly those
ticks and labels, so the PNG and the HTML page cannot disagree on a scale, a limit or a tick
(``docs/how-to/compare.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Axis", "Figure", "Panel", "Series", "axis", "tick_label"]

Kind = Literal["step", "line", "points"]


@dataclass(frozen=True)
class Axis:
    """One axis: its label, scale, limits and ticks.

    Attributes:
        label: what it measures.
        log: logarithmic (base 10).
        lo: the lower limit.
        hi: the upper limit (> ``lo``).
        ticks: where ticks and gridlines are, each within [lo, hi], increasing.
        decimals: a linear axis's decimals (its step's); None: as :func:`tick_label` chooses.
    """

    label: str
    log: bool
    lo: float
    hi: float
    ticks: tuple[float, ...]
    decimals: int | None = None

    @property
    def tick_labels(self) -> tuple[str, ...]:
        """The ticks' labels, as both renderers print them: on a linear axis with as many
        decimals as its step needs (1.7895, 1.7900, …: never two equal labels)."""
        return tuple(tick_label(t, self.decimals) for t in self.ticks)

    def fraction(self, value: float) -> float:
        """Where ``value`` lies between the limits: 0 at ``lo``, 1 at ``hi``."""
        if self.log:
            lo, hi = math.log10(self.lo), math.log10(self.hi)
            return (math.log10(value) - lo) / (hi - lo)
        return (value - self.lo) / (self.hi - self.lo)


@dataclass(frozen=True)
class Series:
    """One study's points in a panel.

    Attributes:
        key: the study's name (the legend's entry).
        colour: a CSS/matplotlib colour.
        points: (x, y), finite, sorted by x.
    """

    key: str
    colour: str
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class Panel:
    """One plot: a title, two axes and how its series are drawn.

    Attributes:
        title: its caption.
        kind: ``step`` (a staircase, each value held until the next x), ``line`` (points
            joined) or ``points``.
        x: the horizontal axis.
        y: the vertical axis.
        series: one per study that has points here.
    """

    title: str
    kind: Kind
    x: Axis
    y: Axis
    series: tuple[Series, ...]


@dataclass(frozen=True)
class Figure:
    """Panels side by side under one title."""

    title: str
    panels: tuple[Panel, ...]


def tick_label(value: float, decimals: int | None = None) -> str:
    """A tick's label: ``decimals`` decimals when given (a linear axis's step between 1e-4
    and 1e4), else up to 3 significant digits, no exponent between 1e-3 and 1e4."""
    if value == 0:
        return "0"
    if decimals is not None:
        return f"{value:.{decimals}f}"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.4g}"
    mantissa, exponent = f"{value:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def axis(label: str, values: Sequence[float]) -> Axis:
    """The axis that shows ``values`` (finite numbers; empty: a unit axis).

    Args:
        label: what it measures.
        values: the values it shows.

    Returns:
        A log axis when the values are positive and span more than a decade, else a linear
        one; limits on round numbers around them; ticks on those.
    """
    vals = [float(v) for v in values if math.isfinite(v)]
    if not vals:
        return Axis(label, False, 0.0, 1.0, (0.0, 0.5, 1.0))
    lo, hi = min(vals), max(vals)
    if lo > 0 and hi > 10 * lo:
        return _log_axis(label, lo, hi)
    return _linear_axis(label, lo, hi)


def _linear_axis(label: str, lo: float, hi: float) -> Axis:
    pad = (hi - lo) * 0.05 or abs(lo) * 0.1 or 0.5  # no point on the frame
    lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    ticks = tuple(_clean(k * step) for k in range(first, last + 1))
    decimals = None
    if 1e-4 <= step < 1e4 and max(abs(ticks[0]), abs(ticks[-1])) < 1e5:
        decimals = max(0, -math.floor(math.log10(step) + 1e-9)) + (step / magnitude % 1 > 0)
    return Axis(label, False, ticks[0], ticks[-1], ticks, decimals)


def _log_axis(label: str, lo: float, hi: float) -> Axis:
    first, last = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
    # the limits: the round numbers (1, 2 or 5 times a power of ten) around the values
    rounds = [_clean(m * 10.0**k) for k in range(first, last + 1) for m in (1, 2, 5)]
    low = max(r for r in rounds if r <= lo * (1 + 1e-9))
    high = min(r for r in rounds if r >= hi * (1 - 1e-9))
    steps = (1, 2, 5) if last - first <= 2 else (1,)
    stride = max(1, math.ceil((last - first) / 6))  # at most 7 decades labelled
    marks = [
        _clean(m * 10.0**k)
        for k in range(first, last + 1)
        for m in steps
        if (k - first) % stride == 0
    ]
    ticks = tuple(t for t in marks if low * (1 - 1e-9) <= t <= high * (1 + 1e-9))
    if len(ticks) < 2:  # within one 1-2-5 step: its two ends
        ticks = (low, high)
    return Axis(label, True, low, high, ticks)


def _clean(value: float) -> float:
    """``value`` without float noise (0.30000000000000004 -> 0.3)."""
    return float(f"{value:.12g}")
