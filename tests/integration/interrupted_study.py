"""A study interrupted by Ctrl-C after its driver received 10 rounds, run as its own process.

``python -m tests.integration.interrupted_study SPEC_JSON TRACKING_URI WORKDIR OUT_JSON``
writes ``{trial number: [rounds the driver received]}`` to ``OUT_JSON``. It runs apart from the
test session's Ray because Ray Tune cleans up only after an ``Exception``: a
``KeyboardInterrupt`` leaves the trials' actors and placement groups on the Ray the driver is
connected to until the driver process ends (``ray.tune.tune.run``), which would starve every
later study of the session's shared ``ray_local``. A process of its own ends, and its embedded
Ray with it, exactly as ``fedtune tune`` does after Ctrl-C. That Ray is a lean one
(``tests/ray_start.py``: no log or autoscaler monitor; the study's driver takes no worker logs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ray import tune

from fedtune.tuning import StudySpec, run_study
from fedtune.tuning.mlflow.round_log import RoundLog


def main(spec_json: str, tracking_uri: str, workdir: str, out: str) -> None:
    RoundLog.LINGER = 60.0  # only the flushes of the tracker send
    seen: dict[int, set[int]] = {}

    class Interrupt(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            rounds = seen.setdefault(int(trial.config["fedtune.trial"]), set())
            rounds.update(int(row["round"]) for row in result["history"])
            if sum(map(len, seen.values())) >= 10:
                raise KeyboardInterrupt

    spec = StudySpec.from_dict(json.loads(Path(spec_json).read_text()))
    try:
        run_study(spec, workdir, tracking_uri=tracking_uri, sinks=[Interrupt()])
    except KeyboardInterrupt:
        Path(out).write_text(json.dumps({n: sorted(r) for n, r in seen.items()}))
        return
    sys.exit("the study ended without the interrupt")


if __name__ == "__main__":
    main(*sys.argv[1:5])
