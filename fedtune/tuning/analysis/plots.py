"""Figures of the convergence–accuracy trade-off (matplotlib, Agg canvas, no pyplot state).

* :func:`plot_curves` — every trial's ℓ_t, coloured by one hyperparameter (log colour scale
  when all values are positive and span more than a decade; discrete colours for categories);
  diverged trials dashed.
* :func:`plot_pareto` — (rounds to τ, final loss) per trial with the Pareto set joined; trials
  that never reach τ sit at the right edge.
* :func:`plot_envelope` — best loss reachable within R rounds, regime changes marked with the
  configuration that takes over (large γ early, small γ late:
  Charles & Konečný 2020 (arXiv:2007.00878) §8).
* Quadratic tasks: :func:`theory_table` puts predicted (ρ, Δ) (plain numbers, e.g. from
  ``fedtune.trainers.theory``) beside the measured contraction rate and limit, and
  :func:`plot_theory` draws them (Charles & Konečný 2021 (arXiv:2103.05032) Thm 3, §5).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from fedtune.outcomes import TrialOutcome

from .figure import axis
from .figure_png import apply_axis
from .tradeoff import FLAG_STOPPED, TradeOff, TrialCurve, TrialId, write_tradeoff

__all__ = [
    "TheoryRow",
    "config_label",
    "contraction_rate",
    "pareto_figure",
    "plot_curves",
    "plot_envelope",
    "plot_pareto",
    "plot_theory",
    "theory_table",
    "write_artifacts",
]


def config_label(params: Mapping[str, Any], keys: Sequence[str] | None = None) -> str:
    """``client_lr=0.1, server_lr=1`` (short names, 3 significant digits)."""
    keys = sorted(params) if keys is None else keys
    parts = []
    for k in keys:
        v = params.get(k)
        text = f"{v:.3g}" if isinstance(v, float) else str(v)
        parts.append(f"{k.rsplit('.', 1)[-1]}={text}")
    return ", ".join(parts)


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def _colours(curves: Sequence[TrialCurve], color_by: str | None, fig: Figure, ax: Any) -> list:
    values = [c.params.get(color_by) if color_by else None for c in curves]
    numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if color_by and numeric and len(numeric) == len(values):
        lo, hi = min(numeric), max(numeric)
        log = lo > 0 and hi / lo > 10
        norm = LogNorm(lo, hi) if log else Normalize(lo, hi if hi > lo else lo + 1)
        mappable = ScalarMappable(norm=norm, cmap="viridis")
        fig.colorbar(mappable, ax=ax, label=color_by + (" (log scale)" if log else ""))
        return [mappable.to_rgba(v) for v in values]
    palette = [f"C{i % 10}" for i in range(10)]
    if color_by:
        levels = list(dict.fromkeys(map(str, values)))
        return [palette[levels.index(str(v)) % 10] for v in values]
    return [palette[i % 10] for i in range(len(curves))]


def plot_curves(
    curves: Sequence[TrialCurve],
    path: str | Path,
    color_by: str | None = None,
    ylabel: str = "training loss ℓ_t",
    total: int | None = None,
) -> Path:
    """All curves (a log y axis when the losses span more than a decade: :func:`.figure.axis`),
    coloured by hyperparameter ``color_by``; ``total``: the
    study's number of trials when ``curves`` are a selection of them (said in the title)."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    colours = _colours(curves, color_by, fig, ax)
    labelled: set[str] = set()
    for c, colour in zip(curves, colours, strict=True):
        y = np.asarray(c.losses, dtype=float)
        style = "--" if c.outcome == TrialOutcome.DIVERGED else "-"
        label = None
        if color_by and isinstance(colour, str):  # categorical legend, one entry per level
            level = f"{color_by}={c.params.get(color_by)}"
            label = None if level in labelled else level
            labelled.add(level)
        ax.plot(
            c.rounds,
            np.where(np.isfinite(y), y, np.nan),
            style,
            color=colour,
            lw=1.2,
            alpha=0.85,
            label=label,
        )
    finite = [v for c in curves for v in c.losses if math.isfinite(v) and v > 0]
    apply_axis(ax, "y", axis(ylabel, finite))
    apply_axis(ax, "x", axis("round", [r for c in curves for r in c.rounds]))
    ax.grid(alpha=0.3)
    shown = f"{len(curves)} trials"
    if total is not None and total > len(curves):
        shown = f"{len(curves)} of {total} trials (best final losses, Pareto set, envelope)"
    ax.set_title(shown)
    if labelled:
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_pareto(tradeoff: TradeOff, path: str | Path) -> Path:
    """Scatter of (rounds to the Pareto target, final loss); the Pareto set joined in order."""
    return _save(pareto_figure(tradeoff), path)


def pareto_figure(tradeoff: TradeOff) -> Figure:
    """The figure of :func:`plot_pareto`: every point labelled with its trial number; trials
    that ran to the end as dots (▶ at the right edge: never reached τ), stopped trials as
    hollow squares at the loss of the round they reached (never on the Pareto set), diverged
    and blown-up trials left out (counted in the title). In a large study only the trials of
    :meth:`~.tradeoff.TradeOff.shown` are drawn so; the others are small grey dots, unlabelled."""
    fig = Figure(figsize=(6, 4.5), layout="constrained")
    ax = fig.add_subplot()
    k = (
        tradeoff.targets.index(tradeoff.pareto_target)
        if tradeoff.pareto_target is not None
        else None
    )
    shown = [t for t in tradeoff.trials if t.flag in ("", FLAG_STOPPED)]
    pts = [(t, t.rounds_to_target[k] if k is not None else math.inf) for t in shown]
    pts = [(t, r) for t, r in pts if math.isfinite(t.final_loss)]
    finite_r = [r for _, r in pts if math.isfinite(r)]
    edge = 1.1 * max(finite_r) if finite_r else 1.0
    named = set(tradeoff.shown())
    rest = [
        (r if math.isfinite(r) else edge, t.final_loss) for t, r in pts if t.trial_id not in named
    ]
    if rest:
        ax.scatter(
            *zip(*rest, strict=True), s=6, color="0.75", zorder=1, label=f"{len(rest)} other trials"
        )
    pts = [(t, r) for t, r in pts if t.trial_id in named]
    for t, r in pts:
        reached, stopped = math.isfinite(r), t.flag == FLAG_STOPPED
        x = r if reached else edge
        marker = "s" if stopped else ("o" if reached else ">")
        colour = "C1" if stopped else ("C0" if reached else "C7")
        ax.scatter(
            x,
            t.final_loss,
            marker=marker,
            s=22,
            zorder=2,
            facecolors="none" if stopped else colour,
            edgecolors=colour,
        )
        ax.annotate(
            str(t.trial_id),
            (x, t.final_loss),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    front = [next((t, r) for t, r in pts if t.trial_id == i) for i in tradeoff.pareto]
    if front:
        xs = [r if math.isfinite(r) else edge for _, r in front]
        ax.step(
            xs,
            [t.final_loss for t, _ in front],
            where="post",
            color="C3",
            zorder=3,
            label="Pareto set",
            marker="o",
        )
    if any(t.flag == FLAG_STOPPED for t, _ in pts):
        ax.scatter(
            [],
            [],
            marker="s",
            facecolors="none",
            edgecolors="C1",
            label="stopped early (loss at its last round)",
        )
    if front or rest or any(t.flag == FLAG_STOPPED for t, _ in pts):
        ax.legend(fontsize=8)
    left_out = len(tradeoff.trials) - len(shown)
    if left_out:
        ax.set_title(f"{left_out} diverged / blown-up trial(s) not shown", fontsize=9)
    target = f"{tradeoff.pareto_target:.4g}" if tradeoff.pareto_target is not None else "—"
    drawn = [(r if math.isfinite(r) else edge, t.final_loss) for t, r in pts] + rest
    x_label = f"rounds to reach loss {target} (▶ = never)"
    apply_axis(ax, "x", axis(x_label, [x for x, _ in drawn]))
    y_label = f"final loss (mean of last {tradeoff.last_rounds} rounds)"
    apply_axis(ax, "y", axis(y_label, [y for _, y in drawn]))
    ax.grid(alpha=0.3)
    return fig


def plot_envelope(
    tradeoff: TradeOff, path: str | Path, label_keys: Sequence[str] | None = None
) -> Path:
    """E(R) coloured by the trial attaining it; dotted lines at the regime changes."""
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    pts = [p for p in tradeoff.envelope if math.isfinite(p.loss)]
    params = {t.trial_id: t.params for t in tradeoff.trials}
    holders = list(dict.fromkeys(p.trial_id for p in pts))
    start = 0
    for i in range(1, len(pts) + 1):  # one step line per run of rounds held by one trial
        if i < len(pts) and pts[i].trial_id == pts[start].trial_id:
            continue
        run = pts[start:i]
        xs = [p.round for p in run] + [pts[i].round if i < len(pts) else run[-1].round + 0.5]
        ys = [p.loss for p in run] + [run[-1].loss]
        if i < len(pts):  # the drop to the next holder's value
            xs, ys = [*xs, pts[i].round], [*ys, pts[i].loss]
        colour = f"C{holders.index(run[0].trial_id) % 10}"
        ax.step(xs, ys, where="post", color=colour, lw=2)
        start = i
    for h in holders:
        colour = f"C{holders.index(h) % 10}"
        ax.plot(
            [], [], color=colour, lw=2, label=f"trial {h}: {config_label(params[h], label_keys)}"
        )
    for change in tradeoff.regime_changes:
        ax.axvline(change.round, color="0.5", ls=":", lw=1)
    apply_axis(ax, "x", axis("round budget R", [p.round for p in pts]))
    apply_axis(ax, "y", axis("best smoothed loss within R rounds", [p.loss for p in pts]))
    ax.grid(alpha=0.3)
    ax.set_title(f"lower envelope ({len(tradeoff.regime_changes)} regime changes)")
    if holders:
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
    return _save(fig, path)


def write_artifacts(
    tradeoff: TradeOff,
    curves: Sequence[TrialCurve],
    directory: str | Path,
    color_by: str | None = None,
) -> dict[str, Path]:
    """tradeoff.json/.csv plus curves.png, pareto.png and envelope.png in ``directory``."""
    out = Path(directory)
    paths = write_tradeoff(tradeoff, out)
    named = set(tradeoff.shown())  # a large study: its best trials, Pareto set and envelope
    shown = [c for c in curves if c.trial_id in named]
    paths["curves"] = plot_curves(shown, out / "curves.png", color_by, total=len(curves))
    paths["pareto"] = plot_pareto(tradeoff, out / "pareto.png")
    paths["envelope"] = plot_envelope(tradeoff, out / "envelope.png")
    return paths


@dataclass(frozen=True)
class TheoryRow:
    """Predicted (ρ, Δ) of a configuration beside its measured rate and limit."""

    trial_id: TrialId
    params: Mapping[str, Any]
    rho_predicted: float
    delta_predicted: float
    rho_measured: float
    final_loss: float


def contraction_rate(
    rounds: Sequence[int],
    losses: Sequence[float],
    *,
    floor: float | None = None,
    window: tuple[int, int] | None = None,
    loss_exponent: float = 2.0,
    rel_floor: float = 1e-6,
) -> float:
    """Measured per-round contraction ρ̂ from the slope of log(ℓ_t − ℓ_∞).

    ℓ_t − ℓ_∞ ≈ C ρ^{p t} with p = ``loss_exponent`` (2 on a quadratic, where the loss gap is
    quadratic in the distance that ρ of Charles & Konečný 2021 Thm 3 contracts), so
    ρ̂ = exp(slope / p) for the least-squares slope over ``window`` = (first, last) round
    (default: all), using only points whose excess is above ``rel_floor`` × the largest excess
    in the window. ``floor`` ℓ_∞ defaults to the minimum of the whole curve (not only
    the window). NaN if < 2 usable points.
    """
    r = np.asarray(rounds, dtype=float)
    x = np.asarray(losses, dtype=float)
    lo, hi = window if window is not None else (-math.inf, math.inf)
    keep = (r >= lo) & (r <= hi) & np.isfinite(x)
    if not keep.any():
        return math.nan
    finite = x[np.isfinite(x)]
    base = float(finite.min()) if floor is None else floor
    excess = x[keep] - base
    use = excess > rel_floor * max(float(excess.max()), 0.0)
    if use.sum() < 2:
        return math.nan
    slope = np.polyfit(r[keep][use], np.log(excess[use]), 1)[0]
    return float(math.exp(slope / loss_exponent))


def theory_table(
    curves: Sequence[TrialCurve],
    predictions: Mapping[TrialId, tuple[float, float]],
    *,
    last_rounds: int = 10,
    **rate_kwargs: Any,
) -> list[TheoryRow]:
    """Rows for the curves that have a prediction ``trial_id -> (ρ, Δ)`` (plain numbers, e.g.
    from ``fedtune.trainers.theory``); the measured limit is the final loss."""
    rows = []
    for c in curves:
        if c.trial_id not in predictions:
            continue
        rho, delta = predictions[c.trial_id]
        rate = contraction_rate(c.rounds, c.losses, **rate_kwargs)
        rows.append(
            TheoryRow(
                c.trial_id, c.params, float(rho), float(delta), rate, c.final_loss(last_rounds)
            )
        )
    return rows


def plot_theory(rows: Sequence[TheoryRow], path: str | Path) -> Path:
    """Left: measured vs predicted ρ (diagonal = agreement). Right: final loss vs predicted Δ."""
    fig = Figure(figsize=(10, 4.2))
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    rho_p = np.array([r.rho_predicted for r in rows], dtype=float)
    rho_m = np.array([r.rho_measured for r in rows], dtype=float)
    left.scatter(rho_p, rho_m, s=22)
    both = np.concatenate([rho_p, rho_m])
    both = both[np.isfinite(both)]
    span = [both.min(), both.max()] if both.size else [0.0, 1.0]
    left.plot(span, span, "k:", lw=1, label="measured = predicted")
    left.set(xlabel="predicted ρ", ylabel="measured contraction rate", title="rate")
    left.legend(fontsize=8)
    delta = [r.delta_predicted for r in rows]
    final = [r.final_loss if math.isfinite(r.final_loss) else np.nan for r in rows]
    right.scatter(delta, final, s=22, color="C1")
    for r, d, f in zip(rows, delta, final, strict=True):
        right.annotate(
            str(r.trial_id), (d, f), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    right.set(
        xlabel="predicted suboptimality Δ", ylabel="measured limit (final loss)", title="limit"
    )
    if all(v > 0 for v in final if np.isfinite(v)) and any(np.isfinite(final)):
        right.set_yscale("log")
    return _save(fig, path)
