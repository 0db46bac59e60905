"""Results throughput under a team's load.

Several studies at once, each a separate driver process (``run_study``) connected to one local
multi-node Ray cluster (a head without CPUs for trials + ``--nodes`` worker nodes with
``--gpus-per-node`` *logical* GPUs, ``tests/service/ray_cluster.py``; a lean one: no log
monitors, no autoscaler, no Ray Client server, minimal dashboard agents on the worker nodes, a
dashboard of one module, none of which the benchmark measures), every trial holding a fraction
of a GPU and reporting every round of a quadratic task whose rounds cost next to nothing.
MLflow is a real ``mlflow server`` (``--workers 2``, ``--mlflow-workers`` to change it;
``--serve-artifacts``, its backend migrated first with ``mlflow db upgrade``, as the Helm chart
starts it) on a fresh
PostgreSQL schema; Optuna is one fresh PostgreSQL schema shared by every study (fedtune keeps a
study's Optuna storage in ``<workdir>/optuna.db``; the driver processes of this benchmark point
``storage_url`` at PostgreSQL instead, the team-cluster case the issue names).

For each step of ``--ladder`` (total concurrent trials, spread over ``--studies`` drivers):

1. start the drivers; wait until every trial runs;
2. for ``--window`` seconds, every second: *reported* = rounds the drivers received from Ray
   (a Tune callback in each driver counts them), *recorded* = per trial the last round
   present in **both** MLflow (``latest_metrics`` of its run, in the tracking server's
   database) and Optuna (its last intermediate value), summed; backlog = reported − recorded;
   CPU (``/proc``) of every driver, of the MLflow server's processes and of the PostgreSQL
   backends those two opened (``application_name``), and the drivers' RSS;
3. interrupt every driver (SIGINT: Ctrl-C, the service's cancel), wait for it to end, then
   count rounds received but never recorded (``lost``: must be 0, compared per trial and
   round) and rounds stored twice (``duplicated``: must be 0) — MLflow checked through its
   REST API (``get_metric_history``), Optuna through its storage.

Driver 0 runs under ``py-spy record`` (``--profile``): the JSON gets where its CPU goes.
``--profile-trial`` also samples one trial process (a pack, with ``--pack``) during the window,
idle time included: how its training thread's wall time splits between the engine's rounds,
reporting to Tune and (packed) asking the driver's ``PackBox`` what it decided. The
CPU of the worker nodes' Ray processes (the trials and their actors) is sampled with the rest
(``trial_processes_cores``).
``--trial-nice 19`` runs the worker nodes' processes (raylets and, inheriting it, every trial)
at low priority: on a machine of two cores the trials, which spin through rounds that cost
nothing, otherwise take the CPU the drivers, the MLflow server and PostgreSQL need, where a
cluster runs them on other nodes; the recorded rate then measures the pipeline, not the share of
a CPU it was left.
``--backend sqlite`` (the smoke test) uses SQLite files instead of PostgreSQL for both.

``--pack P`` gives every study ``resources.pack: P`` (:mod:`fedtune.tuning.packing.plan`): its
configurations train P to a trial process, and the ladder counts concurrent *configurations*
(``--ladder 64 --studies 8 --pack 8``: 8 drivers, each one process of 8 configurations;
``--pack 1 8`` runs each step of the ladder unpacked, then packed, on the same servers). Every
count is per configuration: each is its own Optuna trial and MLflow run, and the driver's Tune
callbacks, the benchmark's round counter among them (``run_study``'s ``sinks``), see each
configuration as a trial (``pack_driver.PackCallback``), so "every trial runs" means every
configuration has reported a round. ``--report-every N`` makes each trial report N rounds at a
time (the study's ``report_every``; every round is still recorded).

    flock /tmp/fedtune-bench.lock .venv/bin/python benchmarks/load.py --ladder 8,16,32
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from _env import environment, memory_mib  # noqa: E402

BIN = Path(sys.executable).parent
#: the head's dashboard modules: the node module only (it records the head's node); nothing the
#: benchmark does calls the dashboard's APIs, and each other module is a process of its own
RAY_DASHBOARD_MODULES = ("NodeHead",)
PG_URL = os.environ.get("FEDTUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TICK = os.sysconf("SC_CLK_TCK")
GOAL = {"rounds_per_s": 500, "driver_cores": 1.0}


def study_spec(
    name: str, trials: int, rounds: int, pack: int = 1, report_every: int = 1
) -> dict[str, Any]:
    """A study whose rounds cost next to nothing, reporting every round, on logical GPUs.

    Args:
        name: The study's name.
        trials: Its configurations, all at once (``budget.trials`` = ``max_concurrent``).
        rounds: Rounds per configuration.
        pack: Configurations per trial process (``resources.pack``, at most ``trials``).
        report_every: Rounds per report to Tune (each report carries every round since the
            last; 1: every round).

    Returns:
        The study document.
    """
    resources: dict[str, Any] = {"cpu": 0.25, "gpu": 0.25}
    if pack > 1:
        resources["pack"] = min(pack, trials)
    return {
        "name": name,
        "task": {"name": "quadratic", "clients": 4, "dim": 2, "seed": 0},
        "algorithm": "fedavg",
        "train": {
            "rounds": rounds,
            "clients_per_round": 2,
            "local_steps": 1,
            "batch_size": 2,
            "eval_every": 10,
            "dtype": "float64",
            "device": "cpu",
        },
        "search": {
            "space": "fedavg",
            "override": {
                "client_lr": {"low": 0.01, "high": 0.1},
                "server_lr": {"low": 0.05, "high": 0.2},
            },
        },
        "sampler": {"name": "random", "seed": 0},
        "scheduler": {"name": "none"},
        "budget": {"trials": trials, "max_concurrent": trials},
        "resources": resources,
        "report_every": report_every,
    }


# -- the driver process ---------------------------------------------------------------------
def drive(config_path: str) -> None:
    """One study (``--driver``): Optuna on ``optuna_url``, a counter of the rounds received."""
    cfg = json.loads(Path(config_path).read_text())
    # a driver started from a non-interactive shell inherits "ignore SIGINT": restore
    # Python's handler, or the end-of-step interrupt never reaches run_study
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.enable()  # a native crash (Ray's core worker, gRPC) leaves its stack in the log
    from ray import tune

    from fedtune.tuning import StudySpec, run_study
    from fedtune.tuning.keys import TRIAL_KEY
    from fedtune.tuning.optuna import search as og

    if cfg.get("optuna_url"):
        og.storage_url = lambda workdir: cfg["optuna_url"]  # the team's PostgreSQL
    out = Path(cfg["counter"])

    class Rounds(tune.Callback):
        """Rounds received and trials running, per trial; in a packed study a trial is one
        configuration (``PackCallback`` calls it once per member, as ``member.trial_id``)."""

        def __init__(self) -> None:
            self.received, self.running, self.last = 0, 0, {}
            self.written = 0.0

        def on_trial_result(self, iteration, trials, trial, result, **info):
            number = int(trial.config[TRIAL_KEY])  # Optuna's number: the MLflow run's tag
            seen = self.last.get(number)
            if seen is None:  # running = has reported (its process is up)
                self.running += 1
            new = [int(r["round"]) for r in result.get("history", ()) if r["round"] > (seen or 0)]
            if new:
                self.received += len(new)
                self.last[number] = new[-1]
            if time.monotonic() - self.written > 0.5:
                self.write()

        def on_trial_complete(self, iteration, trials, trial, **info):
            if int(trial.config[TRIAL_KEY]) in self.last:
                self.running -= 1
            self.write()

        on_trial_error = on_trial_complete

        def write(self, done: bool = False) -> None:
            self.written = time.monotonic()
            data = {
                "pid": os.getpid(),
                "received": self.received,
                "running": self.running,
                "last_round": self.last,
                "done": done,
                "t": time.time(),
            }
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(out)

    counter = Rounds()
    counter.write()
    try:
        run_study(
            StudySpec.from_dict(cfg["spec"]),
            cfg["workdir"],
            tracking_uri=cfg["tracking"],
            ray_address=cfg["ray_address"],
            sinks=[counter],
        )
    except KeyboardInterrupt:
        pass
    finally:
        counter.running = 0
        counter.write(done=True)


# -- what is recorded ---------------------------------------------------------------------
_MLFLOW_STEPS = """SELECT s.value, n.value, lm.step FROM latest_metrics lm
 JOIN tags s ON s.run_uuid = lm.run_uuid AND s.key = 'study'
 JOIN tags n ON n.run_uuid = lm.run_uuid AND n.key = 'optuna_trial_number'
 WHERE lm.key = 'client_loss'"""
_OPTUNA_STEPS = """SELECT st.study_name, t.number, max(iv.step) FROM trial_intermediate_values iv
 JOIN trials t ON t.trial_id = iv.trial_id JOIN studies st ON st.study_id = t.study_id
 GROUP BY st.study_name, t.number"""


class Recorded:
    """Rounds visible in both MLflow and Optuna, per (study, trial number)."""

    def __init__(self, mlflow_db: str, optuna_dbs: list[str], studies: list[str]) -> None:
        from sqlalchemy import create_engine

        self.mlflow = create_engine(mlflow_db)
        self.optuna = [create_engine(u) for u in optuna_dbs]
        self.studies = set(studies)  # this step's (the stores keep the earlier steps')

    def totals(self) -> tuple[int, int, int]:
        """Rounds recorded in both, in MLflow, in Optuna (each trial's last step, summed)."""
        from sqlalchemy import text

        with self.mlflow.connect() as conn:
            ml = {
                (s, int(n)): int(step)
                for s, n, step in conn.execute(text(_MLFLOW_STEPS))
                if s in self.studies
            }
        op = self.optuna_steps()
        both = sum(min(v, op.get(k, 0)) for k, v in ml.items())
        return both, sum(ml.values()), sum(op.values())

    def optuna_steps(self) -> dict[tuple[str, int], int]:
        """Last intermediate value's step per trial (= rounds: every round is a report)."""
        from sqlalchemy import text

        op: dict[tuple[str, int], int] = {}
        for engine in self.optuna:
            with contextlib.suppress(Exception), engine.connect() as conn:  # not created yet
                rows = conn.execute(text(_OPTUNA_STEPS))
                op.update({(s, int(n)): int(m) for s, n, m in rows if s in self.studies})
        return op

    def close(self) -> None:
        for engine in (self.mlflow, *self.optuna):
            engine.dispose()


# -- processes --------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError):
        return 0.0


def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        return memory_mib(pid).get("VmRSS", 0.0)
    return 0.0


def pg_backends(url: str) -> list[int]:
    """PIDs of the PostgreSQL backends this benchmark's servers and drivers opened."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            q = "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'ftload%'"
            return [int(r[0]) for r in conn.execute(text(q))]
    finally:
        engine.dispose()


def with_app(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


@contextlib.contextmanager
def start_mlflow(backend_uri: str, root: Path, workers: int = 2):
    """``mlflow db upgrade`` + ``mlflow server`` as the chart runs them (``workers`` workers: the
    chart's 2 by default, serving artifacts): the process and its URL."""
    from tests.integration.conftest import mlflow_server_process

    if backend_uri.startswith("postgresql"):
        subprocess.run(
            [str(BIN / "mlflow"), "db", "upgrade", backend_uri],
            check=True,
            capture_output=True,
            timeout=600,
        )
    else:
        from fedtune.tuning.mlflow.sqlite_template import seed_sqlite_store

        seed_sqlite_store(backend_uri)
    with mlflow_server_process(
        backend_uri,
        root / "mlflow-server.log",
        workers=workers,
        artifacts=(root / "artifacts").as_uri(),
        timeout=300,
        cwd=root,
    ) as started:
        yield started


def split(concurrent: int, studies: int) -> list[int]:
    """Concurrent configurations of each study: ``concurrent`` spread over the drivers.

    Args:
        concurrent: Configurations in all.
        studies: Drivers (at most ``concurrent`` of them get one).

    Returns:
        Each driver's configurations.
    """
    n = min(studies, concurrent)
    return [concurrent // n + (i < concurrent % n) for i in range(n)]


def processes(per_study: list[int], pack: int) -> int:
    """Trial processes the studies run at once.

    Args:
        per_study: Concurrent configurations of each study.
        pack: Configurations per process (``resources.pack``).

    Returns:
        ``ceil(configurations / pack)`` summed over the studies (``packing.reserved_processes``).
    """
    from fedtune.tuning.packing.plan import reserved_processes

    return sum(reserved_processes(max(1, min(pack, n)), n) for n in per_study)


class Step:
    """One ladder step: ``studies`` drivers with ``concurrent`` configurations in all."""

    def __init__(
        self, args: argparse.Namespace, world: dict[str, Any], concurrent: int, pack: int = 1
    ) -> None:
        self.args, self.world, self.concurrent = args, world, concurrent
        self.root = Path(tempfile.mkdtemp(prefix=f"c{concurrent}-", dir=world["root"]))
        self.per_study = split(concurrent, args.studies)
        tag = f"{concurrent}" if pack == 1 else f"{concurrent}p{pack}"
        self.names = [f"load{tag}-{i}" for i in range(len(self.per_study))]
        self.pack = pack
        self.processes = processes(self.per_study, pack)
        self.procs: list[subprocess.Popen] = []
        self.counters = [self.root / f"{n}.json" for n in self.names]

    def start(self) -> None:
        env = {**os.environ, **self.world["client_env"], "PYTHONPATH": str(REPO)}
        env.pop("RAY_ADDRESS", None)
        for i, (name, trials) in enumerate(zip(self.names, self.per_study, strict=True)):
            cfg = {
                "spec": study_spec(
                    name, trials, self.args.rounds, self.pack, self.args.report_every
                ),
                "counter": str(self.counters[i]),
                "workdir": str(self.root / name),
                "tracking": self.world["tracking"],
                "ray_address": self.world["ray_address"],
                "optuna_url": self.world["optuna_url"],
            }
            path = self.root / f"{name}.cfg.json"
            path.write_text(json.dumps(cfg))
            cmd = [sys.executable, str(Path(__file__).resolve()), "--driver", str(path)]
            if i == 0 and self.args.profile:
                cmd = [
                    str(BIN / "py-spy"),
                    "record",
                    "--nonblocking",
                    "--threads",
                    "-r",
                    "50",
                    "-f",
                    "raw",
                    "-o",
                    str(self.root / "profile.txt"),
                    "--",
                    *cmd,
                ]
            log = (self.root / f"{name}.log").open("w")
            self.procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            )

    def counts(self) -> list[dict[str, Any]]:
        out = []
        for path in self.counters:
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                out.append({"pid": None, "received": 0, "running": 0, "done": False})
        return out

    def wait_running(self, timeout: float) -> float:
        """Wait until every configuration has reported a round (the drivers' counters).

        Args:
            timeout: Seconds to wait at most.

        Returns:
            ``time.monotonic()`` when they all ran.

        Raises:
            RuntimeError: A driver exited.
            TimeoutError: They did not all run in time.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(c["running"] for c in self.counts()) >= self.concurrent:
                return time.monotonic()
            if any(p.poll() not in (None, 0) for p in self.procs):
                raise RuntimeError(f"a driver exited: see {self.root}/*.log")
            time.sleep(1.0)
        raise TimeoutError(f"{self.concurrent} configurations not running after {timeout} s")

    def sample(self, recorded: Recorded) -> dict[str, Any]:
        counts = self.counts()
        pids = [c["pid"] for c in counts]
        from tests.service.ray_cluster import session_pids

        server = session_pids(self.world["mlflow_proc"].pid)
        pg = self.world.get("pg_backends", [])
        both, in_mlflow, in_optuna = recorded.totals()
        return {
            "t": time.monotonic(),
            "reported": sum(c["received"] for c in counts),
            "recorded": both,
            "in_mlflow": in_mlflow,
            "in_optuna": in_optuna,
            "driver_cpu_s": [cpu_s(p) if p else 0.0 for p in pids],
            "driver_rss_mb": [rss_mb(p) if p else 0.0 for p in pids],
            "mlflow_cpu_s": {p: cpu_s(p) for p in server},
            "pg_cpu_s": {p: cpu_s(p) for p in pg},
            "trial_cpu_s": {p: cpu_s(p) for p in self.world.get("trial_pids", [])},
            "load_1": os.getloadavg()[0],
        }

    def stop(self, timeout: float = 300) -> float:
        """SIGINT every driver (Ctrl-C / a cancel); seconds until the last one ended."""
        start = time.monotonic()
        for c in self.counts():
            if c["pid"]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c["pid"], signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        return time.monotonic() - start

    def errors(self) -> dict[str, str]:
        """The last lines of the log of every driver that did not end cleanly, and of its Ray
        core worker's log (Ray ends a process whose thread reaches its core worker during its
        shutdown with status 1, saying so only there)."""
        out = {}
        for name, proc in zip(self.names, self.procs, strict=True):
            if proc.returncode not in (0, None):
                lines = (self.root / f"{name}.log").read_text(errors="replace").splitlines()
                core = [
                    line
                    for log in Path("/tmp/ray").glob(
                        f"session_*/logs/python-core-driver-*_{proc.pid}.log"
                    )
                    for line in log.read_text(errors="replace").splitlines()[-4:]
                ]
                out[name] = "\n".join([f"exit status {proc.returncode}", *lines[-6:], *core])
        return out

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

    def lost(self, uri: str, recorder: Recorded) -> dict[str, Any]:
        """After the interrupt: rounds received but not in MLflow, through its REST API.

        Compared per trial, round by round: ``lost`` (received, not stored: must be 0),
        ``duplicated`` (a round stored twice: must be 0) and ``stored_not_counted`` (stored
        by the tracking callback, which Tune runs before the benchmark's counter, when the
        interrupt fell between the two: not a loss). Also, trial by trial, how far Optuna's last
        intermediate values (a sample, at most one per trial per
        ``FedtuneSearch.REPORT_INTERVAL_S``) trail the rounds received
        (``optuna_last_steps_behind``), and how far they lead them
        (``optuna_ahead_not_counted``: Tune gives a result to the searcher before its callbacks,
        so an interrupt between the two leaves one round in Optuna and not counted, as
        ``stored_not_counted`` is for MLflow).
        """
        from mlflow import MlflowClient

        client = MlflowClient(uri)
        counts = self.counts()
        received = sum(c["received"] for c in counts)
        lasts = [{int(k): v for k, v in c.get("last_round", {}).items()} for c in counts]
        optuna = recorder.optuna_steps()
        behind = ahead = 0
        for name, last in zip(self.names, lasts, strict=True):
            numbers = set(last) | {n for s, n in optuna if s == name}
            for number in numbers:
                gap = last.get(number, 0) - optuna.get((name, number), 0)
                behind, ahead = behind + max(gap, 0), ahead + max(-gap, 0)
        stored = lost = duplicated = extra = 0
        for name, last in zip(self.names, [dict(last) for last in lasts], strict=True):
            exp = client.get_experiment_by_name(name)
            for run in client.search_runs([exp.experiment_id], f"tags.study = '{name}'"):
                number = run.data.tags.get("optuna_trial_number")
                if number is None:
                    continue
                steps = [m.step for m in client.get_metric_history(run.info.run_id, "client_loss")]
                have, want = set(steps), set(range(1, last.pop(int(number), 0) + 1))
                stored += len(have)
                duplicated += len(steps) - len(have)
                lost += len(want - have)
                extra += len(have - want)
            lost += sum(last.values())  # a trial with rounds received and no run
        return {
            "received": received,
            "in_mlflow": stored,
            "lost": lost,
            "duplicated": duplicated,
            "stored_not_counted": extra,
            "optuna_last_steps_behind": behind,
            "optuna_ahead_not_counted": ahead,
        }


def measure(
    args: argparse.Namespace, w: dict[str, Any], step: Step, recorder: Recorded
) -> dict[str, Any]:
    load_before = os.getloadavg()
    step.start()
    spy = None
    try:
        began = time.monotonic()
        steady = step.wait_running(args.start_timeout)
        if w.get("pg_url"):
            w["pg_backends"] = pg_backends(w["pg_url"])
        w["trial_pids"] = ray_workers(w["cluster"])
        spy = profile_trial(w["trial_pids"], step.root, args.window) if args.profile_trial else None
        samples = [step.sample(recorder)]
        while samples[-1]["t"] - samples[0]["t"] < args.window:
            time.sleep(max(0.0, 1.0 - (time.monotonic() - samples[-1]["t"])))
            samples.append(step.sample(recorder))
        trials = trial_processes(w["cluster"])
        if spy is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(60)
        stop_s = step.stop()
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        step.kill()
    out = summarize(samples)
    out.update(
        concurrent=step.concurrent,
        studies=len(step.names),
        per_study=step.per_study,
        pack=step.pack,
        processes=step.processes,
        start_to_all_running_s=round(steady - began, 1),
        stop_s=round(stop_s, 1),
        trial_processes=trials,
        load_average_before=[round(x, 2) for x in load_before],
        after_interrupt=step.lost(w["tracking"], recorder),
        driver_errors=step.errors(),
    )
    if args.profile and (step.root / "profile.txt").is_file():
        out["driver0_profile"] = profile((step.root / "profile.txt").read_text())
    if args.profile_trial and (step.root / "trial_profile.txt").is_file():
        out["trial_profile"] = trial_profile((step.root / "trial_profile.txt").read_text())
    return out


# -- figures ------------------------------------------------------------------------------
def _slope(ts: list[float], ys: list[float]) -> float:
    if len(ts) < 2:
        return 0.0
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / den if den else 0.0


def _used(samples: list[dict[str, Any]], key: str) -> float:
    """CPU seconds used over the samples by processes that come and go (``{pid: cpu_s}``): a
    process's CPU time only grows, so a lower reading is one that ended (``cpu_s`` reads 0.0
    once ``/proc/PID`` is gone) and keeps its last value."""
    readings: dict[Any, list[float]] = {}
    for s in samples:
        for pid, cpu in s.get(key, {}).items():
            readings.setdefault(pid, []).append(cpu)
    return sum(_grown(r) for r in readings.values())


def _grown(readings: list[float]) -> float:
    """CPU seconds one process used between its first and its largest reading: ``cpu_s`` reads
    0.0 once the process is gone (a driver that ended before the last sample), and CPU time only
    grows."""
    return max(readings) - readings[0]


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Rates (medians of the per-second rates), backlog and its slope, CPU and memory."""
    t = [s["t"] - samples[0]["t"] for s in samples]
    span = t[-1] - t[0]
    rate = [
        (b["recorded"] - a["recorded"]) / (b["t"] - a["t"]) for a, b in itertools.pairwise(samples)
    ]
    backlog = [s["reported"] - s["recorded"] for s in samples]
    first, last = samples[0], samples[-1]
    drivers = (
        [
            _grown([s["driver_cpu_s"][i] for s in samples]) / span
            for i in range(len(first["driver_cpu_s"]))
        ]
        if span
        else []
    )
    return {
        "window_s": round(span, 1),
        "recorded_rounds_per_s_median": round(statistics.median(rate), 1) if rate else 0.0,
        "recorded_rounds_per_s_mean": round((last["recorded"] - first["recorded"]) / span, 1)
        if span
        else 0.0,
        "reported_rounds_per_s_mean": round((last["reported"] - first["reported"]) / span, 1)
        if span
        else 0.0,
        "backlog_rounds": {
            "first": backlog[0],
            "last": backlog[-1],
            "max": max(backlog),
            "median": statistics.median(backlog),
            "slope_per_s": round(_slope(t, backlog), 2),
        },
        "backlog_series_t_both_mlflow_optuna": [
            [
                round(x, 1),
                b,
                s["reported"] - s.get("in_mlflow", 0),
                s["reported"] - s.get("in_optuna", 0),
            ]
            for x, b, s in zip(t, backlog, samples, strict=True)
        ],
        "driver_cores": {
            "median": round(statistics.median(drivers), 3),
            "max": round(max(drivers), 3),
            "each": [round(d, 3) for d in drivers],
        }
        if drivers
        else {},
        "driver_rss_mb": {
            "median": round(statistics.median(last["driver_rss_mb"]), 1),
            "max": round(max(last["driver_rss_mb"]), 1),
        },
        "mlflow_server_cores": round(_used(samples, "mlflow_cpu_s") / span, 3) if span else 0.0,
        "trial_processes_cores": round(_used(samples, "trial_cpu_s") / span, 3) if span else 0.0,
        "postgres_backends_cores": round(_used(samples, "pg_cpu_s") / span, 3) if span else 0.0,
        "load_1_median": round(statistics.median(s["load_1"] for s in samples), 2),
    }


_AREAS = (  # (area, substring of a frame): the frame nearest the leaf that matches wins
    ("Optuna storage writes", "optuna/"),
    ("MLflow calls in the Tune loop", "mlflow/"),
    ("fedtune callbacks / searcher", "fedtune/tuning"),
    ("Ray Tune result handling", "ray/tune"),
    ("Ray core (object store, gRPC)", "ray/"),
)
_FLUSHER, _STARTUP = "fedtune-mlflow-", "_find_and_load"  # round log's threads, imports


def _area(frames: list[str]) -> str:
    if any(_STARTUP in f for f in frames):
        return "imports (start-up)"
    if _FLUSHER in frames[0]:
        return "MLflow flusher thread (log_batch)"
    for frame in reversed(frames):
        for name, key in _AREAS:
            if key in frame:
                return name
    return "other (no fedtune/Ray/MLflow/Optuna frame)"


def _frame_name(frame: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``."""
    func, _, where = frame.partition(" (")
    return f"{func} ({where.rsplit('/', 1)[-1].split(':')[0]})"


def _raw_stacks(raw: str) -> Iterator[tuple[list[str], int]]:
    """py-spy's raw output (``frame;frame;... count`` per line) as (frames, count) pairs."""
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            yield stack.split(";"), int(n)


def profile(raw: str) -> dict[str, Any]:
    """Where driver 0's CPU goes: py-spy's raw stacks (``frame;frame;... count``, idle excluded)
    by area, and the functions most often on the stack (inclusive), start-up apart."""
    areas: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    others: Counter[str] = Counter()
    total = 0
    for frames, count in _raw_stacks(raw):
        total += count
        area = _area(frames)
        areas[area] += count
        if area.startswith("other"):
            others[_frame_name(frames[-1])] += count
        if area != "imports (start-up)":
            for name in {_frame_name(f) for f in frames[1:]}:
                inclusive[name] += count
    steady = total - areas["imports (start-up)"]
    return {
        "samples": total,
        "startup_share": round(areas["imports (start-up)"] / total, 3) if total else 0.0,
        "share_by_area_after_startup": {
            k: round(v / steady, 3) for k, v in areas.most_common() if k != "imports (start-up)"
        }
        if steady
        else {},
        "other_top_leaf_frames": [[k, round(v / steady, 3)] for k, v in others.most_common(8)]
        if steady
        else [],
        "top_functions_inclusive_after_startup": [
            [k, round(v / steady, 3)] for k, v in inclusive.most_common(25)
        ]
        if steady
        else [],
    }


def projection(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Recorded rounds/s and driver CPU against concurrent trials; what 64/128 trials need."""
    xs = [s["concurrent"] for s in steps]
    rates = [s["recorded_rounds_per_s_mean"] for s in steps]
    cores = [sum(s["driver_cores"].get("each", [])) for s in steps]
    per_round = [c / r * 1000 if r else None for c, r in zip(cores, rates, strict=True)]
    ok = [p for p in per_round if p]
    ms = statistics.median(ok) if ok else None
    return {
        "recorded_rounds_per_s_by_concurrent": dict(zip(map(str, xs), rates, strict=True)),
        "slope_rounds_per_s_per_trial": round(_slope(xs, rates), 2),
        "driver_cpu_ms_per_recorded_round": [round(p, 3) if p else None for p in per_round],
        "driver_cores_for_500_rounds_per_s": round(500 * ms / 1000, 2) if ms else None,
    }


def projections(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`projection` of the steps; with several pack sizes, one per size.

    Args:
        steps: The ladder's steps.

    Returns:
        The projection (``{"pack<P>": projection}`` when the steps have several pack sizes).
    """
    packs = sorted({s.get("pack", 1) for s in steps})
    if len(packs) <= 1:
        return projection(steps) if steps else {}
    return {f"pack{p}": projection([s for s in steps if s.get("pack", 1) == p]) for p in packs}


# -- the world: PostgreSQL schemas, mlflow server, Ray cluster --------------------------
def ray_workers(cluster: Any, name: bytes = b"") -> list[int]:
    """PIDs of the Ray worker processes of the cluster's worker nodes (trials and actors).

    Args:
        cluster: The local Ray cluster.
        name: Only those whose process title (``ray::Class.method``) contains it.

    Returns:
        Their PIDs.
    """
    from tests.service.ray_cluster import session_pids

    out = []
    for node in cluster.nodes:
        for p in session_pids(node.session):
            with contextlib.suppress(OSError):
                title = Path(f"/proc/{p}/cmdline").read_bytes()
                if title.startswith(b"ray::") and name in title:
                    out.append(p)
    return out


def profile_trial(pids: list[int], root: Path, window: float) -> subprocess.Popen | None:
    """Start ``py-spy record`` (idle included) of one trial process for the window.

    Args:
        pids: The worker nodes' Ray processes.
        root: The step's folder (``trial_profile.txt`` goes there).
        window: Seconds to record.

    Returns:
        The py-spy process, or None when no trial process is found.
    """
    trials = [p for p in pids if b"ImplicitFunc" in Path(f"/proc/{p}/cmdline").read_bytes()] or pids
    if not trials:
        return None
    cmd = [str(BIN / "py-spy"), "record", "--pid", str(trials[0]), "--idle", "--threads"]
    cmd += ["-r", "50", "-d", str(int(window) + 1), "-f", "raw", "--nonblocking"]
    cmd += ["-o", str(root / "trial_profile.txt")]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


#: (part, text of the training function's source line that is running): its wall time by part
_TRIAL_PARTS = (
    ("PackBox: ray.get of the driver's stops and refills", "ray.get"),
    ("PackBox: ray.get of the driver's stops and refills", "poll.answer("),
    ("PackBox: waiting for the driver's answer (no member left)", "poll.wait("),
    ("tune.report (hand-off to the driver)", "tune.report"),
    ("engine round (PackedTrainer / Trainer)", ".step()"),
    ("rows and objective (TrialRows)", ".add("),
    ("rows and objective (TrialRows)", "_final("),
    ("rows and objective (TrialRows)", ".report("),
)
_TRAIN_FUNCS = ("_train_pack (", "_train (")


def _source_line(frame: str) -> str:
    """The source text at a py-spy frame ``func (path:line)`` ('' when it cannot be read)."""
    where = frame.rpartition(" (")[2].rstrip(")")
    path, _, line = where.rpartition(":")
    for base in (Path(path), REPO / path):
        with contextlib.suppress(OSError, ValueError, IndexError):
            return base.read_text().splitlines()[int(line) - 1].strip()
    return ""


def trial_profile(raw: str) -> dict[str, Any]:
    """Where a trial's training thread spends its wall time (py-spy raw, idle included).

    Args:
        raw: py-spy's raw stacks (``frame;frame;... count``).

    Returns:
        Samples of the training thread, its share by part (the source line of its training
        function, ``_train_pack`` or ``_train``, that is running names the part) and by line.
    """
    parts: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    total = 0
    for frames, count in _raw_stacks(raw):
        at = next((i for i, f in enumerate(frames) if f.startswith(_TRAIN_FUNCS)), None)
        if at is None:
            continue
        total += count
        text = _source_line(frames[at])
        lines[text] += count
        parts[next((name for name, key in _TRIAL_PARTS if key in text), "other")] += count
    if not total:
        return {"training_thread_samples": 0, "share_by_part": {}, "share_by_line": []}
    return {
        "training_thread_samples": total,
        "share_by_part": {k: round(v / total, 3) for k, v in parts.most_common()},
        "share_by_line": [[k, round(v / total, 3)] for k, v in lines.most_common(10)],
    }


def trial_processes(cluster: Any) -> dict[str, Any]:
    """Ray worker processes (the trials) of the cluster's worker nodes: count and RSS, in all
    and by process title (``ray::ImplicitFunc.train`` a trial or pack, ``ray::PackBox`` a
    packed study's stop-and-refill actor, ``ray::IDLE`` a pooled worker)."""
    pids = ray_workers(cluster)
    rss = [rss_mb(p) for p in pids]
    titles: dict[str, list[float]] = {}
    for pid, mb in zip(pids, rss, strict=True):
        with contextlib.suppress(OSError):
            title = (
                Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            )
            entry = titles.setdefault(title.strip(), [0, 0.0])
            entry[0] += 1
            entry[1] = round(entry[1] + mb)
    return {
        "count": len(pids),
        "rss_mb_total": round(sum(rss)),
        "rss_mb_median": round(statistics.median(rss), 1) if rss else 0,
        "by_title_count_rss_mb": titles,
    }


def mem_available_mb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextlib.contextmanager
def world(args: argparse.Namespace, root: Path):
    """PostgreSQL schemas (or SQLite files), the MLflow server and the Ray cluster."""
    from tests.service.ray_cluster import LocalRayCluster

    with contextlib.ExitStack() as stack:
        w: dict[str, Any] = {"root": root}
        if args.backend == "postgres":
            from fedtune.service.testing import temporary_pg_schema

            ml = stack.enter_context(temporary_pg_schema(PG_URL, "ftload_mlflow"))
            op = stack.enter_context(temporary_pg_schema(PG_URL, "ftload_optuna"))
            import optuna

            optuna.storages.RDBStorage(op).engine.dispose()  # tables made once, not by 8 drivers
            w.update(pg_url=PG_URL, mlflow_db=ml, optuna_url=with_app(op, "ftload-optuna"))
            backend = with_app(ml, "ftload-mlflow")
        else:
            w.update(mlflow_db=f"sqlite:///{root / 'mlflow.db'}", optuna_url=None)
            backend = w["mlflow_db"]
        w["mlflow_proc"], w["tracking"] = stack.enter_context(
            start_mlflow(backend, root, args.mlflow_workers)
        )
        # lean: no log monitors (the drivers take no worker logs), no autoscaler, no Ray Client
        # server and a dashboard of one module: none of it is measured, all of it costs CPU
        cluster = LocalRayCluster(
            {}, head_cpus=0, lean=True, dashboard_modules=RAY_DASHBOARD_MODULES
        ).start()
        stack.callback(cluster.stop)
        for i in range(args.nodes):
            node = cluster.add_node(f"gpu{i}", num_cpus=16, num_gpus=args.gpus_per_node)
            for pid in node.pids if args.trial_nice else ():  # its raylet's children inherit it
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, pid, args.trial_nice)
        w.update(cluster=cluster, ray_address=cluster.gcs_address, client_env=cluster.client_env)
        yield w


def optuna_dbs(w: dict[str, Any], step: Step) -> list[str]:
    if w["optuna_url"]:
        return [w["optuna_url"]]
    return [f"sqlite:///{step.root / n / 'optuna.db'}" for n in step.names]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--driver", help=argparse.SUPPRESS)
    p.add_argument(
        "--ladder",
        default="8,16,32,64",
        help="total concurrent trials (configurations, with --pack) per step",
    )
    p.add_argument("--studies", type=int, default=8, help="drivers (studies) at once")
    p.add_argument(
        "--pack",
        type=int,
        nargs="+",
        default=[1],
        help="configurations per trial process (each study's resources.pack); several: "
        "each step of the ladder is run with each",
    )
    p.add_argument(
        "--report-every",
        type=int,
        default=1,
        help="rounds per report to Tune (every round is recorded either way)",
    )
    p.add_argument("--nodes", type=int, default=3, help="Ray worker nodes")
    p.add_argument("--gpus-per-node", type=int, default=16)
    p.add_argument("--rounds", type=int, default=100_000, help="rounds per trial (cut by SIGINT)")
    p.add_argument("--window", type=float, default=60.0, help="measured seconds per step")
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--backend", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument(
        "--mlflow-workers",
        type=int,
        default=2,
        help="workers of the MLflow server (the Helm chart's 2 by default; 1: one process less)",
    )
    p.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="driver 0 under py-spy",
    )
    p.add_argument(
        "--profile-trial",
        action="store_true",
        help="one trial process (a pack) under py-spy during the window, idle included",
    )
    p.add_argument("--trial-mb", type=float, default=450.0, help="RSS per trial, first guess")
    p.add_argument(
        "--trial-nice",
        type=int,
        default=0,
        help="run the worker nodes (trials) at this nice value: on one machine they "
        "then stand in for GPU nodes whose CPUs are not the drivers' and the "
        "tracking server's (0: every process shares the CPUs as an equal)",
    )
    p.add_argument("--out", default=str(REPO / "benchmarks/results/load.json"))
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the run's directory (drivers' and MLflow server's logs); kept anyway when "
        "a round was lost",
    )
    args = p.parse_args(argv)
    if args.driver:
        drive(args.driver)
        return {}
    report: dict[str, Any] = {
        "benchmark": "load",
        "environment": environment(),
        "args": {k: v for k, v in vars(args).items() if k != "driver"},
        "goal": GOAL,
        "steps": [],
        "skipped": [],
    }
    root = Path(tempfile.mkdtemp(prefix="ftload-", dir="/tmp"))
    trial_mb = args.trial_mb
    ladder = [(int(x), pack) for x in args.ladder.split(",") for pack in args.pack]
    with world(args, root) as w:
        for concurrent, pack in ladder:
            per = split(concurrent, args.studies)
            need = processes(per, pack) * trial_mb + len(per) * 700
            if need > 0.85 * mem_available_mb():
                report["skipped"].append(
                    {
                        "concurrent": concurrent,
                        "pack": pack,
                        "reason": f"needs ~{need:.0f} MB ({trial_mb:.0f} MB per trial process measured), "
                        f"{mem_available_mb():.0f} MB available",
                    }
                )
                continue
            result = run_one(args, w, concurrent, pack)
            report["steps"].append(result)
            if result["trial_processes"]["count"]:
                trial_mb = (
                    result["trial_processes"]["rss_mb_total"] / result["trial_processes"]["count"]
                )
            print(
                json.dumps(
                    {
                        k: result[k]
                        for k in (
                            "concurrent",
                            "pack",
                            "recorded_rounds_per_s_mean",
                            "backlog_rounds",
                            "driver_cores",
                        )
                    },
                    default=str,
                ),
                flush=True,
            )
    report["projection"] = projections(report["steps"])
    report["environment_after"] = {"load_average_1_5_15": [round(x, 2) for x in os.getloadavg()]}
    # a loss or a driver that did not end cleanly keeps its evidence: the drivers' and the
    # MLflow server's logs
    keep = args.keep or any(
        step["after_interrupt"]["lost"] or step["driver_errors"] for step in report["steps"]
    )
    if keep:
        report["kept"] = str(root)
        print(f"kept the drivers' and the MLflow server's logs in {root}", file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    import shutil

    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return report


def run_one(
    args: argparse.Namespace, w: dict[str, Any], concurrent: int, pack: int = 1
) -> dict[str, Any]:
    """One ladder step (see the module docstring), with its own recorder.

    Args:
        args: The command line.
        w: The world (:func:`world`).
        concurrent: Configurations at once, in all.
        pack: Configurations per trial process.

    Returns:
        The step's figures.
    """
    step = Step(args, w, concurrent, pack)
    recorder = Recorded(w["mlflow_db"], optuna_dbs(w, step), step.names)
    try:
        return measure(args, w, step, recorder)
    finally:
        recorder.close()


if __name__ == "__main__":
    main()
