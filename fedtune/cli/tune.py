"""``fedtune tune STUDY_FILE``: run one study locally (Optuna + Ray Tune + MLflow), no service.

While it runs, one progress line on stderr (trials done/running/total, outcomes, best value,
elapsed, ETA). At the end: the best configuration, the Pareto set (rounds to reach the target
loss vs final loss), where everything was written, and the commands that open the MLflow UI and
optuna-dashboard on the stores. Re-running the same command resumes an interrupted study
(Ctrl-C or a killed driver) without repeating finished trials; ``--trials N`` sets the study's
total, so a larger N extends a finished study. A study file whose ``algorithm`` lists
algorithms is a study of methods: one study per algorithm, then their comparison
(:mod:`fedtune.cli.study_of_methods`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from fedtune.outcomes import TrialOutcome
from fedtune.tuning.methods import is_methods_study

from .common import add_set_option, plural, quiet_libraries
from .common import figure as _fmt

__all__ = ["register"]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="run a tuning study locally (Optuna + Ray Tune + MLflow)",
        description="Run one tuning study locally (Optuna + Ray Tune + MLflow); re-running "
        "the same command resumes it, --trials N extends it.",
    )
    p.add_argument("study_file", metavar="STUDY_FILE", help="the study file (YAML or JSON)")
    add_set_option(p)
    p.add_argument(
        "--workdir", help="where the study's stores and files live (default: runs/<study name>)"
    )
    p.add_argument(
        "--trials",
        type=_positive,
        metavar="N",
        help="total number of trials (default: budget.trials); extends a finished study",
    )
    p.add_argument(
        "--tracking-uri",
        dest="tracking_uri",
        metavar="URI",
        help="MLflow tracking URI (default: spec, $MLFLOW_TRACKING_URI, "
        "or sqlite:///<workdir>/mlflow.db)",
    )
    p.add_argument(
        "--ray-address",
        dest="ray_address",
        metavar="ADDR",
        help="connect to this Ray cluster instead of starting one",
    )
    p.add_argument(
        "--ray",
        action="store_true",
        help="run trials as Ray Tune trials even where they fit this process (by default a "
        "study that trains one configuration at a time on the CPU, or several in one pack that "
        "costs less here than Ray, runs them in this process, without Ray)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    # ends without module teardown; starts with the cyclic collector paused (start_gc)
    p.set_defaults(func=run, fast_exit=True, start_gc=True)


def _short(path: str) -> str:
    return path.split(".", 1)[1] if path.startswith("hparams.") else path


def _best_lines(result, spec) -> list[str]:
    best = result.best
    if best is None:
        return [f"no best configuration: {result.failure}"]
    values = ", ".join(f"{k} = {_fmt(v)}" for k, v in best["values"].items())
    rule = f"mean of the last {spec.objective.last_rounds} rounds"
    lines = [f"best configuration: trial {best['number']} ({values}; {rule})"]
    width = max((len(k) for k in best["params"]), default=0)
    lines += [f"  {k:<{width}}  {_fmt(v)}" for k, v in best["params"].items()]
    return lines


def _pareto_lines(result) -> list[str]:
    if not result.pareto:
        return ["Pareto set: empty (no trial with a finite final loss)"]
    target = (result.tradeoff or {}).get("pareto_target")
    keys = list(result.pareto[0]["params"])
    head = ["trial", f"rounds to loss <= {_fmt(target)}", "final loss", *map(_short, keys)]
    rows = [
        [
            str(p["number"]),
            _fmt(p["rounds_to_target"]),
            _fmt(p["final_loss"]),
            *(_fmt(p["params"].get(k)) for k in keys),
        ]
        for p in result.pareto
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    table = [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *rows]
    ]
    return ["Pareto set (fewer rounds vs lower final loss):", *table]


def _search_line(spec) -> str:
    """The search the study used: its strategy (and what that is made of), or — a study that
    names ``sampler.name``/``scheduler.name`` and no strategy — that sampler and scheduler."""
    strategy = spec.strategy
    if strategy is None:
        return (
            f"search         : sampler {spec.sampler_name}, scheduler {spec.scheduler_name} "
            "(as sampler/scheduler name them; no search.strategy)"
        )
    from fedtune.tuning.strategies import STRATEGIES

    default = "" if spec.search.strategy is not None else " (the default)"
    return f"search         : strategy {strategy}{default}: {STRATEGIES[strategy].summary}"


def _strategy_lines(spec, counts: dict[str, int], reasons: dict[str, int]) -> list[str]:
    """Which search ran, how many trials were stopped and why, and when most were, how many
    completed: only a completed trial's configuration can be the answer."""
    lines = [_search_line(spec)]
    stopped = counts.get(TrialOutcome.STOPPED, 0)
    completed = counts.get(TrialOutcome.COMPLETED, 0)
    if stopped:
        why = ", ".join(f"{k}: {v}" for k, v in reasons.items())
        line = f"stopped early  : {plural(stopped, 'trial')}" + (f" ({why})" if why else "")
        if stopped * 2 > counts.get("trials", 0):
            line += (
                f"; {completed} completed (the best configuration is chosen among the "
                "completed ones)"
            )
        lines.append(line)
    return lines


def _budget_lines(budget, result) -> list[str]:
    """What the study spent of its budget in compute (none: no line)."""
    lines = []
    if budget.configuration_rounds is not None:
        lines.append(
            f"budget         : {result.configuration_rounds}/{budget.configuration_rounds}"
            " configuration-rounds"
        )
    if budget.time is not None:
        took = result.timings.get("tuning_s", 0.0)
        lines.append(f"budget         : {took:.0f} s of {budget.time:g} s of tuning")
    return lines


def _summary(result, spec, study_path: str, workdir: str, sets: list[str] | None = None) -> str:
    c = result.counts
    shown = (
        TrialOutcome.COMPLETED,
        TrialOutcome.DIVERGED,
        TrialOutcome.STOPPED,
        TrialOutcome.FAILED,
    )
    outcomes = ", ".join(f"{c.get(k, 0)} {k}" for k in shown)
    took = result.timings.get("total_s", 0.0)
    target = result.target_trials
    count = f"{c['trials']}/{target} trials" if target is not None else f"{c['trials']} trials"
    if target is not None and c["trials"] > target:  # extended with --trials, resumed without
        count = (
            f"{c['trials']} trials (more than this run's target of {target}:"
            " the study was extended with --trials before)"
        )
    lines = [f"study {result.name}: {count} ({outcomes}) in {took:.0f} s, {result.ran} run now"]
    lines += _budget_lines(spec.budget, result)
    lines += _strategy_lines(spec, c, result.stop_reasons)
    from fedtune.tuning.driver.in_process import IN_PROCESS
    from fedtune.tuning.packing.plan import ONE_PER_PROCESS

    if result.packing is not None and result.packing.endswith(IN_PROCESS):
        lines.append(f"trials         : {result.packing}; --ray runs them as Ray Tune trials")
    elif result.packing is not None and result.packing != ONE_PER_PROCESS:
        lines.append(f"packing        : {result.packing}")
    if result.interrupted:
        lines.append(f"resumed: re-ran interrupted trials {result.interrupted}")
    lines += ["", *_best_lines(result, spec), "", *_pareto_lines(result), ""]
    tradeoff = Path(result.workdir) / "tradeoff"
    from fedtune.tuning.mlflow.client import executable

    again = (
        f"{executable('fedtune')} tune {shlex.quote(str(Path(study_path).resolve()))} "
        f"--workdir {shlex.quote(str(Path(workdir).resolve()))}"
    )
    again += "".join(f" --set {shlex.quote(item)}" for item in sets or [])
    lines += [
        f"optuna storage : {result.storage_url}",
        f"MLflow         : {result.tracking_uri} (experiment {result.experiment_id}, "
        f"parent run {result.parent_run_id})",
        f"trade-off      : {tradeoff}/ (curves.png, pareto.png, envelope.png, tradeoff.json/.csv)",
        "",
        *(
            [f"start the UI   : {result.commands['mlflow_ui']}"]
            if result.commands["mlflow_ui"]
            else []
        ),
        f"open the runs  : {result.commands['mlflow_page']}",
        f"open the study : {result.commands['optuna_dashboard']}",
        f"resume/extend  : {again} [--trials N]",
    ]
    return "\n".join(lines)


def _warn_budget(spec: Any, trials: int | None) -> None:
    """Say on stderr, in one line, when the study's budget is below what a good answer of its
    search needs (:mod:`fedtune.tuning.budget_advice`: a warning far below, else a note);
    called for a new study only."""
    from fedtune.tuning.budget_advice import advice

    said = advice(spec, spec.search_space(), trials)
    if said is not None:
        print(f"fedtune: {said.level}: {said.line}", file=sys.stderr)


def _workdir(args: argparse.Namespace, name: str) -> str:
    """``--workdir``, else ``runs/<study name>``."""
    return args.workdir or str(Path("runs") / name)


def _early_start(args: argparse.Namespace) -> tuple[Any, Any]:
    """Start what the study will need before the engine's imports and the spec's validation,
    which take seconds of CPU in this process, when the study file alone says what that is.

    A prefetch, not the choice of where the trials run: ``run_study`` makes that once, from the
    validated spec, and puts right what was begun for nothing
    (``fedtune.tuning.driver.placement``). A stored study run again without ``--trials`` gets
    nothing (finished, it only prints its summary; interrupted, its driver starts what it
    needs). A study whose trials will likely run in this process (one configuration at a time
    on the CPU, no ``--ray``) gets its MLflow store's process
    (``fedtune.tuning.mlflow.process``), which imports MLflow on another CPU. Any other study
    gets its embedded Ray (``fedtune.tuning.driver.ray_session.EarlyRay``: its start overlaps
    the imports) when Ray is local (no ``--ray-address``, no ``RAY_ADDRESS``), the file has no
    ``code:`` section (its ``runtime_env`` needs the validated spec) and the study will run
    trials (new, or ``--trials`` given). Otherwise, or if the file does not parse, nothing: the
    usual path reports everything.

    Returns:
        ``(early Ray, MLflow process)``, either or both None.
    """
    import yaml

    from fedtune.tuning import env

    if args.ray_address or env.ray_address():
        return None, None
    from fedtune.errors import ConfigError
    from fedtune.tuning.driver.placement import likely_in_process

    from .common import apply_sets

    try:
        doc = yaml.safe_load(Path(args.study_file).read_text())
        if isinstance(doc, dict):
            doc = apply_sets(doc, args.set)
    except (OSError, yaml.YAMLError, UnicodeDecodeError, ConfigError):
        return None, None
    if not isinstance(doc, dict) or is_methods_study(doc):
        return None, None  # a study of methods: one study per algorithm, each in its own workdir
    name = doc.get("name")
    named = args.workdir is not None or isinstance(name, str)
    workdir = Path(_workdir(args, name)).resolve() if named else None
    if workdir is not None and (workdir / "optuna.db").exists() and args.trials is None:
        # a stored study: a finished one needs neither Ray nor the MLflow store (its summary
        # only); an interrupted one's driver starts what it needs
        return None, None
    if likely_in_process(doc, allowed=not args.ray):
        from fedtune.tuning.mlflow.process import TrackerProcess

        try:
            return None, TrackerProcess()  # its trials run in this process: no Ray at all
        except OSError:
            return None, None  # the driver tries again, and says why if it cannot
    if doc.get("code") is not None or workdir is None:
        return None, None
    from fedtune.tuning.driver.ray_session import EarlyRay

    return EarlyRay.begin(workdir), None


def _load_spec(args: argparse.Namespace) -> Any:
    """The study file validated, with the ``--set`` overrides applied first."""
    from fedtune.tuning.spec import StudySpec

    if not args.set:
        return StudySpec.from_file(args.study_file)
    from .common import apply_sets, load_yaml

    data = apply_sets(load_yaml(args.study_file), args.set)
    return StudySpec.from_dict(data, base_dir=Path(args.study_file).parent, source=args.study_file)


def run(args: argparse.Namespace) -> int:
    from fedtune.tuning.common import timeline

    timeline.mark("cli")
    early, tracking = _early_start(args)
    try:
        return _run(args, early, tracking)
    finally:
        if early is not None:
            early.close()  # a spec error, Ctrl-C: Ray stops once its start has finished
        if tracking is not None:
            tracking.close()  # run_study closed it; a spec error, Ctrl-C: closed here


def _run(args: argparse.Namespace, early: Any, tracking: Any) -> int:
    from fedtune.errors import ConfigError, DataError
    from fedtune.tuning.common import timeline

    from .study_of_methods import methods_of, run_methods

    methods = methods_of(args)  # algorithm: [a, b, ...]: one study per algorithm, compared
    if methods is not None:
        return run_methods(args, methods)

    try:
        spec = _load_spec(args)
    except (ConfigError, DataError) as exc:
        # said at once (one line, exit 2); an early Ray is stopped after it, in run's finally
        print(f"fedtune: error: {exc}", file=sys.stderr, flush=True)
        return 2
    timeline.mark("spec_loaded")
    from fedtune.tuning.driver.study import run_study

    timeline.mark("driver_imported")

    workdir = _workdir(args, spec.name)
    quiet_libraries()
    if not (Path(workdir) / "optuna.db").exists():
        _warn_budget(spec, args.trials)  # a new study: not again on each resume or extension
    progress = None if args.json else sys.stderr
    if progress is not None:
        print(f"study {spec.name} -> {Path(workdir).resolve()}", file=sys.stderr)
    try:
        result = run_study(
            spec,
            workdir,
            tracking_uri=args.tracking_uri,
            ray_address=args.ray_address,
            trials=args.trials,
            progress=progress,
            early=early,
            in_process=not args.ray,
            tracking_process=tracking,
        )
    except KeyboardInterrupt:
        print(
            "\nstopped: finished trials are kept; run the same command again to resume",
            file=sys.stderr,
        )
        raise
    if args.json:
        json.dump(result.to_dict(), sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        print(_summary(result, spec, args.study_file, workdir, args.set))
    return 0 if result.best is not None else 1
