"""Where a study's trials run is chosen once, from the typed spec
(``fedtune.tuning.driver.placement.runs_in_process``); ``fedtune tune``'s prefetch, which reads
the study file before the spec exists, agrees with that choice on every file of the table."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest

from fedtune.tuning.driver.placement import likely_in_process, place
from fedtune.tuning.spec import StudySpec

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "name": "placed",
    "task": {"name": "quadratic", "clients": 2, "dim": 2, "examples": 2, "seed": 0},
    "algorithm": "fedavg",
    "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 1, "batch_size": 1},
    "search": {"space": "fedavg"},
    "sampler": {"name": "random", "seed": 0},
    "scheduler": {"name": "none"},
    "objective": {"metric": "train_loss", "last_rounds": 1},
}

#: (budget, resources, in the driver's process?)
TABLE = [
    (None, None, True),  # the spec's defaults: one at a time on the CPU
    ({"trials": 4}, None, True),
    ({"max_concurrent": 1}, {"cpu": 2}, True),
    ({"max_concurrent": 1.0}, None, True),  # an integral float is the integer
    ({"max_concurrent": 2}, None, True),  # pack auto: one pack here costs less than Ray
    ({"max_concurrent": 2}, {"pack": 2}, True),  # all of them in one pack
    ({"max_concurrent": 4}, {"pack": 2}, False),  # two processes, as the spec asks
    ({"max_concurrent": 2}, {"pack": "auto"}, True),
    ({"max_concurrent": 2}, {"pack": 1}, False),  # one configuration per process
    ({"max_concurrent": 2}, {"gpu": 1}, False),
    ({"max_concurrent": 1}, {"pack": "auto"}, True),
    ({"max_concurrent": 1}, {"gpu": 0.5}, False),
    ({"max_concurrent": 1}, {"gpu": 0}, True),
    ({"max_concurrent": 1}, {"gpu": 1}, False),
]


def _doc(budget, resources) -> dict:
    doc = copy.deepcopy(BASE)
    if budget is not None:
        doc["budget"] = budget
    if resources is not None:
        doc["resources"] = resources
    return doc


@pytest.mark.parametrize(("budget", "resources", "here"), TABLE)
def test_the_prefetch_agrees_with_the_choice(no_ray, budget, resources, here) -> None:
    doc = _doc(budget, resources)
    spec = StudySpec.from_dict(copy.deepcopy(doc))
    assert place(spec, allowed=True, target=spec.budget.trials).in_process is here
    assert likely_in_process(doc, allowed=True) is here
    assert place(spec, allowed=False).in_process is False  # --ray
    assert likely_in_process(doc, allowed=False) is False


def test_a_named_cluster_takes_the_trials(no_ray, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = StudySpec.from_dict(_doc(None, None))
    assert place(spec, allowed=True).in_process
    assert not place(spec, allowed=True, ray_address="10.0.0.1:6379").in_process
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert not place(spec, allowed=True).in_process


def test_the_module_imports_nothing_heavy() -> None:
    """``fedtune tune`` reads the file with it before it imports the engine."""
    code = (
        "import sys, fedtune.tuning.driver.placement\n"
        "print(sorted(m for m in ('torch', 'ray', 'optuna', 'mlflow', 'pydantic') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_ray_another_thread_is_importing_is_waited_for(tmp_path: Path) -> None:
    """``fedtune tune``'s early Ray imports Ray in a thread while the driver places the study:
    the choice waits for the module (it asked a half-imported ``ray`` for ``is_initialized``,
    an AttributeError, before), and a Ray already running in the process takes the trials."""
    fake = tmp_path / "ray"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import time\ntime.sleep(1.5)\n\ndef is_initialized():\n    return True\n"
    )
    code = (
        "import sys, threading, time\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "from fedtune.tuning.driver.placement import place\n"
        "from fedtune.tuning.spec import StudySpec\n"
        f"spec = StudySpec.from_dict({BASE!r})\n"
        "threading.Thread(target=__import__, args=('ray',)).start()\n"
        "while 'ray' not in sys.modules:\n"
        "    time.sleep(0.01)\n"
        "print(place(spec, allowed=True).in_process)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"  # the Ray running here takes the trials
