"""The study spec's typed sections: ``task``, ``train`` and ``decay`` are the engine's own types,
the base trial configuration is derived from them (and built once), the keys a user wrote stay
the written ones through storage, and every error names its dotted path by one convention."""

from __future__ import annotations

import pytest

from fedtune.errors import ConfigError
from fedtune.trainers.config import DecayConfig, TaskConfig, TrainConfig, TrialConfig
from fedtune.trainers.parsing import parse_trial_config
from fedtune.tuning import StudySpec

RAW = {
    "name": "typed",
    "task": {"name": "quadratic", "clients": 6, "dim": 3},
    "algorithm": "fedavg",
    "train": {"rounds": 12.0, "clients_per_round": 3, "local_steps": None},
    "hparams": {"client_lr": 0.01},
    "search": {"override": {"client_lr": None, "server_lr": {"high": 2.0}}},
}


def test_the_sections_are_the_engines_types():
    spec = StudySpec.from_dict(RAW)
    assert isinstance(spec.task, TaskConfig) and spec.task.name == "quadratic"
    assert spec.task.params == {"clients": 6, "dim": 3} and spec.task.seed == 0
    assert isinstance(spec.train, TrainConfig) and spec.train.rounds == 12
    assert isinstance(spec.train.rounds, int)  # an integral float is an integer
    assert isinstance(spec.decay, DecayConfig) and not spec.decay.enabled
    assert StudySpec.from_dict({**RAW, "task": "quadratic"}).task == TaskConfig("quadratic")


def test_the_written_keys_survive_storage_and_defaults_stay_unwritten():
    spec = StudySpec.from_dict(RAW)
    document = spec.to_dict()
    assert document["task"] == {"name": "quadratic", "clients": 6, "dim": 3}  # no seed: 0
    assert document["train"] == {"rounds": 12, "clients_per_round": 3, "local_steps": None}
    assert document["decay"] == {} and document["hparams"] == {"client_lr": 0.01}
    again = StudySpec.from_dict(document)
    assert again.to_dict() == document
    assert again.given("train") == ("rounds", "clients_per_round", "local_steps")
    assert again.given("task") == ("name", "clients", "dim") and again.given("decay") == ()
    assert (again.task, again.train, again.decay) == (spec.task, spec.train, spec.decay)
    assert spec.base_config is not None and again == spec  # the cache does not count
    same_values = {"rounds": 12, "clients_per_round": 3}  # local_steps unwritten
    assert StudySpec.from_dict({**RAW, "train": same_values}) != spec  # written keys count


def test_the_written_order_is_kept():
    task = {"clients": 6, "seed": 2, "name": "quadratic", "dim": 3}
    spec = StudySpec.from_dict({**RAW, "task": task})
    assert list(spec.to_dict()["task"]) == list(task) and spec.task.seed == 2


def test_a_searched_default_is_not_made_a_written_value_by_storage():
    """``task.seed`` is unwritten and searched: the stored spec still validates (a written
    default would now be "also searched")."""
    raw = {
        **RAW,
        "search": {
            "override": {
                "client_lr": None,
                "task.seed": {"type": "categorical", "choices": [0, 1]},
            },
        },
    }
    spec = StudySpec.from_dict(raw)
    StudySpec.from_dict(spec.to_dict())
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict({**raw, "task": {**RAW["task"], "seed": 0}})
    assert err.value.field == "task.seed" and "also searched" in err.value.reason


def test_the_base_trial_configuration_is_derived_and_built_once():
    spec = StudySpec.from_dict(RAW)
    base = spec.base_config
    assert isinstance(base, TrialConfig) and spec.base_config is base
    assert base == parse_trial_config(spec.base_trial_config())
    assert base.train is spec.train and base.task is spec.task
    assert dict(base.hparams) == {"client_lr": 0.01}
    assert spec.base_trial_config()["train"] == RAW["train"] | {"rounds": 12}


def test_a_copy_does_not_keep_the_cached_base():
    spec = StudySpec.from_dict(RAW)
    assert spec.base_config.seed == 0
    copied = spec.model_copy(update={"seed": 5})
    assert copied.base_config.seed == 5 and copied.given("train") == spec.given("train")


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        ({"train": {"rounds": "ten"}}, "train.rounds", "must be an integer"),
        ({"train": {"rounds": 0}}, "train.rounds", "must be >= 1"),
        ({"train": {"roundz": 3}}, "train.roundz", "unknown key"),
        ({"train": [3]}, "train", "must be a mapping"),
        ({"train": None}, "train", "must be a mapping"),
        ({"decay": {"window": 0}}, "decay.window", "must be >= 1"),
        ({"decay": {"enabled": "yes"}}, "decay.enabled", "true or false"),
        ({"task": 3}, "task", "must be a mapping"),
        ({"task": {"clients": 6}}, "task.name", "is required"),
        ({"task": {"name": "quadratic", "seed": True}}, "task.seed", "must be an integer"),
        ({"budget": {"trials": 2.5}}, "budget.trials", "must be an integer"),
        ({"budget": {"trials": True}}, "budget.trials", "must be an integer"),
        ({"seeds": [1, "2"]}, "seeds[1]", "integer"),
        (
            {"search": {"parameters": {"client_lr": {"type": "float", "low": "x", "high": 1}}}},
            "search.parameters.client_lr.low",
            "must be a number",
        ),
    ],
)
def test_errors_name_the_dotted_path(change, field, reason):
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict({**RAW, "search": {}, **change})
    assert err.value.field == field and reason in err.value.reason, err.value


def test_an_integral_float_count_is_an_integer():
    spec = StudySpec.from_dict({**RAW, "budget": {"trials": 4.0}})
    assert spec.budget.trials == 4 and isinstance(spec.budget.trials, int)


def test_parse_checks_the_shape_only():
    """``parse`` imports and reads nothing; ``check`` validates in depth."""
    spec = StudySpec.parse({**RAW, "algorithm": "not_an_algorithm"}, source="s.yaml")
    assert spec.algorithm == "not_an_algorithm"
    with pytest.raises(ConfigError) as err:
        spec.check()
    assert err.value.field == "algorithm" and err.value.source == "s.yaml"
    with pytest.raises(ConfigError) as err:
        StudySpec.parse({**RAW, "train": {"rounds": -1}}, source="s.yaml")
    assert err.value.field == "train.rounds" and err.value.source == "s.yaml"


def test_the_engine_imports_neither_tuning_nor_service():
    import ast
    from pathlib import Path

    import fedtune.trainers

    root = Path(fedtune.trainers.__file__).parent
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert not name.startswith(("fedtune.tuning", "fedtune.service")), (path, name)


#: the sections of a spec or trial configuration document
SECTIONS = frozenset(
    {"task", "algorithm", "train", "hparams", "decay", "search", "budget", "resources"}
    | {"objective", "strategy"}
)
#: at most this many raw reads of a section remain in fedtune/ (issue 41: "at most 10")
MOST_RAW_READS = 10


def _raw_section_reads() -> list[str]:
    """Every ``x["train"]``, ``x.get("budget")``, ``x.setdefault("train", …)`` or
    ``x.pop("hparams")`` that reads a section of a plain mapping in ``fedtune/`` (writes such
    as ``x["train"] = …`` are not reads)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "fedtune"
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                key = node.slice
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "setdefault", "pop")
                and node.args
            ):
                key = node.args[0]
            else:
                continue
            if isinstance(key, ast.Constant) and key.value in SECTIONS:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_code_reads_typed_sections_not_raw_mappings():
    """Parsed once, read typed: the few raw reads left are the parsers of documents that are
    not yet a spec (a study of methods' list) and mappings that only share a section's name
    (a checkpoint's decay state, a recipe's hparams declarations)."""
    found = _raw_section_reads()
    assert len(found) <= MOST_RAW_READS, "\n".join(found)
    assert not [f for f in found if f.startswith("fedtune/service/")], found
