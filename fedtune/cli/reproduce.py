"""``fedtune reproduce``: regenerate the quadratic-theory figures and REPORT.md.

Thin wrapper over :func:`fedtune.trainers.theory.reproduce` (docs/explanation/algorithms.md
§3.10–3.11, §8).
Exit code 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse

__all__ = ["register"]


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "reproduce",
        help="regenerate theory figures and a pass/fail report",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quick", action="store_true", help="coarser grids")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fedtune.trainers.theory import reproduce

    report = reproduce(args.out, quick=args.quick)
    passed = sum(r.passed for r in report.rows)
    print(report.path)
    print(f"{passed}/{len(report.rows)} checks pass")
    for row in report.rows:
        if not row.passed:
            print(f"FAIL {row.check}: expected {row.expected:.6g}, measured {row.measured:.10g}")
    return 0 if report.passed else 1
