"""benchmarks/local_step.py on a few steps: the three step kinds run the same client update
(same rows, same weights) and the JSON has what docs/explanation/benchmarks.md quotes. Nothing here asserts a timing."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.benchmarks import load_benchmark


def load():
    return load_benchmark("local_step.py")


def test_writes_the_json_for_each_model(tmp_path: Path) -> None:
    bench = load()
    out = tmp_path / "local_step.json"
    doc = bench.main(["--steps", "10", "--repeats", "1", "--models", "linear", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))
    r = doc["results"]["linear"]
    assert set(r["us_per_step"]) == {"loop", "eager", "functional"}
    assert all(v > 0 for v in r["us_per_step"].values())
    assert doc["setting"]["steps"] == 10 and doc["environment"]["torch_threads"] == 1


def test_eager_and_functional_are_the_same_client_update() -> None:
    """What the benchmark times as ``eager`` and ``functional`` is one ClientUpdate, two ways."""
    bench = load()
    torch.manual_seed(0)
    fns = bench.step_fns("linear", 10)
    assert set(fns) == {"loop", "eager", "functional"}
    from fedtune.trainers import build_task
    from fedtune.trainers.client import ClientRule, make_client_fn
    from fedtune.trainers.module_loss import ModuleLoss

    task = build_task("digits", {"clients": 100, "model": "linear"}, seed=0)
    net = task.model_fn(torch.Generator().manual_seed(0)).double()
    fn = make_client_fn(ModuleLoss(net, task.loss_fn), ClientRule(theta=torch.ones(bench.K)))
    params = {n: p.detach().clone() for n, p in net.named_parameters()}
    rows = torch.randint(0, 50, (bench.K, bench.B), generator=torch.Generator().manual_seed(2))
    xb, yb = task.train.inputs.double()[rows], task.train.targets[rows]
    a, b = fn.eager(params, bench.LR, xb, yb), fn(params, bench.LR, xb, yb)
    assert all(torch.equal(a[n], b[n]) for n in a)
