"""The engine's gradient transform (:mod:`fedtune.trainers.func_grad`) and what a trial loads.

* Training (every algorithm, both runners, ℓ_i in the first step, local epochs, a pack) never
  imports ``torch._dynamo``; with ``torch.func.grad`` a vectorized trial did (about 1 CPU-s
  of every trial process: docs/explanation/architecture.md, "No compiler in a trial").
* Without ``torch._dynamo`` loaded, :func:`~fedtune.trainers.func_grad.grad` gives
  ``torch.func.grad``'s gradients bit for bit: under vmap with shared and batched parameters,
  nested (MAML's meta-gradient), with ``has_aux``, several ``argnums``, an unused input, inside
  ``no_grad``, for the digits models in float32 and float64.

Both run in one fresh interpreter, since this one has usually loaded ``torch._dynamo``
already (where it has, ``grad`` is ``torch.func.grad`` itself).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fedtune.trainers.func_grad import grad

ROOT = Path(__file__).resolve().parents[2]

_PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch.func import vmap
    from fedtune.trainers import Trainer, algorithms, build_task
    from fedtune.trainers.packed import PackedTrainer
    from fedtune.trainers.func_grad import grad
    from fedtune.trainers.module_loss import ModuleLoss
    from tests.unit.test_engine_contract import config_for, epochs_config
    from tests.unit.test_packed_exactness import variants

    def dynamo():
        return "torch._dynamo" in sys.modules

    out = {"loaded_at_start": dynamo(), "trained": [], "loaded_by": []}

    def train(label, cfg, runner):
        cfg["train"]["runner"] = runner
        trainer = Trainer(cfg)
        while not trainer.done:
            trainer.step()
        out["trained"].append(f"{label}:{trainer.runner_name}")
        if dynamo() and not out["loaded_by"]:
            out["loaded_by"].append(f"{label}:{runner}")

    for name in sorted(algorithms()):
        for runner in ("vectorized", "sequential"):
            train(name, config_for(name, train={"rounds": 2}), runner)
    for runner in ("vectorized", "sequential"):  # l_i in the first step (n_i <= B); epochs
        train("first-step", config_for("fedprox", train={"rounds": 2, "batch_size": 8}), runner)
        train("epochs", epochs_config("fedavg", train={"rounds": 2}), runner)
    pack = PackedTrainer(variants("fedprox"))
    while not pack.done:
        pack.step()
    if dynamo() and not out["loaded_by"]:
        out["loaded_by"].append("packed")

    def cases(g):
        \"\"\"Gradients of the digits models' losses by the transform ``g``.\"\"\"
        results = []
        for model in ("linear", "mlp", "cnn"):
            task = build_task("digits", {"clients": 10, "model": model}, seed=0)
            for dtype in (torch.float32, torch.float64):
                net = task.model_fn(torch.Generator().manual_seed(0)).to(dtype)
                loss = ModuleLoss(net, task.loss_fn)
                x = {n: p.detach().clone() for n, p in net.named_parameters()}
                gen = torch.Generator().manual_seed(1)
                rows = torch.randint(0, len(task.train.inputs), (4, 3, 5), generator=gen)
                xb, yb = task.train.inputs.to(dtype)[rows], task.train.targets[rows]
                shared = vmap(g(loss), in_dims=(None, 0, 0))(x, xb[:, 0], yb[:, 0])
                ys = {n: x[n] - 0.1 * shared[n] for n in x}  # a cohort's batched points
                batched = vmap(g(loss))(ys, xb[:, 1], yb[:, 1])

                def maml(p, xs, ts):
                    inner = g(loss)(p, xs[0], ts[0])
                    return loss({n: p[n] - 0.1 * inner[n] for n in p}, xs[1], ts[1])

                meta = vmap(g(maml), in_dims=(None, 0, 0))(x, xb, yb)
                per_example = lambda p, a, b: (loss.per_example(p, a, b).mean(),
                                               loss.per_example(p, a, b))
                aux = g(per_example, has_aux=True)(x, xb[0, 0], yb[0, 0])
                first = next(iter(x))
                two = g(lambda p, q, a, b: loss(p, a, b) * q.sum(), argnums=(0, 1))(
                    x, x[first], xb[0, 0], yb[0, 0])
                unused = g(lambda p, q: (p * p).sum())(x[first], x[first])
                with torch.no_grad():
                    quiet = g(loss)(x, xb[0, 0], yb[0, 0])
                results.append((shared, batched, meta, aux, two, unused, quiet))
        return results

    mine = cases(grad)
    refusals = []
    for f, aux in ((lambda v: v * 2, False), (lambda v: v.sum(), True)):
        try:
            grad(f, has_aux=aux)(torch.ones(3))
        except RuntimeError as exc:
            refusals.append(str(exc))
    out["refusals"] = refusals
    out["loaded_by_grad"] = dynamo()
    theirs = cases(torch.func.grad)
    a, _ = torch.utils._pytree.tree_flatten(mine)
    b, _ = torch.utils._pytree.tree_flatten(theirs)
    out["leaves"] = len(a)
    out["equal"] = len(a) == len(b) and all(torch.equal(s, t) for s, t in zip(a, b))
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def probe() -> dict:
    """One fresh interpreter: train, then compare the two transforms."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_training_never_imports_torch_dynamo(probe) -> None:
    assert not probe["loaded_at_start"]
    assert any(t.endswith(":vectorized") for t in probe["trained"])
    assert any(t.endswith(":sequential") for t in probe["trained"])
    assert probe["loaded_by"] == []


def test_grad_is_torch_func_grad_bit_for_bit_without_dynamo(probe) -> None:
    assert not probe["loaded_by_grad"]  # the comparison ran the dynamo-free transform
    assert probe["leaves"] > 100
    assert probe["equal"]


def test_grad_follows_torch_func_grad_where_dynamo_is_loaded() -> None:
    importlib.import_module("torch._dynamo")  # as a user's torch.compile would

    f = lambda w, c: (c * w.sin()).sum()  # noqa: E731
    w, c = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    assert torch.equal(grad(f)(w, c), torch.func.grad(f)(w, c))
    assert torch.equal(grad(f)(w, c), c * w.cos())


def test_grad_refuses_what_torch_func_grad_refuses(probe) -> None:
    not_scalar, no_aux = probe["refusals"]
    assert "scalar" in not_scalar
    assert "(output, aux)" in no_aux
