"""Seed a service database with months of history: many studies, many trials (a fixture script).

Brings the PostgreSQL schema at ``--url`` to the current revision, adds the projects, then
streams ``--studies`` studies (created over ``--days`` days, spread over the projects; mostly
finished — succeeded, failed, cancelled — with a few queued and running ones) and
``--trials`` trial rows (spread over the studies that ran) with ``COPY … FROM STDIN``, and runs
``VACUUM ANALYZE`` so the planner knows the tables' sizes. Rows are deterministic under
``--seed``. 10,000 studies and 1,000,000 trials take about a minute.

Used by ``benchmarks/history_load.py`` (``seed``) and by the query-plan test
(``tests/service/test_query_plans.py``, a few thousand rows). Usage:
``python benchmarks/seed_history.py --url postgresql+psycopg://postgres@127.0.0.1:5432/test
[--schema NAME] [--studies 10000] [--trials 1000000]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

#: state mix of the seeded studies (queued and running ones stay few: history is mostly final)
STATE_WEIGHTS = {
    "succeeded": 0.80,
    "failed": 0.09,
    "cancelled": 0.08,
    "queued": 0.02,
    "running": 0.01,
}
PROJECTS = ("default", "vision", "speech", "nlp", "meta")
ALGORITHMS = ("fedavg", "fedprox", "fedavgm", "fedadam", "reptile")
STUDY_COLUMNS = (
    "id",
    "name",
    "state",
    "spec",
    "algorithm",
    "task",
    "trials_requested",
    "backend",
    "driver_ref",
    "attempts",
    "error",
    "best_trial",
    "best_value",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "project",
    "owner",
    "priority",
    "reserved_gpus",
    "reserved_trials",
)
TRIAL_COLUMNS = (
    "study_id",
    "number",
    "state",
    "params",
    "value",
    "outcome",
    "last_round",
    "started_at",
    "finished_at",
)


class Seeded(NamedTuple):
    """What :func:`seed` wrote: the study ids (oldest first), per state, and the seconds taken
    (a NamedTuple: the script is loaded by path in tests, outside ``sys.modules``)."""

    ids: list[str]
    by_state: dict[str, list[str]]
    trials: int
    seconds: float


def spec(name: str, algorithm: str, trials: int, gpu: float) -> dict[str, Any]:
    return {
        "name": name,
        "task": {"name": "quadratic", "clients": 8, "dim": 4},
        "algorithm": algorithm,
        "train": {"rounds": 20, "clients_per_round": 4, "local_steps": 5, "batch_size": 4},
        "objective": {"metric": "train_loss", "last_rounds": 5, "mode": "min"},
        "sampler": {"name": "tpe", "seed": 0},
        "scheduler": {"name": "asha"},
        "budget": {"trials": trials, "max_concurrent": 2},
        "resources": {"cpu": 1, "gpu": gpu},
    }


def study_rows(
    n: int,
    *,
    days: float,
    now: dt.datetime,
    rng: random.Random,
    states: dict[str, float] | None = None,
    projects: Sequence[str] = PROJECTS,
) -> Iterator[tuple]:
    """``n`` study rows (``STUDY_COLUMNS``), created at increasing times over ``days`` days."""
    weights = states or STATE_WEIGHTS
    names, shares = list(weights), list(weights.values())
    span = dt.timedelta(days=days)
    seen: set[str] = set()
    for i in range(n):
        sid = f"{rng.getrandbits(48):012x}"
        while sid in seen:
            sid = f"{rng.getrandbits(48):012x}"
        seen.add(sid)
        state = rng.choices(names, shares)[0]
        created = now - span + span * (i + rng.random()) / max(n, 1)
        algorithm, trials = rng.choice(ALGORITHMS), rng.choice((50, 100, 150))
        gpu = rng.choice((0.0, 0.0, 0.5, 1.0))
        started = None if state == "queued" else created + dt.timedelta(seconds=rng.uniform(1, 60))
        finished = None
        if state in ("succeeded", "failed", "cancelled"):
            finished = (started or created) + dt.timedelta(minutes=rng.uniform(5, 600))
            finished = min(finished, now - dt.timedelta(hours=2))  # outside the fair-share window
        live = state == "running"
        yield (
            sid,
            f"study-{i}",
            state,
            json.dumps(spec(f"study-{i}", algorithm, trials, gpu)),
            algorithm,
            "quadratic",
            trials,
            None if state == "queued" else "local",
            json.dumps({"pid": 10_000 + i}) if live else None,
            0 if state == "queued" else 1,
            "driver exited (failed)" if state == "failed" else None,
            0 if state == "succeeded" else None,
            round(rng.uniform(0.01, 1.0), 6) if state == "succeeded" else None,
            created,
            finished or started or created,
            started,
            finished,
            rng.choice(projects),
            "admin",
            0,
            (gpu * 2) if live else 0.0,
            2 if live else 0,
        )


def trial_rows(studies: Sequence[tuple], total: int, rng: random.Random) -> Iterator[tuple]:
    """``total`` trial rows (``TRIAL_COLUMNS``) spread evenly over ``studies`` (study rows)."""
    if not studies:
        return
    per, extra = divmod(total, len(studies))
    for k, row in enumerate(studies):
        sid, state, created = row[0], row[2], row[13]
        for number in range(per + (1 if k < extra else 0)):
            done = state != "running" or number < per // 2
            trial_state = rng.choices(["completed", "pruned", "failed"], [0.7, 0.25, 0.05])[0]
            value = round(rng.uniform(0.01, 2.0), 6) if trial_state != "failed" else None
            began = created + dt.timedelta(seconds=30 * number)
            yield (
                sid,
                number,
                trial_state if done else "running",
                json.dumps(
                    {
                        "hparams.client_lr": round(rng.uniform(1e-3, 1), 6),
                        "hparams.server_lr": round(rng.uniform(1e-2, 2), 6),
                        "hparams.local_steps": rng.randint(1, 20),
                    }
                ),
                value if done else None,
                {"completed": "completed", "pruned": "stopped", "failed": None}[trial_state]
                if done
                else None,
                20 if done else 3,
                began,
                began + dt.timedelta(seconds=25) if done else None,
            )


def _copy(conn: Any, table: str, columns: Sequence[str], rows: Iterator[tuple]) -> int:
    count = 0
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)
            count += 1
    return count


def seed(
    url: str,
    studies: int,
    trials: int,
    *,
    days: float = 120.0,
    seed_: int = 0,
    states: dict[str, float] | None = None,
    now: dt.datetime | None = None,
    analyze: bool = True,
) -> Seeded:
    """Seed the (PostgreSQL) database at ``url``, brought to the current revision first.
    Appends: calling it again adds more studies (new ids) and trials."""
    from sqlalchemy import text

    from fedtune.service.db import Database
    from fedtune.service.migrate import upgrade_database

    start = time.perf_counter()
    rng = random.Random(seed_)
    db = Database(url)
    try:
        upgrade_database(db)
        with db.engine.begin() as conn:
            for name in PROJECTS:
                conn.execute(
                    text(
                        "INSERT INTO projects (name, weight, max_priority, created_at) "
                        "VALUES (:n, 1.0, 0, now()) ON CONFLICT DO NOTHING"
                    ),
                    {"n": name},
                )
        rows = list(
            study_rows(
                studies, days=days, now=now or dt.datetime.now(dt.UTC), rng=rng, states=states
            )
        )
        raw = db.engine.raw_connection()
        try:
            dbapi = raw.driver_connection
            _copy(dbapi, "studies", STUDY_COLUMNS, iter(rows))
            ran = [r for r in rows if r[2] != "queued"]
            written = _copy(dbapi, "trials", TRIAL_COLUMNS, trial_rows(ran, trials, rng))
            dbapi.commit()
        finally:
            raw.close()
        if analyze:
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE studies"))
                conn.execute(text("VACUUM ANALYZE trials"))
    finally:
        db.dispose()
    by_state: dict[str, list[str]] = {}
    for row in rows:
        by_state.setdefault(row[2], []).append(row[0])
    return Seeded([r[0] for r in rows], by_state, written, round(time.perf_counter() - start, 2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="PostgreSQL SQLAlchemy URL")
    parser.add_argument("--schema", help="create this schema and seed it (default: the URL's)")
    parser.add_argument("--studies", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    url = args.url
    if args.schema:
        from sqlalchemy import create_engine, text

        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{args.schema}"'))
        engine.dispose()
        url = f"{url}?options=-csearch_path%3D{args.schema}"
    done = seed(url, args.studies, args.trials, days=args.days, seed_=args.seed)
    counts = {k: len(v) for k, v in sorted(done.by_state.items())}
    print(f"seeded {len(done.ids)} studies {counts} and {done.trials} trials in {done.seconds} s")
    print(f"url: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
