"""The service with months of history: list/get latency at a fixed request rate, and the
scheduler's tick cost as finished studies pile up.

1. **API.** A fresh PostgreSQL schema is seeded (``seed_history.seed``: ``--studies`` studies
   over five projects, mostly finished, and ``--trials`` trial rows), then ``fedtune serve``
   (uvicorn, one process, ``FEDTUNE_BACKEND=none``: nothing runs, the numbers are HTTP +
   database) answers, for each scenario in turn, ``--rate`` requests per second **open-loop**:
   request *i* is sent at ``t0 + i / rate`` whether or not earlier ones have answered, and its
   latency runs from that scheduled instant to the answer (a slow answer delays nothing, so
   queueing shows in the tail instead of slowing the load — no coordinated omission).
   Scenarios: ``list_first`` (``GET /v1/studies?limit=50``), ``list_deep_token`` (a page past the
   middle of the list, by ``page_token``), ``list_deep_offset`` (the same depth by ``offset``,
   the old way, for comparison), ``list_filtered`` (a project and/or states, first page and
   token pages), ``list_asc`` (``order=asc``, first and deep pages) and ``get_study``
   (``GET /v1/studies/{id}``, studies of ~``trials / studies`` trials each). The tokens are
   collected beforehand by walking the lists (not measured).
2. **Scheduler tick.** On another schema with a fixed live set (queued and running studies),
   finished studies are added up to each of ``--tick-levels`` (0, 1k, 10k); at each level
   ``Scheduler.tick()`` (watch, release, admission, dispatch: every query of a tick, with a
   backend whose drivers are all alive and which keeps finished drivers, so nothing changes
   between ticks) is timed ``--tick-repeats`` times in this process; median, p90, the number
   of SQL statements per tick and the pages its reads touch (``EXPLAIN (ANALYZE, BUFFERS)``:
   independent of the machine's load) are reported.

``--url`` measures a schema seeded beforehand (``seed_history.py --schema``, outside the
benchmark lock); without it a fresh schema is seeded first and dropped after. Writes
``benchmarks/results/history_load.json`` (machine, versions, load average, settings,
per-scenario p50/p90/p99/max, the tick table). Usage: ``python benchmarks/history_load.py
[--studies 10000] [--trials 1000000] [--rate 20] [--duration 30] [--tick-levels 0 1000 10000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment
from seed_history import PROJECTS, Seeded, seed
from service_load import TOKEN, pg_schema, pg_version, server

from fedtune.service.backends.base import Backend, DriverStatus, LaunchRequest
from fedtune.service.settings import BackendKind

OUT = Path(__file__).resolve().parent / "results" / "history_load.json"
TARGET_P99_MS = 50.0
FINISHED = {"succeeded": 0.85, "failed": 0.08, "cancelled": 0.07}

Request = tuple[str, dict[str, Any]]  # path, query parameters


def summary(latencies_s: list[float], errors: list[str], wall_s: float) -> dict:
    ms = np.asarray(latencies_s or [float("nan")]) * 1000
    return {
        "requests": len(latencies_s),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "achieved_rps": round(len(latencies_s) / wall_s, 2) if wall_s else None,
        **{f"p{q}_ms": round(float(np.percentile(ms, q)), 2) for q in (50, 90, 99)},
        "max_ms": round(float(ms.max()), 2),
    }


async def _open_loop(base: str, pick: Callable[[int], Request], rate: float, n: int) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=base, headers=headers, timeout=60, limits=limits
    ) as client:
        loop = asyncio.get_running_loop()

        async def one(i: int, due: float) -> None:
            path, params = pick(i)
            try:
                answer = await client.get(path, params=params)
                if not answer.is_success:
                    errors.append(f"HTTP {answer.status_code}: {answer.text[:120]}")
            except Exception as exc:  # a failed call is a data point, not a lost task
                errors.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
            latencies.append(loop.time() - due)

        t0 = loop.time() + 0.05
        tasks = []
        for i in range(n):
            due = t0 + i / rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            tasks.append(asyncio.create_task(one(i, due)))
        await asyncio.gather(*tasks)
        wall = loop.time() - t0
    return summary(latencies, errors, wall)


def open_loop(base: str, pick: Callable[[int], Request], rate: float, duration: float) -> dict:
    """``rate`` requests/s for ``duration`` s on a fixed schedule (see the module docstring)."""
    return asyncio.run(_open_loop(base, pick, rate, max(1, round(rate * duration))))


def walk_tokens(base: str, params: dict[str, Any], limit: int = 50) -> list[str | None]:
    """The ``page_token`` of every page of a list (None for the first), by walking it."""
    tokens: list[str | None] = [None]
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as client:
        while True:
            query = {**params, "limit": limit, "include_total": "false"}
            if tokens[-1] is not None:
                query["page_token"] = tokens[-1]
            page = client.get("/v1/studies", params=query).raise_for_status().json()
            if page["next_page_token"] is None:
                return tokens
            tokens.append(page["next_page_token"])


def scenarios(base: str, ids: list[str], rng: random.Random) -> dict[str, Callable[[int], Request]]:
    """What each scenario requests at its *i*-th call."""
    desc, asc = walk_tokens(base, {}), walk_tokens(base, {"order": "asc"})
    deep_desc, deep_asc = desc[len(desc) // 2 :] or desc, asc[len(asc) // 2 :] or asc
    filters = [{"project": p} for p in PROJECTS[:3]]
    filters += [
        {"state": "succeeded"},
        {"state": ["failed", "cancelled"]},
        {"project": PROJECTS[1], "state": "succeeded"},
        {"project": PROJECTS[2], "state": ["queued", "running"]},
    ]
    filtered = [(f, t) for f in filters for t in walk_tokens(base, f)[:20]]

    def token(params: dict[str, Any], tok: str | None) -> dict[str, Any]:
        return {**params, "limit": 50, **({"page_token": tok} if tok else {})}

    return {
        "list_first": lambda i: ("/v1/studies", {"limit": 50}),
        "list_deep_token": lambda i: ("/v1/studies", token({}, rng.choice(deep_desc))),
        "list_deep_offset": lambda i: (
            "/v1/studies",
            {
                "limit": 50,
                "offset": 50 * rng.randrange(len(desc) // 2, max(len(desc) // 2 + 1, len(desc))),
            },
        ),
        "list_filtered": lambda i: ("/v1/studies", token(*rng.choice(filtered))),
        "list_asc": lambda i: (
            "/v1/studies",
            token({"order": "asc"}, None if i % 2 else rng.choice(deep_asc)),
        ),
        "get_study": lambda i: (f"/v1/studies/{rng.choice(ids)}", {}),
    }


class AliveBackend(Backend):
    """Every driver alive, finished ones kept until released: a tick that changes nothing."""

    kind = BackendKind.LOCAL
    keeps_finished: ClassVar[bool] = True

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        return {"study": request.study_id, "attempt": request.attempt}

    def poll(self, ref: Any) -> DriverStatus:
        return DriverStatus.RUNNING

    def stop(self, ref: Any) -> None:
        return None

    def release(self, ref: Any) -> bool:
        return True


def pages_read(db: Any, statements: list[tuple[str, Any]]) -> int:
    """8 KiB pages (shared buffers hit or read) that the reads among ``statements`` touch, by
    ``EXPLAIN (ANALYZE, BUFFERS)``: the tick's cost in data touched, whatever the machine's load."""
    total = 0
    with db.engine.connect() as conn:
        for statement, parameters in statements:
            if not statement.lstrip().upper().startswith("SELECT"):
                continue
            plan = conn.exec_driver_sql(
                f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", parameters
            ).scalar()
            top = plan[0]["Plan"]
            total += int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))
        conn.rollback()
    return total


def tick_costs(url: str, levels: list[int], repeats: int, workdir: Path) -> dict:
    """Median ``Scheduler.tick()`` seconds with 0, 1k, 10k … finished studies (see above)."""
    from sqlalchemy import event

    from fedtune.service.db import Database
    from fedtune.service.scheduler import Scheduler
    from fedtune.service.settings import load_settings

    live = seed(url, 40, 400, states={"queued": 0.8, "running": 0.2}, seed_=10_001)
    running = len(live.by_state.get("running", []))
    settings = load_settings(
        database_url=url,
        backend="none",
        workdir=str(workdir),
        max_concurrent_studies=max(1, running),
    )
    db = Database(url)
    statements: list[tuple[str, Any]] = []
    event.listen(db.engine, "before_cursor_execute", lambda *a: statements.append((a[2], a[3])))
    out, have = {}, 0
    try:
        for level in sorted(levels):
            if level > have:
                seed(url, level - have, 10 * (level - have), states=FINISHED, seed_=level)
                have = level
            scheduler = Scheduler(db, AliveBackend(), settings)
            for _ in range(3):
                scheduler.tick()  # warm: connections, the first reasons recorded
            times = []
            statements.clear()
            for _ in range(repeats):
                t0 = time.perf_counter()
                scheduler.tick()
                times.append(time.perf_counter() - t0)
            out[str(level)] = {
                "finished_studies": level,
                "live_studies": len(live.ids),
                "median_ms": round(statistics.median(times) * 1000, 2),
                "p90_ms": round(float(np.percentile(times, 90)) * 1000, 2),
                "min_ms": round(min(times) * 1000, 2),
                "repeats": repeats,
                "statements_per_tick": round(len(statements) / repeats, 1),
                "pages_read_per_tick": pages_read(db, statements[-len(statements) // repeats :]),
            }
            print(f"tick with {level} finished studies: median {out[str(level)]['median_ms']} ms")
    finally:
        db.dispose()
    return out


def existing(url: str) -> Seeded:
    """What a schema seeded before (``seed_history.py --schema``) holds."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, state FROM studies ORDER BY created_at, id")).all()
            trials = int(conn.execute(text("SELECT count(*) FROM trials")).scalar() or 0)
    finally:
        engine.dispose()
    by_state: dict[str, list[str]] = {}
    for sid, state in rows:
        by_state.setdefault(state, []).append(sid)
    return Seeded([sid for sid, _ in rows], by_state, trials, 0.0)


def checkpoint(url: str) -> bool:
    """Write the seeding's dirty pages out now (``CHECKPOINT``), so that PostgreSQL's next
    timed checkpoint does not land in a measured scenario; False without the right to."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import DBAPIError

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("CHECKPOINT"))
        return True
    except DBAPIError:  # needs superuser or pg_checkpoint
        return False
    finally:
        engine.dispose()


def run(args: argparse.Namespace, workdir: Path, report: dict) -> bool:
    if not args.tick_only:
        api(args, workdir, report)
    with pg_schema() as url:
        report["tick"] = tick_costs(url, args.tick_levels, args.tick_repeats, workdir)
    return all(r["errors"] == 0 for r in report["endpoints"].values())


def api(args: argparse.Namespace, workdir: Path, report: dict) -> None:
    """Part 1 (see the module docstring) into ``report``."""
    rng = random.Random(0)
    with contextlib.ExitStack() as stack:
        if args.url:  # seeded beforehand (not under the benchmark lock)
            url, seeded = args.url, existing(args.url)
        else:
            url = stack.enter_context(pg_schema())
            seeded = seed(url, args.studies, args.trials, now=dt.datetime.now(dt.UTC))
        report["seed"] = {
            "studies": len(seeded.ids),
            "trials": seeded.trials,
            "by_state": {k: len(v) for k, v in sorted(seeded.by_state.items())},
            "seconds": seeded.seconds,
            "schema": "given" if args.url else "fresh",
        }
        print(f"{len(seeded.ids)} studies, {seeded.trials} trials (seeded in {seeded.seconds} s)")
        report["seed"]["checkpoint_before"] = checkpoint(url)
        queued = set(seeded.by_state.get("queued", []))
        ran = [i for i in seeded.ids if i not in queued]
        with server(url, workdir) as base:
            report["server_ready_s"] = server.ready_s  # type: ignore[attr-defined]
            picks = scenarios(base, ran, rng)
            open_loop(base, picks["list_first"], args.rate, 2.0)  # warm-up, not reported
            for name, pick in picks.items():
                result = open_loop(base, pick, args.rate, args.duration)
                result["p99_within_target"] = result["p99_ms"] <= TARGET_P99_MS
                report["endpoints"][name] = result
                print(
                    f"{name}: p50 {result['p50_ms']} ms p99 {result['p99_ms']} ms "
                    f"max {result['max_ms']} ms errors {result['errors']}"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url",
        help="a schema seeded before by seed_history.py (its URL, with "
        "search_path); default: seed a fresh one here",
    )
    parser.add_argument("--studies", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per scenario")
    parser.add_argument("--tick-levels", type=int, nargs="+", default=[0, 1000, 10_000])
    parser.add_argument("--tick-repeats", type=int, default=21)
    parser.add_argument("--tick-only", action="store_true", help="only part 2 (the tick)")
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args(argv)
    from importlib import metadata

    report: dict = {
        "benchmark": "history_load",
        "environment": environment(),
        "settings": {
            "studies": args.studies,
            "trials": args.trials,
            "rate_rps": args.rate,
            "duration_s_per_scenario": args.duration,
            "page_size": 50,
            "load": "open-loop, fixed arrival schedule; latency from the scheduled send time",
            "target_p99_ms": TARGET_P99_MS,
            "backend": "none",
            "auth": "bearer token (bootstrap admin)",
            "server": "fedtune serve (uvicorn, 1 process) on PostgreSQL",
            "tick_levels": args.tick_levels,
            "tick_repeats": args.tick_repeats,
        },
        "endpoints": {},
    }
    report["environment"]["versions"].update(
        {n: metadata.version(n) for n in ("fastapi", "uvicorn", "sqlalchemy", "psycopg", "httpx")}
    )
    report["environment"]["versions"]["postgresql_server"] = pg_version()
    ok = False
    try:
        with tempfile.TemporaryDirectory(prefix="fedtune-history-") as tmp:
            ok = run(args, Path(tmp), report)
    except Exception as exc:
        report["failed"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
        print(f"FAILED: {report['failed']}", file=sys.stderr)
    finally:  # the JSON is written whatever happened, with what was measured
        report["environment"]["load_average_after_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
