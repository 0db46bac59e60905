"""``fedtune worker run-study ID``: the study driver (what every backend starts).

Reads its settings from the environment (``FEDTUNE_DRIVER_URL`` and its one-time
``FEDTUNE_DRIVER_TICKET``, else ``FEDTUNE_DATABASE_URL``; ``FEDTUNE_WORKDIR``,
``MLFLOW_TRACKING_URI``, ``RAY_ADDRESS``), runs the study and writes its progress and final
state through the service's API or to its database (``fedtune.service.driver``); with neither
it stops at once with one line naming them. Exit codes: 0 done, 1 failed, 2 misconfigured,
69 a transient error re-queued the study, 75 another driver holds the study, 77 the service
refused its start ticket, 143 stopped. Its start, until the study's tuner begins, runs with
Python's cyclic garbage collector paused (``fedtune.tuning.common.start_gc``).
"""

from __future__ import annotations

import argparse
import logging

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    # no help=: an internal verb (the service's backends start it), absent from `fedtune --help`
    p = sub.add_parser("worker", description="Service-side processes (the study driver).")
    verbs = p.add_subparsers(dest="worker_verb", metavar="VERB")
    run_study = verbs.add_parser("run-study", help="drive one study of the service database")
    run_study.add_argument("study_id", help="the study id (12 hex digits)")
    run_study.add_argument(
        "--attempt", type=int, help="dispatch attempt; the driver exits if it was superseded"
    )
    run_study.set_defaults(func=run, start_gc=True)  # paused until the tuner begins


def run(args: argparse.Namespace) -> int:
    from fedtune.redact import scrubbing_log_handlers
    from fedtune.service.driver import load_driver_settings, run_driver

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scrubbing_log_handlers(logging.getLogger().handlers)
    return run_driver(args.study_id, load_driver_settings(), args.attempt)
