"""Figures 1–5 and 7–10 of Charles & Konečný 2021 (arXiv:2103.05032) (settings:
docs/explanation/algorithms.md §3.11 table).

Each figure is a tuple of panels, each panel a tuple of frontier curves (:class:`FrontierSpec`).
:func:`make_figure` computes the curves and writes ``figN.png`` (matplotlib, Agg, no pyplot
state), ``figN.csv`` (one row per point) and ``figN.json`` (specs and points).

Choices the paper leaves open (docs/explanation/algorithms.md §3.11, §9): K grids are log-spaced
integers in [1, 10⁶]; Fig. 2 uses L ∈ {2, 10, 100} (values not in the text); Fig. 10 uses the panel
labels α ∈ {0, 0.5, 1, 5} (the caption says 10); Fig. 9 uses α ∈ {0, 0.5, 1, 5} and drops points
with γ ≥ 1/(KL+α); simulated curves use seed 0 and d ∈ {5, 100}.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedtune.errors import ConfigError

from .frontier import Frontier, FrontierSpec, GammaRule, Sweep, frontier_from_spec, log_int_grid
from .rates import ServerOpt
from .surrogate import ThetaFamily

__all__ = ["FIGURES", "FigurePaths", "FigureSpec", "figure_spec", "make_figure", "render"]

SOURCE = "Charles & Konečný 2021 (arXiv:2103.05032)"
FIGURES = (1, 2, 3, 4, 5, 7, 8, 9, 10)
_OPTS = (ServerOpt.GD, ServerOpt.NESTEROV, ServerOpt.HEAVY_BALL)
_SUM, _LAST = ThetaFamily.SUM, ThetaFamily.LAST


@dataclass(frozen=True)
class FigureSpec:
    number: int
    title: str
    panels: tuple[tuple[str, tuple[tuple[str, FrontierSpec], ...]], ...]


@dataclass(frozen=True)
class FigurePaths:
    png: Path
    csv: Path
    json: Path


def _k(family, L, alpha, gamma, ks, opt=ServerOpt.GD, simulated=False, dim=100, drop=False):
    return FrontierSpec(
        1.0,
        float(L),
        float(alpha),
        family,
        Sweep.K,
        tuple(float(k) for k in ks),
        gamma,
        None,
        opt,
        simulated,
        dim,
        0,
        drop,
    )


def _maml_panel(L, alpha, ks, opt=ServerOpt.GD):
    curves = [("FedAvg Θ_{1:K}", _k(_SUM, L, alpha, 0.001, ks, opt))]
    curves += [(f"MAML Θ_K d={d}", _k(_LAST, L, alpha, 0.001, ks, opt, True, d)) for d in (5, 100)]
    return tuple(curves)


def figure_spec(n: int, quick: bool = False) -> FigureSpec:
    """The curves of figure ``n`` (``quick``: coarser grids)."""
    ks = log_int_grid(1, 10**6, 60 if quick else 400)
    if n == 1:
        gam = {L: np.geomspace(1e-5 / L, 0.999 / L, 40 if quick else 300) for L in (5, 50)}
        left = tuple((f"L={L}", _k(_SUM, L, 0, 0.01, ks)) for L in (5, 50))
        right = tuple(
            (f"L={L}", FrontierSpec(1.0, L, 0.0, _SUM, Sweep.GAMMA, tuple(gam[L]), None, 100))
            for L in (5, 50)
        )
        return FigureSpec(
            1,
            "Θ_{1:K}, μ=1, α=0: vary K (γ=0.01) | vary γ (K=100)",
            (("vary K", left), ("vary γ", right)),
        )
    if n == 2:
        panels = tuple(
            (f"L={L}", tuple((o.value, _k(_SUM, L, 0, GammaRule.HALF_L, ks, o)) for o in _OPTS))
            for L in (2, 10, 100)
        )
        return FigureSpec(2, "Θ_{1:K}, μ=1, α=0, γ=1/(2L): server momentum", panels)
    if n == 3:
        curves = tuple((f"α={a:g}", _k(_SUM, 10, a, GammaRule.HALF_L, ks)) for a in (0, 0.5, 1, 5))
        return FigureSpec(3, "Θ_{1:K}, μ=1, L=10, γ=½(L+α)⁻¹: FedProx", (("GD", curves),))
    if n == 4:
        panels = tuple(
            (
                o.value,
                (
                    ("FedAvg Θ_{1:K} γ=0.001", _k(_SUM, 10, 0, 0.001, ks, o)),
                    ("MAML Θ_K γ=1/(2LK)", _k(_LAST, 10, 0, GammaRule.HALF_KL, ks, o)),
                ),
            )
            for o in _OPTS
        )
        return FigureSpec(4, "μ=1, L=10, α=0: FedAvg vs analytic MAML", panels)
    if n == 5:
        return FigureSpec(
            5, "Simulated MAML, μ=1, L=10, γ=0.001", (("GD", _maml_panel(10, 0, ks)),)
        )
    if n == 7:
        panels = tuple((f"L={L}", _maml_panel(L, 0, ks)) for L in (2, 5, 10, 100))
        return FigureSpec(7, "Simulated MAML, μ=1, γ=0.001: vary L", panels)
    if n == 8:
        panels = tuple((o.value, _maml_panel(10, 0, ks, o)) for o in _OPTS)
        return FigureSpec(8, "Simulated MAML, μ=1, L=10, γ=0.001: server momentum", panels)
    if n == 9:
        curves = tuple((f"α={a:g}", _k(_LAST, 10, a, 1e-7, ks, drop=True)) for a in (0, 0.5, 1, 5))
        return FigureSpec(9, "Θ_K, μ=1, L=10, γ=1e-7, only γ < 1/(KL+α)", (("GD", curves),))
    if n == 10:
        panels = tuple((f"α={a:g}", _maml_panel(10, a, ks)) for a in (0, 0.5, 1, 5))
        return FigureSpec(10, "Simulated MAML, μ=1, L=10, γ=0.001: vary α", panels)
    raise ConfigError(
        "figure",
        f"must be one of {', '.join(map(str, FIGURES))} (Fig. 6 is the FEMNIST experiment)",
    )


def _spec_dict(spec: FrontierSpec) -> dict:
    out = dataclasses.asdict(spec)
    out["values"] = [min(spec.values), max(spec.values), len(spec.values)]
    return {k: (v.value if hasattr(v, "value") else v) for k, v in out.items()}


def render(
    stem: str, title: str, panels: list[tuple[str, list[Frontier]]], out_dir: str | Path
) -> FigurePaths:
    """Plot Δ against ρ for each panel and write ``stem``.png/.csv/.json into ``out_dir``."""
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = FigurePaths(out / f"{stem}.png", out / f"{stem}.csv", out / f"{stem}.json")
    fig = Figure(figsize=(4.2 * len(panels), 3.8))
    fig.subplots_adjust(
        left=0.6 / (4.2 * len(panels)) * 1.5, right=0.98, bottom=0.13, top=0.84, wspace=0.28
    )
    axes = np.atleast_1d(fig.subplots(1, len(panels)))
    for ax, (ptitle, curves) in zip(axes, panels, strict=True):
        for j, cur in enumerate(curves):  # earlier curves wider, so overlapping arcs stay visible
            ax.plot(cur.rho, cur.delta, label=cur.label, lw=1.2 + 1.6 * (len(curves) - 1 - j))
        ax.set(title=ptitle, xlabel="ρ (convergence rate)", ylabel="Δ (suboptimality)")
        ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02))
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.savefig(paths.png, dpi=100)
    header = ["panel", "curve", "theta", "server_opt", "simulated", "dim"]
    header += ["param", "gamma", "alpha", "K", "kappa", "log_kappa", "rho", "delta"]
    doc = {"title": title, "source": SOURCE, "panels": []}
    with paths.csv.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for ptitle, curves in panels:
            entry = {"title": ptitle, "curves": []}
            for cur in curves:
                s, rows = cur.spec, cur.rows()
                for r in rows:
                    writer.writerow(
                        [
                            ptitle,
                            cur.label,
                            s.theta_family.value,
                            s.server_opt.value,
                            s.simulated,
                            s.dim,
                        ]
                        + ["" if r[k] is None else repr(r[k]) for k in header[6:]]
                    )
                entry["curves"].append({"label": cur.label, "spec": _spec_dict(s), "points": rows})
            doc["panels"].append(entry)
    paths.json.write_text(json.dumps(doc, indent=1, allow_nan=False))
    return paths


def make_figure(n: int, out_dir: str | Path, quick: bool = False) -> FigurePaths:
    """Compute and write figure ``n`` of Charles & Konečný 2021; returns the file paths."""
    spec = figure_spec(n, quick)
    panels = [
        (ptitle, [frontier_from_spec(cs, label) for label, cs in curves])
        for ptitle, curves in spec.panels
    ]
    return render(f"fig{n}", f"Fig. {n}: {spec.title}", panels, out_dir)
