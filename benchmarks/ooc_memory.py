"""Peak RSS of federated rounds on out-of-core clients, by population size.

Generates (never downloads) Stack Overflow-shaped TFF HDF5 files — ``examples/<client>/tokens``
with one space-separated post per entry, as the ``stackoverflow_nwp`` loader reads — with
10,000, 342,477 (the real Stack Overflow training population) and 1,000,000 clients, then, for
each file, runs rounds in a fresh subprocess and records its memory from ``/proc/self/status``:

* ``load``: seconds and peak RSS (VmHWM) of building the lazy task (one streamed pass over the
  file for the vocabulary and the client sizes);
* per round: the peak RSS *of that round* (VmHWM reset through ``/proc/self/clear_refs`` just
  before it), RSS after it, and how many clients the store read. Round 1 also evaluates the
  population loss (read in windows of ``eval_chunk_rows`` rows); the other rounds train and
  evaluate only their cohort (``eval_every`` is beyond the last round run);
* ``load.ru_maxrss_mib``: ``resource.getrusage``'s peak at the end of the load (read before the
  first reset, which also lowers what getrusage reports afterwards), and the process's peak over
  load and rounds (``process_peak_rss_mib``).

``--in-memory-max N`` also runs the in-memory store (``lazy: false``) for populations up to N, for
contrast. Medians are over ``--repeats`` subprocesses (per population) and, within one, over
its rounds after the first. Data shape: posts per client ~ round(LogNormal(0.5, 1)) clipped to
1..128, words per post ~ LogNormal(2.3, 0.6) clipped to 1..40, words Zipf(1.2) over 20,000
distinct words; the real data set has ~400 posts per client, far more than can be generated on
a 2-core machine in minutes, and the point here is how memory scales with the number of
clients. The model is a per-token bigram (embedding 16 → vocabulary), tiny on purpose: the
model's memory does not depend on the population, the data's would. Files go to ``--workdir``
(default /tmp/fedtune-ooc, reused across runs when their generator version matches; never
committed).

``--eval-population sample --eval-clients S`` makes round 1 evaluate S clients instead of the
population (``train.eval_population``). ``slopes_bytes_per_client`` fits, over the populations
measured, how many bytes per client the loaded store keeps (``load_growth``: RSS after the load
minus RSS after the imports) and how many a round adds on top of it (first round, which
evaluates, and the later ones): what "does not grow with the population" is checked against.

``--posts-max`` lowers the clip of posts per client (default 128) where generating the largest
population takes too long on a small machine; the number of clients is what must not shrink.

Usage: ``python benchmarks/ooc_memory.py [--populations 10000 342477 1000000] [--rounds 4]
[--repeats 1] [--vocab 100] [--in-memory-max 342477] [--posts-max 128]
[--eval-population full|sample|off] [--eval-clients S] [--append]``. Writes ``benchmarks/results/ooc_memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment, memory_mib

GENERATOR = 1
WORDS = 20_000
BLOCK = 10_000  # clients generated per vectorised block


# ---------------------------------------------------------------- data generation


POSTS_MAX = 128  # default clip of posts per client (files written before the option have it)


def _posts(
    rng: np.random.Generator, clients: int, posts_max: int = POSTS_MAX
) -> tuple[np.ndarray, list[bytes]]:
    """Posts per client and the posts' texts of one block of clients."""
    per_client = np.clip(np.rint(rng.lognormal(0.5, 1.0, clients)), 1, posts_max).astype(np.int64)
    lengths = np.clip(np.rint(rng.lognormal(2.3, 0.6, int(per_client.sum()))), 1, 40)
    words = rng.zipf(1.2, int(lengths.sum())) % WORDS
    vocab = np.array([f"w{i}".encode() for i in range(WORDS)], dtype=object)
    tokens = vocab[words]
    ends = np.cumsum(lengths.astype(np.int64))
    texts = [
        b" ".join(tokens[e - n : e]) for e, n in zip(ends, lengths.astype(np.int64), strict=True)
    ]
    return per_client, texts


def generate(path: Path, clients: int, seed: int = 0, posts_max: int = POSTS_MAX) -> dict:
    """Write ``clients`` clients to ``path`` with h5py's low-level API (one group and one
    variable-length string dataset per client); reuse an existing file of the same recipe."""
    recipe = {"generator": GENERATOR, "clients": clients, "seed": seed, "posts_max": posts_max}
    if path.exists():
        with h5py.File(path, "r") as f:
            found = {k: f.attrs.get(k, POSTS_MAX if k == "posts_max" else None) for k in recipe}
            if found == recipe:
                return {
                    "reused": True,
                    "bytes": path.stat().st_size,
                    "posts": int(f.attrs["posts"]),
                }
    path.parent.mkdir(parents=True, exist_ok=True)
    start, rng, posts = time.perf_counter(), np.random.default_rng(seed), 0
    string = h5py.string_dtype()
    tid = h5py.h5t.py_create(string, logical=True)
    tmp = path.with_suffix(".tmp")
    with h5py.File(tmp, "w", libver="latest") as f:
        examples = f.create_group("examples").id
        for lo in range(0, clients, BLOCK):
            per_client, texts = _posts(rng, min(BLOCK, clients - lo), posts_max)
            offset = 0
            for k, n in enumerate(per_client.tolist()):
                data = np.array(texts[offset : offset + n], dtype=string)
                offset += n
                group = h5py.h5g.create(examples, f"{lo + k:08d}".encode())
                dataset = h5py.h5d.create(group, b"tokens", tid, h5py.h5s.create_simple((n,)))
                dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, data)
            posts += len(texts)
        f.attrs.update({**recipe, "posts": posts})
    tmp.rename(path)
    return {
        "reused": False,
        "seconds": round(time.perf_counter() - start, 1),
        "bytes": path.stat().st_size,
        "posts": posts,
    }


# ---------------------------------------------------------------- one measured process


def _peak_and_after() -> dict[str, float]:
    mem = memory_mib()
    return {"peak_rss_mib": mem["VmHWM"], "rss_after_mib": mem["VmRSS"]}


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux ≥ 4.0: VmHWM := VmRSS


def child(
    path: str,
    rounds: int,
    lazy: bool,
    vocab: int,
    clients_per_round: int,
    eval_population: str = "full",
    eval_clients: int | None = None,
) -> dict:
    import torch
    from torch import nn

    from fedtune.trainers import Trainer
    from fedtune.trainers.models import register_model

    torch.set_num_threads(1)

    @register_model("ooc_bench_bigram")
    def bigram(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
        return nn.Sequential(nn.Embedding(num_outputs, 16), nn.Linear(16, num_outputs))

    config = {
        "task": {
            "name": "stackoverflow_nwp",
            "train_path": path,
            "lazy": lazy,
            "vocab_size": vocab,
            "model": "ooc_bench_bigram",
        },
        "algorithm": "fedavg",
        "train": {
            "rounds": rounds + 1,  # the last round (which evaluates) is never run
            "clients_per_round": clients_per_round,
            "local_steps": 4,
            "batch_size": 16,
            "eval_every": 10**6,
            "eval_batch_size": 1024,
            "eval_population": eval_population,
            "eval_clients": eval_clients,
            "dtype": "float32",
            "device": "cpu",
        },
        "hparams": {"client_lr": 0.1, "server_lr": 1.0},
        "seed": 0,
    }
    out = {"rss_after_imports_mib": memory_mib()["VmRSS"]}
    start = time.perf_counter()
    trainer = Trainer(config)
    out["load"] = {
        "seconds": time.perf_counter() - start,
        **_peak_and_after(),
        "clients": trainer.data.num_clients,
        "examples": trainer.data.num_examples,
    }
    # getrusage's peak before VmHWM is reset below (the reset also lowers what it reports later)
    out["load"]["ru_maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["rounds"] = []
    for t in range(rounds):
        read = getattr(trainer.data, "loaded", None)
        _reset_peak()
        start = time.perf_counter()
        record = trainer.step()
        out["rounds"].append(
            {
                "round": t + 1,
                "population_eval": record.train_loss is not None,
                "eval_clients": record.extra.get("eval_clients"),
                "seconds": time.perf_counter() - start,
                **_peak_and_after(),
                "clients_read": None if read is None else trainer.data.loaded - read,
                "client_loss": record.client_loss,
                "train_loss": record.train_loss,
            }
        )
    out["process_peak_rss_mib"] = max(
        [out["load"]["peak_rss_mib"]] + [r["peak_rss_mib"] for r in out["rounds"]]
    )
    return out


# ---------------------------------------------------------------- driver


def run_child(path: Path, args: argparse.Namespace, lazy: bool) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        str(path),
        "--rounds",
        str(args.rounds),
        "--vocab",
        str(args.vocab),
        "--clients-per-round",
        str(args.clients_per_round),
        "--eval-population",
        args.eval_population,
    ]
    cmd += [] if args.eval_clients is None else ["--eval-clients", str(args.eval_clients)]
    cmd += [] if lazy else ["--in-memory"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(runs: list[dict]) -> dict:
    med = statistics.median
    later = [r for run in runs for r in run["rounds"][1:]]
    first = [run["rounds"][0] for run in runs]
    return {
        "repeats": len(runs),
        "clients": runs[0]["load"]["clients"],
        "examples": runs[0]["load"]["examples"],
        "median_round_peak_rss_mib": round(med(r["peak_rss_mib"] for r in later), 1),
        "max_round_peak_rss_mib": round(max(r["peak_rss_mib"] for r in later), 1),
        # what a round adds on top of the loaded store (the store's own index is in the load)
        "median_round_peak_above_load_mib": round(
            med(
                r["peak_rss_mib"] - run["load"]["rss_after_mib"]
                for run in runs
                for r in run["rounds"][1:]
            ),
            1,
        ),
        "median_first_round_peak_rss_mib": round(med(r["peak_rss_mib"] for r in first), 1),
        "median_round_seconds": round(med(r["seconds"] for r in later), 3),
        "median_first_round_seconds": round(med(r["seconds"] for r in first), 1),
        "median_clients_read_per_round": med(r["clients_read"] or 0 for r in later),
        "median_load_seconds": round(med(run["load"]["seconds"] for run in runs), 1),
        "median_load_peak_rss_mib": round(med(run["load"]["peak_rss_mib"] for run in runs), 1),
        "median_rss_after_load_mib": round(med(run["load"]["rss_after_mib"] for run in runs), 1),
        "median_rss_after_imports_mib": round(med(run["rss_after_imports_mib"] for run in runs), 1),
        # what the loaded store keeps resident (load RSS − RSS after the imports)
        "median_load_growth_mib": round(
            med(run["load"]["rss_after_mib"] - run["rss_after_imports_mib"] for run in runs), 1
        ),
        "median_first_round_peak_above_load_mib": round(
            med(run["rounds"][0]["peak_rss_mib"] - run["load"]["rss_after_mib"] for run in runs), 1
        ),
        "median_load_ru_maxrss_mib": round(med(run["load"]["ru_maxrss_mib"] for run in runs), 1),
        "median_process_peak_rss_mib": round(med(run["process_peak_rss_mib"] for run in runs), 1),
        "runs": runs,
    }


def slopes(lazy: dict) -> dict:
    """Bytes per client of the resident set's growth with the population: what the loaded
    store keeps (``load_growth``), the first round's peak (it evaluates the population) and the
    later rounds' peak, each above the loaded store. ``fit``: least squares over every
    population; ``largest_two``: between the two largest, where both evaluate in full
    ``eval_chunk_rows`` windows (a population smaller than one window evaluates in a smaller
    one, which lowers its peak for a reason that is not the population)."""
    if len(lazy) < 2:
        return {}
    keys = sorted(lazy, key=int)
    n = np.array([float(k) for k in keys])
    out: dict = {"fit": {}, "largest_two": {}}
    for key in (
        "median_load_growth_mib",
        "median_first_round_peak_above_load_mib",
        "median_round_peak_above_load_mib",
    ):
        y = np.array([lazy[k][key] for k in keys]) * 2**20
        name = key.replace("median_", "").replace("_mib", "")
        out["fit"][name] = round(float(np.polyfit(n, y, 1)[0]), 2)
        out["largest_two"][name] = round(float((y[-1] - y[-2]) / (n[-1] - n[-2])), 2)
    return out


def _appended(old: dict, settings: dict, parser: argparse.ArgumentParser) -> dict:
    """``old`` results extended by this run: every setting but the populations must match (so
    that the populations stay comparable); the environment is that of the latest run."""
    differ = sorted(
        k for k in settings if k != "populations" and old["settings"].get(k) != settings[k]
    )
    if differ:
        parser.error(f"--append: settings differ from the existing file: {', '.join(differ)}")
    populations = sorted(set(old["settings"]["populations"]) | set(settings["populations"]))
    return {
        **old,
        "settings": {**settings, "populations": populations},
        "environment": {**environment(), "earlier": old["environment"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populations", type=int, nargs="+", default=[10_000, 342_477, 1_000_000])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=100)
    parser.add_argument("--clients-per-round", type=int, default=50)
    parser.add_argument("--in-memory-max", type=int, default=342_477)
    parser.add_argument("--posts-max", type=int, default=POSTS_MAX)
    parser.add_argument(
        "--eval-population",
        choices=["full", "sample", "off"],
        default="full",
        help="train.eval_population of round 1 (full: the whole population, in windows)",
    )
    parser.add_argument(
        "--eval-clients", type=int, default=None, help="S for --eval-population sample"
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add these populations to an existing --out file measured with the same settings",
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fedtune-ooc"))
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "ooc_memory.json"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--in-memory", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be >= 2 (round 1 also evaluates the population)")
    if args.child:
        result = child(
            args.child,
            args.rounds,
            not args.in_memory,
            args.vocab,
            args.clients_per_round,
            args.eval_population,
            args.eval_clients,
        )
        print(json.dumps(result))
        return
    settings = {
        k: v
        for k, v in vars(args).items()
        if k not in ("child", "in_memory", "out", "workdir", "append")
    }
    results: dict = {
        "benchmark": "ooc_memory",
        "settings": settings,
        "environment": environment(),
        "files": {},
        "lazy": {},
        "in_memory": {},
    }
    if args.append and args.out.exists():
        results = _appended(json.loads(args.out.read_text()), settings, parser)
    plan = [(n, True) for n in args.populations]  # lazy first: the point of the benchmark
    plan += [(n, False) for n in args.populations if n <= args.in_memory_max]
    for n, lazy in plan:
        suffix = "" if args.posts_max == POSTS_MAX else f"_p{args.posts_max}"
        path = args.workdir / f"stackoverflow_shaped_{n}{suffix}.h5"
        if str(n) not in results["files"]:
            results["files"][str(n)] = generate(path, n, posts_max=args.posts_max)
            print(f"{n} clients: file {results['files'][str(n)]}", flush=True)
        runs = [run_child(path, args, lazy) for _ in range(args.repeats)]
        summary = summarise(runs)
        results["lazy" if lazy else "in_memory"][str(n)] = summary
        brief = {k: v for k, v in summary.items() if k != "runs"}
        print(f"{n} clients, {'lazy' if lazy else 'in-memory'}: {brief}", flush=True)
        results["slopes_bytes_per_client"] = slopes(results["lazy"])
        results["environment"]["load_average_1_5_15_at_end"] = [
            round(x, 2) for x in os.getloadavg()
        ]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(results, indent=2) + "\n"
        )  # after each run: partial results survive
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
