"""A trial's error reads as the user's, not as Ray's or fedtune's plumbing."""

from __future__ import annotations

from types import SimpleNamespace

from fedtune.errors import CodeError
from fedtune.tuning.driver.failures import error_line
from fedtune.tuning.spec import StudySpec
from fedtune.tuning.trials.results import trial_message


def test_a_trial_error_names_the_users_file_not_rays_unpacked_copy(tmp_path) -> None:
    (tmp_path / "lab" / "pf_lab").mkdir(parents=True)
    (tmp_path / "lab" / "pf_lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "pf_lab" / "empty.py").write_text("")
    spec = StudySpec.from_dict(
        {
            "name": "s",
            "task": {"name": "quadratic", "clients": 4, "dim": 2},
            "algorithm": "fedavg",
            "train": {"rounds": 30},
            "code": {"path": str(tmp_path / "lab"), "modules": ["pf_lab.empty"]},
        }
    )
    unpacked = (
        "/tmp/fedtune-ray-x/session_1/runtime_resources/py_modules_files/"
        "_ray_pkg_af21b9be3815ffde/pf_lab/tasks.py:7"
    )
    exc = CodeError("task.name", "the builder of task 'pf' raised OSError: gone", unpacked)
    text = trial_message(exc, spec)
    assert text == (
        f"task.name: the builder of task 'pf' raised OSError: gone "
        f"(at {tmp_path / 'lab' / 'pf_lab' / 'tasks.py'}:7)"
    )
    assert "CodeError" not in text


def test_the_error_line_drops_rays_trial_error_wrapper() -> None:
    trace = (
        'Traceback (most recent call last):\n  File "trainable.py", line 3\n'
        "fedtune.tuning.trials.results.TrialError: task.name: the builder raised OSError: x\n"
    )
    trial = SimpleNamespace(get_error=lambda: trace)
    assert error_line(trial) == "task.name: the builder raised OSError: x"
    assert error_line(SimpleNamespace(get_error=lambda: "")).startswith("the trial failed")
