"""Tasks declare their parameters; a spec's unknown or out-of-range ``task.*``
is refused when the spec is read — before Ray starts, and at submission (422) — naming the field.

It used to be found only inside the trials: ``task: {name: digits, clinets: 10}`` started Ray and
failed all 16 quickstart trials after 49 s (``fedtune tune`` exit 1; the service accepted it).
"""

from __future__ import annotations

import textwrap

import pytest

from fedtune.cli import main
from fedtune.errors import ConfigError
from fedtune.extend import load_code
from fedtune.trainers.tasks.registry import task_parameters
from fedtune.tuning.spec import StudySpec

BASE = {"name": "s", "algorithm": "fedavg", "train": {"rounds": 30}}


@pytest.mark.parametrize(
    ("task", "field", "words"),
    [
        (
            {"name": "digits", "clinets": 10},
            "task.clinets",
            "unknown key; did you mean clients? (known: clients, dirichlet, model, size_skew, "
            "test_fraction)",
        ),
        ({"name": "digits", "clients": 1000}, "task.clients", "must be in [2, 500]"),
        ({"name": "quadratic", "clients": 4, "dim": "two"}, "task.dim", "an integer"),
    ],
)
def test_a_bad_task_parameter_is_refused_when_the_spec_is_read(task, field, words) -> None:
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict({**BASE, "task": task})
    assert err.value.field == field and words in err.value.reason


def test_tasks_params_lists_what_a_task_declares(capsys) -> None:
    assert main(["tasks", "--params", "digits"]) == 0
    out = capsys.readouterr().out
    for name in ("clients", "dirichlet", "model", "test_fraction", "size_skew"):
        assert name in out
    assert ("clients", "int", 50) in task_parameters("digits")
    assert main(["tasks", "--params", "no_such_task"]) == 2


def test_a_user_task_declares_its_parameters_through_the_extension_api(tmp_path) -> None:
    name = f"ptask_{tmp_path.name.replace('-', '_')}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(
        textwrap.dedent(f"""
        from dataclasses import dataclass
        from fedtune.extend import register_task
        from fedtune.trainers.tasks import build_task


        @dataclass(frozen=True)
        class Params:
            clients: int = 4
            noise: float = 0.1

            def validate(self, path):
                if not 0 <= self.noise <= 1:
                    from fedtune.errors import ConfigError
                    raise ConfigError(f"{{path}}.noise", "must be in [0, 1]")


        @register_task("{name}_t", "a user task with declared parameters", params=Params)
        def build(params, seed):
            return build_task("quadratic", {{"clients": params.get("clients", 4), "dim": 2}}, seed)
    """)
    )
    load_code({"path": str(tmp_path), "modules": [f"{name}.tasks"]})
    assert [r[0] for r in task_parameters(f"{name}_t")] == ["clients", "noise"]
    code = {"path": str(tmp_path), "modules": [f"{name}.tasks"]}
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict({**BASE, "task": {"name": f"{name}_t", "nosie": 0.2}, "code": code})
    assert err.value.field == "task.nosie"
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict({**BASE, "task": {"name": f"{name}_t", "noise": 3.0}, "code": code})
    assert err.value.field == "task.noise"
    StudySpec.from_dict({**BASE, "task": {"name": f"{name}_t", "noise": 0.5}, "code": code})
