"""One description of a figure (``fedtune.tuning.analysis.figure``): its axes, and the PNG drawn from it."""

from __future__ import annotations

import itertools
import math

import pytest

from fedtune.tuning.analysis.compare import StudyInput, compare
from fedtune.tuning.analysis.compare_render import comparison_figure
from fedtune.tuning.analysis.figure import axis, tick_label
from fedtune.tuning.analysis.figure_png import matplotlib_figure
from fedtune.tuning.analysis.tradeoff import TrialCurve, analyze_tradeoff

TASK = {"name": "digits", "clients": 10, "seed": 0}


def wide_comparison():
    """Three studies whose envelopes fall from hundreds to about 2 (the docs' study of methods
    fell from 337 to 1.79): more than two decades."""

    def tradeoff(floors: list[float], scale: float) -> dict:
        rounds = list(range(1, 31))
        curves = [
            TrialCurve(
                i, {"client_lr": 0.1 / (i + 1)}, rounds, [f + scale * 0.6**r for r in rounds]
            )
            for i, f in enumerate(floors)
        ]
        return analyze_tradeoff(curves, last_rounds=3, smooth_window=1).to_dict()

    studies = (
        ("fedavg", [1.79, 2.5, 3.0], 560),
        ("fedavgm", [1.9, 2.2], 300),
        ("fedprox", [2.1], 400),
    )
    return compare(
        [
            StudyInput(
                name,
                {"name": name, "algorithm": name, "task": TASK, "objective": {}},
                tradeoff(floors, scale),
            )
            for name, floors, scale in studies
        ]
    )


@pytest.mark.parametrize(
    ("values", "log", "ticks"),
    [
        ([1.79, 337.0], True, (1, 10, 100)),  # three decades: decades only
        ([1.0, 30.0], True, (1, 2, 5, 10, 20, 50)),  # two: 1-2-5
        ([0.6, 0.9], False, (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)),  # a 5% margin, then round
        ([12.0, 15.0], False, (11, 12, 13, 14, 15, 16)),
        ([-3.0, 5.0], False, (-5, -2.5, 0, 2.5, 5, 7.5)),  # a sign change: never log
        ([2.0, 2.0], False, (1.8, 2.0, 2.2)),  # one value
    ],
)
def test_an_axis_is_log_past_a_decade_with_round_limits_and_ticks(values, log, ticks) -> None:
    a = axis("loss", values)
    assert a.log is log
    assert a.ticks == pytest.approx(ticks)
    assert a.lo <= min(values) < max(values) <= a.hi or a.lo < values[0] < a.hi
    assert a.lo <= a.ticks[0] and a.ticks[-1] <= a.hi and list(a.ticks) == sorted(a.ticks)
    assert 0 <= a.fraction(min(values)) < a.fraction(max(values)) <= 1 or values[0] == values[1]


def test_close_values_get_distinct_labels_and_many_decades_few() -> None:
    narrow = axis("final loss", [1.78993, 1.7920])  # the docs' study of methods: 3 digits
    assert narrow.tick_labels == ("1.789", "1.790", "1.791", "1.792", "1.793")  # were 1.79 ×5
    deep = axis("Delta", [1e-15, 0.2])
    assert deep.log and 3 <= len(deep.ticks) <= 7  # were 15 crowded decades
    for a in (narrow, deep, axis("x", [0.0001, 0.00012]), axis("x", [-3.0, 5.0])):
        assert len(set(a.tick_labels)) == len(a.tick_labels), a.tick_labels


def test_tick_labels_are_short_and_exact() -> None:
    assert [tick_label(v) for v in (0, 0.3, 2.5, 100, 20000, 1e-5)] == [
        "0",
        "0.3",
        "2.5",
        "100",
        "2e4",
        "1e-5",
    ]


def test_the_png_draws_the_description_and_no_label_runs_into_the_next_panel() -> None:
    figure = comparison_figure(wide_comparison())
    envelope = figure.panels[0]
    assert envelope.y.log and envelope.x.log  # 560 → ~2 and rounds 1 → 30
    fig = matplotlib_figure(figure)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = []
    for ax, panel in zip(fig.axes, figure.panels, strict=True):
        for name, spec in (("x", panel.x), ("y", panel.y)):
            which = getattr(ax, f"{name}axis")
            assert getattr(ax, f"get_{name}scale")() == ("log" if spec.log else "linear")
            assert getattr(ax, f"get_{name}lim")() == pytest.approx((spec.lo, spec.hi))
            shown = [t.get_text() for t in which.get_ticklabels() if t.get_visible()]
            assert shown == list(spec.tick_labels) and len(shown) >= 3
            assert which.get_offset_text().get_text() == ""  # no "+1.79" hiding the values
            assert (
                not which.get_minor_ticks()
                or not which.get_minor_ticks()[0].tick1line.get_visible()
            )
        boxes.append(ax.get_tightbbox(renderer))
    for left, right in itertools.pairwise(boxes):
        assert left.x1 <= right.x0, (left, right)  # labels included


def test_points_sit_inside_every_axis() -> None:
    for panel in comparison_figure(wide_comparison()).panels:
        for s in panel.series:
            for x, y in s.points:
                assert 0 <= panel.x.fraction(x) <= 1 and 0 <= panel.y.fraction(y) <= 1
                assert math.isfinite(x) and math.isfinite(y)
