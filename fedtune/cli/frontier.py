"""``fedtune frontier``: (ρ, Δ) Pareto frontiers of local-update methods on quadratics.

Either a paper figure (``--figure N``, settings of Charles & Konečný 2021, arXiv:2103.05032;
docs/explanation/algorithms.md §3.11) or a free-form sweep; both write PNG + CSV + JSON into ``--out`` and print the paths.
The logic lives in :mod:`fedtune.trainers.theory`; this module only parses arguments.
"""

from __future__ import annotations

import argparse

from fedtune.cli.common import count
from fedtune.errors import ConfigError

__all__ = ["register"]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "frontier",
        help="compute (rho, Delta) Pareto frontiers on quadratics",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument(
        "--figure",
        type=int,
        help="reproduce a figure of Charles & Konečný 2021 (arXiv:2103.05032)",
    )
    p.add_argument("--quick", action="store_true", help="coarser grids (figures only)")
    p.add_argument("--mu", type=float, default=1.0)
    p.add_argument("--L", type=float, default=10.0)
    p.add_argument("--alpha", type=float, nargs="+", default=[0.0], help="one curve per value")
    p.add_argument("--gamma", default="half-L", help="client lr: a number, 'half-L' or 'half-KL'")
    p.add_argument(
        "--K-range",
        dest="k_range",
        type=count,
        nargs=2,
        default=[1, 10**6],
        metavar=("LO", "HI"),
        help="whole numbers; scientific notation such as 1e6 is accepted",
    )
    p.add_argument("--gamma-range", dest="gamma_range", type=float, nargs=2)
    p.add_argument("--K", dest="k", type=count, help="fixed K when sweeping gamma")
    p.add_argument("--points", type=count, default=200)
    p.add_argument("--theta", choices=["sum", "last"], default="sum")
    p.add_argument(
        "--server-opt",
        dest="server_opt",
        nargs="+",
        default=["gd"],
        choices=["gd", "nesterov", "heavy_ball"],
        help="one panel per optimizer",
    )
    p.add_argument("--sweep", choices=["K", "gamma"], default="K")
    p.add_argument("--simulated", action="store_true", help="random-matrix (MAML) frontier")
    p.add_argument("--dim", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="frontier", help="file stem of the outputs")
    p.set_defaults(func=run)


def _gamma(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _values(args: argparse.Namespace):
    import numpy as np

    from fedtune.trainers.theory import log_int_grid

    if args.points < 2:
        raise ConfigError("points", "must be >= 2")
    if args.sweep == "K":
        return log_int_grid(args.k_range[0], args.k_range[1], args.points)
    if args.gamma_range is None or args.k is None:
        raise ConfigError("gamma_range", "--sweep gamma needs --gamma-range LO HI and --K")
    lo, hi = args.gamma_range
    if not 0 < lo <= hi:
        raise ConfigError("gamma_range", f"need 0 < lo <= hi, got {lo}, {hi}")
    return np.geomspace(lo, hi, args.points)


def run(args: argparse.Namespace) -> int:
    from fedtune.trainers.theory import frontier, make_figure, render

    if args.figure is not None:
        paths = make_figure(args.figure, args.out, quick=args.quick)
    else:
        values = _values(args)
        panels = []
        for opt in args.server_opt:
            curves = [
                frontier(
                    args.mu,
                    args.L,
                    a,
                    args.theta,
                    args.sweep,
                    values,
                    gamma=_gamma(args.gamma),
                    K=args.k,
                    server_opt=opt,
                    simulated=args.simulated,
                    dim=args.dim,
                    seed=args.seed,
                    label=f"alpha={a:g}",
                )
                for a in args.alpha
            ]
            panels.append((opt, curves))
        title = f"theta={args.theta}, mu={args.mu:g}, L={args.L:g}, sweep {args.sweep}"
        paths = render(args.name, title, panels, args.out)
    for path in (paths.png, paths.csv, paths.json):
        print(path)
    return 0
