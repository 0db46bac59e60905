"""``fedtune compare A B …``: compare studies (methods) on one task.

Local studies are named by their workdir (``fedtune tune --workdir``), the service's by id
(``--url``/``--token`` as for the other client verbs). Prints whether they are comparable and
each study's best configuration at matched budgets (equal trials, equal total rounds, whole
study); writes ``comparison.png``, ``comparison.html`` (self-contained), ``comparison.json`` and
``comparison.csv`` into ``--out``. Local studies' comparison is also an MLflow run of its own
that links to the compared parent runs (:mod:`fedtune.tuning.mlflow.comparisons`). Studies with a
different task, data or objective are refused unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

from fedtune.client_settings import setting
from fedtune.errors import ConfigError

__all__ = ["register"]

_STUDY_ID = re.compile(r"^[0-9a-f]{12}$")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare studies (methods) on one task: envelopes, Pareto sets, matched budgets",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "studies", nargs="+", metavar="STUDY", help="a local workdir or a service study id"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="compare studies of a different task, data or objective",
    )
    p.add_argument(
        "--out",
        help="where the figures and tables go (default: runs/compare-<studies> for local "
        "studies; none for the service's unless given)",
    )
    p.add_argument(
        "--tracking-uri",
        dest="tracking_uri",
        metavar="URI",
        help="local studies: their MLflow store and the comparison run's (default: each "
        "study's own, sqlite:///<workdir>/mlflow.db; the run goes to the first one's)",
    )
    p.add_argument(
        "--experiment", help="the comparison run's experiment (default: the first study's)"
    )
    url, token = setting("url"), setting("token")
    p.add_argument(url.option, default=None, help=url.describe())
    p.add_argument(token.option, default=None, help=token.describe())
    p.add_argument(
        "--record",
        action="store_true",
        help="the service's studies: also record the comparison as an MLflow run (local "
        "studies' comparisons are always recorded)",
    )
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=run)


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.{digits}g}"
    return "-" if value is None else str(value)


def _text(c: Any) -> list[str]:
    from fedtune.tuning.analysis.compare import BUDGET_ROUNDS, BUDGET_TRIALS, BUDGET_WHOLE

    lines = [f"compared: {', '.join(c.study_keys())}"]
    if c.comparable:
        lines.append("comparable: same task, data and objective")
    else:
        lines.append("NOT comparable (forced): " + "; ".join(c.differences))
    lines += ["", "best configuration at matched budgets (final loss, lower is better):"]
    for budget in (BUDGET_TRIALS, BUDGET_ROUNDS, BUDGET_WHOLE):
        rows = c.best_at(budget)
        winner = c.winner(budget)
        for key in c.study_keys():
            r = rows.get(key)
            if r is None:
                lines.append(f"  {budget:<18} {key}: no trial with a finite final loss within it")
                continue
            params = ", ".join(f"{k}={_fmt(v)}" for k, v in r.params.items())
            star = " *" if key == winner else ""
            lines.append(
                f"  {budget:<18} {key}: {_fmt(r.final_loss, 7)}{star}  (trial {r.trial_id}; "
                f"{r.trials_used} trials, {r.rounds_used} rounds; {params})"
            )
    for key, text in c.notes.items():
        lines.append(f"note ({key}): {text}")
    return lines


def _local(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    from fedtune.tuning.analysis.compare import compare
    from fedtune.tuning.mlflow.client import resolve_tracking_uri
    from fedtune.tuning.mlflow.comparisons import local_input, record_comparison

    inputs = [local_input(w, args.tracking_uri) for w in args.studies]
    c = compare(inputs, force=args.force)
    out = args.out or str(Path("runs") / ("compare-" + "-".join(c.study_keys())))
    uri = resolve_tracking_uri(args.studies[0], args.tracking_uri)
    parents = {
        s.key: resolve_tracking_uri(w, args.tracking_uri)
        for s, w in zip(c.studies, args.studies, strict=True)
    }
    recorded = record_comparison(c, out, uri, args.experiment, parent_uris=parents)
    return c, recorded


def _remote(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None]:
    from fedtune.client import Client

    token = setting("token").resolve(args.token)
    with Client(setting("url").resolve(args.url), token=token or None) as client:
        answer = client.compare(args.studies, force=args.force, record=args.record)
    c = answer  # the comparison itself, typed: one class in the SDK and the engine
    out: dict[str, Any] = c.mlflow.to_json() if c.mlflow is not None else {}
    if args.out:
        from fedtune.tuning.analysis.compare_render import write_figures

        out["files"] = {k: str(v) for k, v in write_figures(c, args.out).items()}
    return c, out or None


def run(args: argparse.Namespace) -> int:
    dirs = [Path(s).is_dir() for s in args.studies]
    if all(dirs):
        c, recorded = _local(args)
    elif not any(dirs) and all(_STUDY_ID.match(s) for s in args.studies):
        c, recorded = _remote(args)
    else:
        bad = [s for s, d in zip(args.studies, dirs, strict=True) if not d]
        raise ConfigError(
            "studies",
            "name local workdirs only or service study ids only (12 hex digits); not a "
            f"directory: {', '.join(bad)}",
        )
    if args.json:
        print(json.dumps({"comparison": c.to_json(), **(recorded or {})}, default=str))
        return 0
    lines = _text(c)
    if recorded:
        files = recorded.get("files")
        lines.append("")
        if files:
            lines += [
                f"figures        : {files.get('png')}",
                f"page           : {files.get('html')}",
                f"tables         : {files.get('json')}, {files.get('csv')}",
            ]
        if recorded.get("run_id"):
            lines.append(
                f"MLflow         : {recorded['tracking_uri']} (experiment "
                f"{recorded['experiment_id']}, comparison run {recorded['run_id']})"
            )
    print("\n".join(lines))
    return 0
