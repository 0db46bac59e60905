"""``fedtune train STUDY_FILE [--set key=value ...] [--json]``: train one configuration."""

from __future__ import annotations

import argparse
import json
import sys

from .common import add_set_option, apply_sets, load_yaml, resolve_code

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train one configuration (no tuning)")
    p.add_argument(
        "study_file",
        metavar="STUDY_FILE",
        help="the training configuration: a study file's fixed part (YAML)",
    )
    add_set_option(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _table(result) -> str:
    s = result.summary()
    last = s["last"]
    rows = [
        ("outcome", s["outcome"] + (f" ({s['reason']})" if s["reason"] else "")),
        ("rounds", s["rounds"]),
        ("final loss (mean client loss, last 10 rounds)", f"{s['final_loss']:.6g}"),
        ("last population train loss", _fmt(last.get("train_loss"))),
        ("last test loss", _fmt(last.get("test_loss"))),
        ("last test accuracy", _fmt(last.get("test_accuracy"))),
        (
            "client lr / server lr (last round)",
            f"{_fmt(last.get('client_lr'))} / {_fmt(last.get('server_lr'))}",
        ),
        ("learning-rate decays", s["decays"]),
        ("examples processed", last.get("examples", 0)),
        ("wall time (s)", _fmt(last.get("wall_time"))),
        ("runner / device", f"{s['runner']} / {s['device']}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from fedtune.trainers import parse_trial_config

    raw = apply_sets(load_yaml(args.study_file), args.set)
    raw = resolve_code(raw, Path(args.study_file).parent)
    config = parse_trial_config(raw, source=args.study_file)
    from fedtune.trainers import Trainer  # the engine (torch): only for a valid configuration

    trainer = Trainer(config)
    show = not (args.quiet or args.json)
    bar = tqdm(
        total=config.train.rounds,
        desc=config.algorithm,
        unit="round",
        disable=not show,
        file=sys.stderr,
        dynamic_ncols=True,
    )
    while not trainer.done:
        record = trainer.step()
        if record is not None:
            bar.set_postfix(loss=f"{record.client_loss:.4f}", refresh=False)
            bar.update(1)
    bar.close()
    result = trainer.result()
    if args.json:
        json.dump(result.to_dict(), sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        print(_table(result))
    return 0
