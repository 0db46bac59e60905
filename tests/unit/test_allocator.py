"""A CPU pack keeps its freed memory: glibc's thresholds are raised once, the environment wins,
and a pack's rounds fault in far fewer pages (fedtune/trainers/allocator.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="mallopt's thresholds are glibc's (this C library is not glibc)",
)


def _run(code: str, env: dict[str, str] | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (the thresholds are per process); its last line is
    JSON."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    environ.pop("GLIBC_TUNABLES", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_thresholds_are_raised_once_per_process():
    out = _run(
        """
        import json, ctypes
        from fedtune.trainers import allocator
        calls = []
        real = ctypes.CDLL
        class Libc:
            def __init__(self, name):
                self.lib = real(name)
            def mallopt(self, option, value):
                calls.append((option, value))
                return self.lib.mallopt(option, value)
        allocator.ctypes.CDLL = Libc
        print(json.dumps({"first": allocator.keep_freed_memory(),
                          "second": allocator.keep_freed_memory(), "calls": calls}))
        """
    )
    assert out["first"] is True and out["second"] is True
    assert sorted(out["calls"]) == sorted([[-3, 32 * 2**20], [-1, 2**30]])


@pytest.mark.parametrize(
    "env",
    [
        {"MALLOC_TRIM_THRESHOLD_": "131072"},
        {"MALLOC_MMAP_THRESHOLD_": "65536"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"},
    ],
)
def test_thresholds_the_environment_sets_are_left_alone(env):
    out = _run(
        """
        import json
        from fedtune.trainers.allocator import keep_freed_memory
        print(json.dumps({"raised": keep_freed_memory()}))
        """,
        env,
    )
    assert out["raised"] is False


@pytest.mark.timeout(300)
def test_a_cpu_packs_rounds_fault_in_far_fewer_pages():
    code = """
        import json, resource, sys, torch
        torch.set_num_threads(1)
        import fedtune.trainers.packed as packed
        if {off}:
            packed.keep_freed_memory = lambda: False
        task = {{"name": "digits", "seed": 0, "clients": 20, "model": "mlp"}}
        configs = [
            {{"task": task, "algorithm": "fedavgm", "seed": j,
              "train": {{"rounds": 50, "clients_per_round": 10, "local_steps": 5,
                        "batch_size": 20, "eval_every": 1000, "eval_population": "off"}},
              "hparams": {{"client_lr": 0.02 + 0.01 * j, "server_lr": 0.05}}}}
            for j in range(4)
        ]
        pack = packed.PackedTrainer(configs)
        for _ in range(2):
            pack.step()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            pack.step()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        print(json.dumps({{"faults_per_round": faults / 3}}))
        """
    kept = _run(code.format(off=False))["faults_per_round"]
    # glibc's own thresholds, fixed: left to adapt (it raises the mmap threshold to the size of a
    # freed mapped block) this small pack sometimes kept its memory anyway (160 pages a round in
    # 1 of 6 runs), so the baseline would not be the one the pack is measured against
    glibc_defaults = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    handed_back = _run(code.format(off=True), glibc_defaults)["faults_per_round"]
    # measured: 2-223 against 16,160-16,440 pages a round for the digits MLP's pack of 4
    print(kept, handed_back)
    assert kept * 5 < handed_back, (kept, handed_back)
