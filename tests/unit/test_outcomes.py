"""The one trial-outcome vocabulary: how a trial's end is decided, its mappings to Optuna,
MLflow and the service, and that no other module spells an outcome as a bare string."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fedtune.outcomes import (
    RAN,
    RUNNING,
    TrialOutcome,
    final_outcome,
    from_optuna_state,
    mlflow_status,
    optuna_state,
    service_state,
)
from fedtune.states import TrialState
from fedtune.trainers.records import Outcome

PACKAGE = Path(__file__).resolve().parents[2] / "fedtune"

#: Modules allowed to spell an outcome as a string literal, relative to ``fedtune/`` (none).
ALLOWED: set[str] = set()


@pytest.mark.parametrize(
    ("last_reported", "error", "expected"),
    [
        (RUNNING, False, TrialOutcome.STOPPED),  # stopped early: its last report was not final
        ("completed", False, TrialOutcome.COMPLETED),
        ("diverged", False, TrialOutcome.DIVERGED),
        ("stopped", False, TrialOutcome.STOPPED),
        (None, False, TrialOutcome.FAILED),  # ended without reporting an outcome
        ("failed", False, TrialOutcome.FAILED),
        ("interrupted", False, TrialOutcome.FAILED),  # never reported by a trial
        ("cancelled", False, TrialOutcome.FAILED),
        ("bogus", False, TrialOutcome.FAILED),
        (RUNNING, True, TrialOutcome.FAILED),  # an error wins over any report
        ("completed", True, TrialOutcome.FAILED),
        ("diverged", True, TrialOutcome.FAILED),
        (None, True, TrialOutcome.FAILED),
    ],
)
def test_the_final_outcome_of_a_trial(last_reported, error, expected) -> None:
    assert final_outcome(last_reported, error=error) is expected


def test_the_engine_outcomes_are_trial_outcomes_that_ran() -> None:
    assert {TrialOutcome(o) for o in Outcome} == RAN
    for outcome in Outcome:  # what a trial reports last is the engine's outcome
        assert final_outcome(outcome) is TrialOutcome(outcome)


def test_every_outcome_has_an_optuna_state() -> None:
    optuna = pytest.importorskip("optuna")
    expected = {
        "completed": "COMPLETE",
        "diverged": "COMPLETE",  # with the worst objective values
        "stopped": "PRUNED",
        "failed": "FAIL",
        "interrupted": "FAIL",
        "cancelled": "FAIL",
    }
    assert {str(o): optuna_state(o) for o in TrialOutcome} == expected
    for outcome in TrialOutcome:
        assert optuna.trial.TrialState[optuna_state(outcome)].is_finished()


def test_an_optuna_state_without_a_recorded_outcome_reads_back() -> None:
    assert from_optuna_state("COMPLETE") is TrialOutcome.COMPLETED
    assert from_optuna_state("PRUNED") is TrialOutcome.STOPPED
    assert from_optuna_state("FAIL") is TrialOutcome.FAILED
    for outcome in (TrialOutcome.COMPLETED, TrialOutcome.STOPPED, TrialOutcome.FAILED):
        assert from_optuna_state(optuna_state(outcome)) is outcome  # a round trip


def test_every_outcome_has_an_mlflow_status() -> None:
    entities = pytest.importorskip("mlflow.entities")
    expected = {
        "completed": "FINISHED",
        "diverged": "FINISHED",
        "stopped": "FINISHED",
        "failed": "FAILED",
        "interrupted": "KILLED",
        "cancelled": "KILLED",
    }
    assert {str(o): mlflow_status(o) for o in TrialOutcome} == expected
    for outcome in TrialOutcome:
        assert entities.RunStatus.from_string(mlflow_status(outcome)) is not None


def test_every_outcome_has_a_service_state() -> None:
    expected = {
        "completed": TrialState.COMPLETED,
        "diverged": TrialState.COMPLETED,
        "stopped": TrialState.PRUNED,
        "failed": TrialState.FAILED,
        "interrupted": TrialState.KILLED,
        "cancelled": TrialState.KILLED,
    }
    assert {str(o): service_state(o) for o in TrialOutcome} == expected
    assert TrialState.RUNNING not in {service_state(o) for o in TrialOutcome}  # all are ends


def test_a_mapping_refuses_what_is_not_an_outcome() -> None:
    for mapping in (optuna_state, mlflow_status, service_state):
        with pytest.raises(ValueError):
            mapping(RUNNING)  # a trial still running has no final state


def test_the_values_are_the_stored_strings() -> None:
    """The strings in the Optuna attribute, the MLflow tag, the service's database and API."""
    assert [o.value for o in TrialOutcome] == [
        "completed",
        "diverged",
        "stopped",
        "failed",
        "interrupted",
        "cancelled",
    ]
    assert RUNNING == "running"


def test_the_module_imports_in_the_light_install() -> None:
    """The SDK and the client CLI use it without torch, Optuna, MLflow, SQLAlchemy or Ray."""
    script = (
        "import sys, importlib.abc\n"
        "BLOCKED = ('torch', 'optuna', 'mlflow', 'sqlalchemy', 'ray', 'fastapi', 'numpy')\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from fedtune.outcomes import final_outcome, service_state\n"
        "print(service_state(final_outcome('running')))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "pruned"


def _enum_member_values(tree: ast.AST) -> set[int]:
    """Find the constants that define members of an enum class.

    Such a class is another vocabulary (study, trial and driver states) whose values may
    equal an outcome's.

    Args:
        tree: a parsed module.

    Returns:
        The ``id`` of each such constant node.
    """
    ids = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        bases = {
            b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases
        }
        if not any(b.endswith("Enum") for b in bases):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                ids.add(id(stmt.value))
    return ids


def bare_outcomes(path: Path) -> list[tuple[int, str]]:
    """Find the string constants in a module that equal an outcome's value.

    Args:
        path: the module's file.

    Returns:
        ``(line, value)`` of each, enum members of other vocabularies left out.
    """
    values = {o.value for o in TrialOutcome}
    tree = ast.parse(path.read_text(), filename=str(path))
    members = _enum_member_values(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in values and id(node) not in members
    ]


def test_the_scan_finds_a_bare_outcome(tmp_path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import enum\n"
        'class S(enum.StrEnum):\n    FAILED = "failed"\n'  # another vocabulary: allowed
        'def f(x):\n    return x == "stopped"\n'
    )
    assert bare_outcomes(module) == [(5, "stopped")]


def test_no_module_spells_an_outcome_as_a_bare_string() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == "outcomes.py" or name in ALLOWED:
            continue
        if hits := bare_outcomes(path):
            found[name] = hits
    assert found == {}, f"use fedtune.outcomes.TrialOutcome instead: {found}"
