"""A comparison drawn: one PNG (matplotlib, Agg canvas) and one self-contained HTML page.

The page needs no network: its figures are inline SVG drawn here, its one script (hover
read-outs and showing/hiding a study) is inline too, no CDN, no external stylesheet. Both show
the studies' lower envelopes E(R), their budget curves (best final loss within r rounds of
total budget), their Pareto sets (rounds to target vs final loss), the predicted (ρ, Δ) where
the theory applies, and the table at matched budgets (:mod:`fedtune.tuning.compare`).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path

from .compare import BUDGET_ROUNDS, BUDGET_TRIALS, BUDGET_WHOLE, Comparison

__all__ = ["COLOURS", "render_html", "render_png", "write_figures"]

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


def _panels(c: Comparison) -> list[tuple[str, str, str, dict[str, list[tuple[float, float]]]]]:
    """(title, x label, y label, points by study key) of each panel."""
    pareto = {k: [(p["rounds_to_target"], p["final_loss"]) for p in v] for k, v in c.pareto.items()}
    panels = [
        ("Lower envelope E(R)", "rounds R (one trial)", "best smoothed loss", c.envelopes),
        (
            "Best objective within total budget",
            "total rounds spent",
            "lowest final loss",
            c.budget_curves,
        ),
        ("Pareto sets", "rounds to target", "final loss", pareto),
    ]
    pred = {
        k: [(p["rho_predicted"], p["delta_predicted"]) for p in v]
        for k, v in c.predictions.items()
        if v
    }
    if pred:
        panels.append(("Predicted trade-off", "rho (rate)", "Delta (accuracy loss)", pred))
    return [(t, x, y, {k: _finite(v) for k, v in d.items()}) for t, x, y, d in panels]


def _wide(values: list[float]) -> bool:
    """Positive values spanning more than a decade: drawn on a log scale."""
    return bool(values) and min(values) > 0 and max(values) > 10 * min(values)


def render_png(c: Comparison, path: str | Path) -> Path:
    """Draw the comparison's panels side by side.

    Args:
        c: The comparison.
        path: The PNG to write.

    Returns:
        The path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = _panels(c)
    fig = Figure(figsize=(5 * len(panels), 4.2))
    FigureCanvasAgg(fig)
    keys = c.study_keys()
    for j, (title, xl, yl, data) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), j + 1)
        for i, key in enumerate(keys):
            pts = sorted(data.get(key, []))
            if not pts:
                continue
            xs, ys = zip(*pts, strict=True)
            if title.startswith("Predicted"):
                ax.plot(xs, ys, "o", color=_colour(i), label=key, ms=4)
            elif title == "Pareto sets":
                ax.plot(xs, ys, "o-", color=_colour(i), label=key, ms=4)
            else:
                ax.step(xs, ys, where="post", color=_colour(i), label=key)
        ax.set_title(title)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        if _wide([y for pts in data.values() for _, y in pts]):
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    verdict = "comparable" if c.comparable else "NOT comparable (forced)"
    fig.suptitle(f"{' vs '.join(keys)}: {verdict}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return path


_W, _H, _PAD = 420, 300, 48
_KINDS = {"Pareto sets": "line", "Predicted trade-off": "points"}


def _scale(values: list[float], lo_px: float, hi_px: float, log: bool):
    vals = [math.log10(v) for v in values] if log else values
    lo, hi = min(vals), max(vals)
    if hi == lo:
        lo, hi = lo - 0.5, hi + 0.5

    def f(v: float) -> float:
        x = math.log10(v) if log else v
        return lo_px + (x - lo) / (hi - lo) * (hi_px - lo_px)

    return f, (10**lo if log else lo), (10**hi if log else hi)


def _svg_panel(
    index: int, title: str, xl: str, yl: str, data: dict, keys: list[str], kind: str
) -> str:
    pts_all = [p for k in keys for p in data.get(k, [])]
    head = f'<figure class="panel" id="panel-{index}"><figcaption>{html.escape(title)}</figcaption>'
    if not pts_all:
        return head + "<p>no finite points</p></figure>"
    xs = [p[0] for p in pts_all]
    ys = [p[1] for p in pts_all]
    fx, x0, x1 = _scale(xs, _PAD, _W - 10, False)
    fy, y0, y1 = _scale(ys, _H - _PAD, 10, _wide(ys))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" role="img" aria-label="{html.escape(title)}">',
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - 10}" y2="{_H - _PAD}" stroke="#444"/>',
        f'<line x1="{_PAD}" y1="10" x2="{_PAD}" y2="{_H - _PAD}" stroke="#444"/>',
        f'<text x="{_W / 2}" y="{_H - 12}" text-anchor="middle">{html.escape(xl)}</text>',
        f'<text x="12" y="{_H / 2}" transform="rotate(-90 12 {_H / 2})" '
        f'text-anchor="middle">{html.escape(yl)}</text>',
        f'<text x="{_PAD}" y="{_H - _PAD + 14}" font-size="10">{x0:.4g}</text>',
        f'<text x="{_W - 10}" y="{_H - _PAD + 14}" font-size="10" '
        f'text-anchor="end">{x1:.4g}</text>',
        f'<text x="{_PAD - 4}" y="{_H - _PAD}" font-size="10" text-anchor="end">{y0:.4g}</text>',
        f'<text x="{_PAD - 4}" y="18" font-size="10" text-anchor="end">{y1:.4g}</text>',
    ]
    for i, key in enumerate(keys):
        pts = sorted(data.get(key, []))
        if not pts:
            continue
        coords = []
        for j, (x, y) in enumerate(pts):
            if kind == "step" and j:
                coords.append(f"{fx(x):.1f},{fy(pts[j - 1][1]):.1f}")
            coords.append(f"{fx(x):.1f},{fy(y):.1f}")
        k = html.escape(key, quote=True)
        parts.append(f'<g class="series" data-study="{k}">')
        if kind != "points":
            parts.append(
                f'<polyline fill="none" stroke="{_colour(i)}" stroke-width="2" '
                f'points="{" ".join(coords)}"/>'
            )
        for x, y in pts:
            parts.append(
                f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{_colour(i)}" '
                f'data-x="{x:.6g}" data-y="{y:.6g}"><title>{k}: ({x:.4g}, {y:.4g})</title>'
                "</circle>"
            )
        parts.append("</g>")
    parts.append("</svg>")
    return head + "".join(parts) + "</figure>"


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
    panels = "".join(
        _svg_panel(j, t, x, y, d, keys, _KINDS.get(t, "step"))
        for j, (t, x, y, d) in enumerate(_panels(c))
    )
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
    data = json.dumps(c.to_dict()).replace("</", "<\\/")
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
    paths = c.write(out, stem)
    paths["png"] = render_png(c, out / f"{stem}.png")
    paths["html"] = render_html(c, out / f"{stem}.html")
    return paths
