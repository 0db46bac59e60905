"""``fedtune tune`` of a study of methods: one study per algorithm, then their comparison.

The spec's ``algorithm`` lists algorithms (:mod:`fedtune.tuning.methods`); each algorithm's
study runs under ``<workdir>/<algorithm>`` (default workdir ``runs/<name>``) with the same
task, seed and budget, then ``fedtune compare`` of them writes ``<workdir>/comparison/`` and
records the comparison run in MLflow. Re-running resumes each study as ``fedtune tune`` does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["methods_of", "run_methods"]


def methods_of(args: argparse.Namespace) -> list[dict[str, Any]] | None:
    """The per-algorithm documents when the study file lists algorithms, else None.

    Args:
        args: ``fedtune tune``'s arguments (``study_file``, ``set``).

    Returns:
        One spec document per algorithm, or None for an ordinary study (or a file that does
        not parse: the usual path reports it).
    """
    import yaml

    from fedtune.errors import ConfigError
    from fedtune.tuning.methods import expand_methods, is_methods_study

    from .common import apply_sets

    try:
        doc = yaml.safe_load(Path(args.study_file).read_text())
        doc = apply_sets(doc, args.set) if isinstance(doc, dict) else doc
    except (OSError, yaml.YAMLError, UnicodeDecodeError, ConfigError):
        return None
    return expand_methods(doc) if is_methods_study(doc) else None


def run_methods(args: argparse.Namespace, documents: list[dict[str, Any]]) -> int:
    """Run each algorithm's study, then compare them (module docstring).

    Args:
        args: ``fedtune tune``'s arguments.
        documents: The per-algorithm spec documents.

    Returns:
        The exit code: 0 when every study found a best configuration, else 1.
    """
    from fedtune.tuning.spec import StudySpec  # light: no torch, no Optuna

    group = documents[0]["tracking"]["experiment"]
    root = Path(args.workdir or Path("runs") / group)
    specs = [
        StudySpec.from_dict(d, base_dir=Path(args.study_file).parent, source=args.study_file)
        for d in documents
    ]  # every spec checked before the first study starts
    workdirs = [root / spec.algorithm for spec in specs]
    tracking = _tracker_process(args, documents, workdirs)
    try:
        return _run_methods(args, group, root, list(zip(specs, workdirs, strict=True)), tracking)
    finally:
        if tracking is not None:
            tracking.close()


def _tracker_process(
    args: argparse.Namespace, documents: list[dict[str, Any]], workdirs: list[Path]
) -> Any:
    """One MLflow store process for the studies whose trials will run in this process (each
    opens its store in it in turn: MLflow is imported once, not once per algorithm), begun
    before the engine's imports; None when no study will (a finished study's re-run reads its
    summary only, a study on Ray keeps its tracker in a thread).

    Args:
        args: ``fedtune tune``'s arguments.
        documents: The per-algorithm spec documents.
        workdirs: Each study's folder.

    Returns:
        The :class:`~fedtune.tuning.mlflow.process.TrackerProcess`, or None.
    """
    from fedtune.tuning.driver.placement import likely_in_process

    if not any(likely_in_process(d, allowed=not args.ray) for d in documents):
        return None
    if args.trials is None and all((w / "optuna.db").exists() for w in workdirs):
        return None  # stored studies: as fedtune tune's early start, nothing begun early
    from fedtune.tuning.mlflow.process import TrackerProcess

    try:
        return TrackerProcess()
    except OSError:
        return None  # each study tries again, and says why if it cannot


def _run_methods(
    args: argparse.Namespace, group: str, root: Path, studies: list[tuple[Any, Path]], tracking: Any
) -> int:
    """:func:`run_methods` with its studies (each spec and its folder, under ``root``) and their
    MLflow process, or None (each study its own)."""
    from fedtune.tuning.analysis.compare import compare
    from fedtune.tuning.driver.study import run_study
    from fedtune.tuning.mlflow.client import resolve_tracking_uri
    from fedtune.tuning.mlflow.comparisons import local_input, record_comparison

    from .common import quiet_libraries
    from .compare import _text

    quiet_libraries()
    results = []
    for spec, workdir in studies:
        if not args.json:
            print(f"study {spec.name} -> {workdir.resolve()}", file=sys.stderr)
        result = run_study(
            spec,
            workdir,
            tracking_uri=args.tracking_uri,
            ray_address=args.ray_address,
            trials=args.trials,
            progress=None if args.json else sys.stderr,
            in_process=not args.ray,
            tracking_process=tracking,
            keep_tracking_process=True,
        )
        results.append(result)
    workdirs = [workdir for _, workdir in studies]
    inputs = [local_input(w, args.tracking_uri) for w in workdirs]
    c = compare(inputs)
    uri = resolve_tracking_uri(workdirs[0], args.tracking_uri)
    parents = {
        s.key: resolve_tracking_uri(w, args.tracking_uri)
        for s, w in zip(c.studies, workdirs, strict=True)
    }
    recorded = record_comparison(c, root / "comparison", uri, parent_uris=parents)
    if args.json:
        body = {
            "studies": [r.to_dict() for r in results],
            "comparison": c.to_json(),
            **recorded,
        }
        json.dump(body, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        lines = [f"study of methods {group}: {len(results)} studies under {root.resolve()}", ""]
        for r in results:
            best = r.best
            value = (
                "none"
                if best is None
                else ", ".join(f"{k} = {v:.4g}" for k, v in best["values"].items())
            )
            lines.append(f"  {r.name}: {r.finished} trials, best {value} (workdir {r.workdir})")
        lines += ["", *_text(c), ""]
        lines.append(f"comparison     : {recorded['files']['html']} (and .png, .json, .csv)")
        lines.append(
            f"MLflow         : {recorded['tracking_uri']} (experiment "
            f"{recorded['experiment_id']}, comparison run {recorded['run_id']})"
        )
        print("\n".join(lines))
    return 0 if all(r.best is not None for r in results) else 1
