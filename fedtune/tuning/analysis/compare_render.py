"""A comparison drawn: one PNG (matplotlib, Agg canvas) and one self-contained HTML page, both
from one description of the figure (:func:`comparison_figure`, :mod:`.figure`).

The page needs no network: its figures are inline SVG drawn here, its one script (hover
read-outs and showing/hiding a study) is inline too, no CDN, no external stylesheet. Both show
the studies' lower envelopes E(R), their budget curves (best final loss within r rounds of
total budget), their Pareto sets (rounds to target vs final loss), the predicted (ρ, Δ) where
the theory applies, and the table at matched budgets (:mod:`fedtune.tuning.analysis.compare`).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from .compare import BUDGET_ROUNDS, BUDGET_TRIALS, BUDGET_WHOLE, Comparison, write_comparison
from .figure import Axis, Figure, Panel, Series, axis
from .figure_png import png

__all__ = [
    "COLOURS",
    "comparison_figure",
    "render_html",
    "render_png",
    "write_figures",
]

#: one colour per study, in order (matplotlib's tab10)
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _finite(points: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    return [
        (float(x), float(y))
        for x, y in points
        if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)
    ]


def comparison_figure(c: Comparison) -> Figure:
    """The comparison's figure, as both the PNG and the page draw it (:mod:`.figure`).

    Args:
        c: The comparison.

    Returns:
        Its panels: the lower envelopes, the budget curves, the Pareto sets and, where the
        theory applies, the predicted (ρ, Δ); each axis logarithmic where its values span more
        than a decade.
    """
    pareto = {k: [(p["rounds_to_target"], p["final_loss"]) for p in v] for k, v in c.pareto.items()}
    panels = [
        ("Lower envelope E(R)", "step", "rounds R (one trial)", "best smoothed loss", c.envelopes),
        (
            "Best objective within total budget",
            "step",
            "total rounds spent",
            "lowest final loss",
            c.budget_curves,
        ),
        ("Pareto sets", "line", "rounds to target", "final loss", pareto),
    ]
    pred = {
        k: [(p["rho_predicted"], p["delta_predicted"]) for p in v]
        for k, v in c.predictions.items()
        if v
    }
    if pred:
        panels.append(
            ("Predicted trade-off", "points", "rho (rate)", "Delta (accuracy loss)", pred)
        )
    keys = c.study_keys()
    drawn = []
    for title, kind, x_label, y_label, data in panels:
        series = tuple(
            Series(key, _colour(i), tuple(sorted(_finite(data.get(key, [])))))
            for i, key in enumerate(keys)
        )
        series = tuple(s for s in series if s.points)
        xs = [x for s in series for x, _ in s.points]
        ys = [y for s in series for _, y in s.points]
        drawn.append(Panel(title, kind, axis(x_label, xs), axis(y_label, ys), series))
    verdict = "comparable" if c.comparable else "NOT comparable (forced)"
    return Figure(f"{' vs '.join(keys)}: {verdict}", tuple(drawn))


def render_png(c: Comparison, path: str | Path) -> Path:
    """Draw the comparison's panels side by side (:func:`comparison_figure`).

    Args:
        c: The comparison.
        path: The PNG to write.

    Returns:
        The path written.
    """
    return png(comparison_figure(c), path)


#: an SVG panel: its size and the plot area's margins (room for tick labels and axis labels)
_W, _H = 440, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 14, 14, 50


def _svg_panel(index: int, panel: Panel) -> str:
    """One panel as inline SVG: gridlines, ticks and their labels where the axes say."""
    esc = html.escape
    head = f'<figure class="panel" id="panel-{index}"><figcaption>{esc(panel.title)}</figcaption>'
    if not panel.series:
        return head + "<p>no finite points</p></figure>"
    x0, x1, y0, y1 = _LEFT, _W - _RIGHT, _H - _BOTTOM, _TOP

    def fx(v: float) -> float:
        return x0 + panel.x.fraction(v) * (x1 - x0)

    def fy(v: float) -> float:
        return y0 + panel.y.fraction(v) * (y1 - y0)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" role="img" aria-label="{esc(panel.title)}">',
        _svg_axis("x", panel.x, fx, (x0, x1, y0, y1)),
        _svg_axis("y", panel.y, fy, (x0, x1, y0, y1)),
    ]
    parts.append(
        f'<rect class="frame" x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" '
        'fill="none" stroke="#444"/>'
    )
    for s in panel.series:
        coords = []
        for j, (x, y) in enumerate(s.points):
            if panel.kind == "step" and j:
                coords.append(f"{fx(x):.1f},{fy(s.points[j - 1][1]):.1f}")
            coords.append(f"{fx(x):.1f},{fy(y):.1f}")
        k = esc(s.key, quote=True)
        parts.append(f'<g class="series" data-study="{k}">')
        if panel.kind != "points":
            parts.append(
                f'<polyline fill="none" stroke="{s.colour}" stroke-width="2" '
                f'points="{" ".join(coords)}"/>'
            )
        for x, y in s.points:
            parts.append(
                f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{s.colour}" '
                f'data-x="{x:.6g}" data-y="{y:.6g}"><title>{k}: ({x:.4g}, {y:.4g})</title>'
                "</circle>"
            )
        parts.append("</g>")
    parts.append("</svg>")
    return head + "".join(parts) + "</figure>"


def _svg_axis(
    name: str, spec: Axis, place: Callable[[float], float], frame: tuple[float, ...]
) -> str:
    """One axis of an SVG panel: a gridline, a tick and a label per tick, and its title.

    Args:
        name: ``x`` or ``y``.
        spec: the axis.
        place: value -> pixel along the axis.
        frame: the plot area's left, right, bottom and top pixels.

    Returns:
        The SVG group.
    """
    x0, x1, y0, y1 = frame
    out = [f'<g class="axis" data-axis="{name}" data-scale="{"log" if spec.log else "linear"}">']
    for tick, label in zip(spec.ticks, spec.tick_labels, strict=True):
        p = place(tick)
        if name == "x":
            grid, mark, at = (p, y1, p, y0), (p, y0, p, y0 + 5), (p, y0 + 17, "middle")
        else:
            grid, mark, at = (x0, p, x1, p), (x0 - 5, p, x0, p), (x0 - 8, p + 4, "end")
        out.append(
            '<line class="grid" x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" '
            'stroke="#ddd"/>'.format(*grid)
            + '<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#444"/>'.format(*mark)
            + f'<text class="tick" x="{at[0]:.1f}" y="{at[1]:.1f}" font-size="11" '
            f'text-anchor="{at[2]}" data-value="{tick:.12g}">{html.escape(label)}</text>'
        )
    if name == "x":
        where = f'x="{(x0 + x1) / 2}" y="{_H - 8}"'
    else:
        middle = (y0 + y1) / 2
        where = f'x="14" y="{middle}" transform="rotate(-90 14 {middle})"'
    out.append(
        f'<text class="label" {where} text-anchor="middle">{html.escape(spec.label)}</text></g>'
    )
    return "".join(out)


def _fmt(v: object, digits: int = 4) -> str:
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:.{digits}g}"
    return "-" if v is None else str(v)


_SCRIPT = """
document.querySelectorAll('input.toggle').forEach(function (box) {
  box.addEventListener('change', function () {
    document.querySelectorAll('g.series').forEach(function (g) {
      if (g.dataset.study === box.value) { g.style.display = box.checked ? '' : 'none'; }
    });
  });
});
document.querySelectorAll('circle').forEach(function (c) {
  c.addEventListener('mouseover', function () {
    document.getElementById('readout').textContent =
      c.parentNode.dataset.study + ': (' + c.dataset.x + ', ' + c.dataset.y + ')';
  });
});
document.body.dataset.ready = 'true';
"""


def render_html(c: Comparison, path: str | Path) -> Path:
    """Write the self-contained page (inline SVG and script; nothing fetched).

    Args:
        c: The comparison.
        path: The HTML file to write.

    Returns:
        The path written.
    """
    keys = c.study_keys()
    esc = html.escape
    title = "Comparison: " + " vs ".join(keys)
    verdict = (
        '<p class="verdict ok">The studies are comparable: same task, data and objective.</p>'
        if c.comparable
        else '<p class="verdict bad">NOT comparable (compared because forced): '
        + esc("; ".join(c.differences))
        + "</p>"
    )
    legend = "".join(
        f'<label style="color:{_colour(i)}"><input type="checkbox" class="toggle" checked '
        f'value="{esc(k, quote=True)}"> {esc(k)}</label> '
        for i, k in enumerate(keys)
    )
    studies = "".join(
        f"<tr><td>{esc(s.key)}</td><td>{esc(s.algorithm)}</td><td>{esc(s.task)}</td>"
        f"<td>{s.trials_total}</td><td>{s.rounds_spent}</td><td>{esc(s.label)}</td>"
        f"<td>{esc(s.run_id or '-')}</td></tr>"
        for s in c.studies
    )
    panels = "".join(_svg_panel(j, p) for j, p in enumerate(comparison_figure(c).panels))
    rows = []
    for budget in (BUDGET_TRIALS, BUDGET_ROUNDS, BUDGET_WHOLE):
        best = c.winner(budget)
        for key in keys:
            r = c.best_at(budget).get(key)
            if r is None:
                rows.append(
                    f"<tr><td>{budget}</td><td>-</td><td>{esc(key)}</td>" + "<td>-</td>" * 4
                )
                continue
            params = ", ".join(f"{k}={_fmt(v)}" for k, v in r.params.items())
            mark = ' class="best"' if key == best else ""
            rows.append(
                f"<tr{mark}><td>{budget}</td><td>{r.amount}</td><td>{esc(key)}</td>"
                f'<td>{esc(str(r.trial_id))}</td><td class="value">{_fmt(r.final_loss, 7)}</td>'
                f"<td>{r.trials_used} trials / {r.rounds_used} rounds</td>"
                f"<td>{esc(params)}</td></tr>"
            )
    notes = "".join(f"<li><b>{esc(k)}</b>: {esc(v)}</li>" for k, v in c.notes.items())
    data = json.dumps(c.to_json()).replace("</", "<\\/")
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
.panel {{ display: inline-block; margin: 0.5em; vertical-align: top; }}
figcaption {{ font-weight: bold; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.5em; }}
tr.best td {{ font-weight: bold; background: #eef7ee; }}
.verdict.bad {{ color: #b00; font-weight: bold; }}
</style></head>
<body>
<h1>{esc(title)}</h1>
{verdict}
<table id="studies"><tr><th>study</th><th>algorithm</th><th>task</th><th>trials</th>
<th>rounds spent</th><th>named as</th><th>MLflow parent run</th></tr>{studies}</table>
<p id="legend">{legend}</p>
<p id="readout">hover a point to read it</p>
<div id="figures">{panels}</div>
<h2>Best configuration at matched budgets</h2>
<table id="matched"><tr><th>budget</th><th>amount</th><th>study</th><th>trial</th>
<th>final loss</th><th>used</th><th>configuration</th></tr>{"".join(rows)}</table>
<ul id="notes">{notes}</ul>
<script type="application/json" id="comparison-data">{data}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path


def write_figures(c: Comparison, directory: str | Path, stem: str = "comparison") -> dict:
    """Write ``<stem>.png``, ``<stem>.html``, ``<stem>.json`` and ``<stem>.csv``.

    Args:
        c: The comparison.
        directory: Where (created if missing).
        stem: The files' stem.

    Returns:
        The paths, by kind (``png``, ``html``, ``json``, ``csv``).
    """
    out = Path(directory)
    paths = write_comparison(c, out, stem)
    paths["png"] = render_png(c, out / f"{stem}.png")
    paths["html"] = render_html(c, out / f"{stem}.html")
    return paths
