"""The study spec: the shipped example loads; every invalid field names its exact path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import optuna
import pytest
import yaml

from fedtune.errors import ConfigError
from fedtune.overrides import apply_overrides
from fedtune.search_spaces import suggest
from fedtune.trainers.parsing import parse_trial_config
from fedtune.tuning import Mode, SamplerName, SchedulerName, StudySpec
from fedtune.tuning.spec import DEFAULT_STRATEGY

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"
BASE = yaml.safe_load(QUICKSTART.read_text())


def spec_with(**changes) -> dict:
    """The quickstart spec with dotted-path changes (value None deletes the key)."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def test_a_trial_sets_each_sampled_value_in_its_typed_field_and_checks_it():
    spec = StudySpec.from_dict(spec_with(algorithm="fedavgm"))
    trial = spec.trial(
        {
            "train.local_steps": 3,
            "decay.window": 4,
            "task.dirichlet": 0.7,
            "hparams.client_lr": 0.2,
        },
        seed=9,
    )
    assert (trial.train.local_steps, trial.decay.window, trial.seed) == (3, 4, 9)
    assert trial.task.params["dirichlet"] == 0.7 and trial.hparams["client_lr"] == 0.2
    assert trial.train.rounds == spec.train.rounds and spec.trial({}) is spec.base_config
    for sampled, field in [
        ({"train.local_steps": "3"}, "train.local_steps"),
        ({"train.nope": 1}, "train.nope"),
        ({"hparams.nope": 1}, "hparams.nope"),
        ({"budget.trials": 2}, "budget.trials"),
    ]:
        with pytest.raises(ConfigError) as err:
            spec.trial(sampled)
        assert err.value.field == field


def test_quickstart_loads_and_builds_trial_configs():
    spec = StudySpec.from_file(QUICKSTART)
    assert spec.algorithm in ("fedavgm", "fedavg") and spec.task.name == "digits"
    assert spec.task.params["dirichlet"] == 0.3 and spec.task.params["model"] == "mlp"
    assert spec.budget.trials >= 12
    assert spec.strategy == DEFAULT_STRATEGY and spec.search.strategy is None  # the default
    space = spec.search_space()
    enabled = {p.path: p for p in space.enabled}
    assert set(enabled) == {"hparams.client_lr", "hparams.server_lr", "hparams.server_momentum"}
    assert enabled["hparams.client_lr"].log and enabled["hparams.server_lr"].log
    assert spec.objective.record_field == "client_loss" and spec.objective.directions == [Mode.MIN]
    assert parse_trial_config(spec.base_trial_config()).train.rounds == 30
    trial = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0)).ask()
    sampled = suggest(trial, space)
    parsed = spec.trial(sampled, seed=5)
    assert parsed.seed == 5 and parsed.hparams["client_lr"] == sampled["hparams.client_lr"]
    assert parsed.hparams_set == {"client_lr", "server_lr", "server_momentum"}
    # the typed trial is the base configuration's document with the values set, parsed
    document = apply_overrides(spec.base_trial_config(), {**sampled, "seed": 5})
    assert parsed == parse_trial_config(document)
    assert StudySpec.from_dict(spec.to_dict()).to_dict() == spec.to_dict()  # reloads unchanged


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"algorithm": "fedfoo"}, "algorithm"),
        ({"budget__trials": -1}, "budget.trials"),
        ({"budget__trials": True}, "budget.trials"),
        ({"budget__trails": 3}, "budget.trails"),
        ({"resources__gpu": -1}, "resources.gpu"),
        ({"resources__gpu": 1.5}, "resources.gpu"),
        ({"resources__cpu": 0}, "resources.cpu"),
        ({"name": "x; rm -rf /"}, "name"),
        ({"name": "Quickstart"}, "name"),
        ({"name": "a" * 64}, "name"),
        ({"name": None}, "name"),
        (
            {"search__override__prox_alpha": {"type": "float", "low": 0.0, "high": 1.0}},
            "search.override.prox_alpha",
        ),
        (
            {"search__override__server_momentum": {"high": 1.0, "grid": [0.0, 0.9]}},
            "search.override.server_momentum",
        ),
        (
            {"search__override__server_lr": {"low": 0.0, "log": False, "grid": [0.0, 1.0]}},
            "search.override.server_lr",
        ),
        (
            {"search__override__client_lr": {"low": 1.0, "high": 0.1}},
            "search.override.client_lr.low",
        ),
        ({"search__space": "nope"}, "search.space"),
        (
            {"search__parameters": {"client_lr": {"type": "float", "low": 0.1, "high": 1.0}}},
            "search.parameters",
        ),
        ({"sampler__name": "bayes"}, "sampler.name"),
        (
            {
                "objective": {"metrics": ["final_loss", "rounds_to_target"], "target_loss": 0.5},
                "sampler": {"name": "cmaes"},
            },
            "sampler.name",
        ),
        ({"objective": {"metrics": ["final_loss", "rounds_to_target"]}}, "objective.target_loss"),
        ({"objective__mode": "max"}, "objective.mode"),
        ({"scheduler": {"name": "asha", "grace_rounds": 50}}, "scheduler.grace_rounds"),
        ({"scheduler": {"name": "asha", "reduction_factor": 2.5}}, "scheduler.reduction_factor"),
        ({"report_every": 0}, "report_every"),
        ({"train__rounds": 0}, "train.rounds"),
        ({"train__rounds": 3}, "objective.last_rounds"),
        ({"hparams": {"client_lr": 0.1}}, "hparams.client_lr"),
        ({"hparams": {"prox_alpha": 0.1}}, "hparams.prox_alpha"),
        ({"seeds": [1, 2]}, "seeds"),
        ({"seed": None, "seeds": [1, "two"]}, "seeds[1]"),
        ({"search__space": ["fedavgm", "decay"]}, "search.space"),
        ({"task": {"clients": 10}}, "task.name"),
        ({"unknown_key": 1}, "unknown_key"),
    ],
)
def test_invalid_specs_name_the_exact_path(changes, field):
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec_with(**changes))
    assert err.value.field == field, err.value


def test_reasons_are_specific():
    with pytest.raises(ConfigError, match="no hyperparameter 'prox_alpha'") as err:
        StudySpec.from_dict(
            spec_with(search__override__prox_alpha={"type": "float", "low": 0, "high": 1})
        )
    assert "client_lr" in err.value.reason  # lists what fedavgm accepts
    # the range is checked against server_lr's declaration
    with pytest.raises(ConfigError, match=r"low 0.0 lies outside .*server_lr: must be > 0"):
        StudySpec.from_dict(
            spec_with(search__override__server_lr={"low": 0.0, "log": False, "grid": [0.0, 1.0]})
        )
    with pytest.raises(ConfigError, match=r"decay\.enabled"):
        StudySpec.from_dict(spec_with(search__space=["fedavgm", "decay"]))


def test_valid_variants():
    assert StudySpec.from_dict(spec_with(resources__gpu=0.25)).resources.gpu == 0.25
    assert StudySpec.from_dict(spec_with(resources__gpu=2)).resources.gpu == 2.0
    multi = StudySpec.from_dict(
        spec_with(
            objective={"metrics": ["final_loss", "rounds_to_target"], "target_loss": 0.5},
            sampler={"name": "nsga2", "seed": 1},
        )
    )
    assert multi.objective.is_multi and multi.objective.directions == [Mode.MIN, Mode.MIN]
    accuracy = StudySpec.from_dict(spec_with(objective={"metric": "test_accuracy"}))
    assert accuracy.objective.directions == [Mode.MAX]
    assert accuracy.objective.record_field == "test_accuracy"
    seeds = StudySpec.from_dict(spec_with(seed=None, seeds=[3, 4]))
    assert seeds.trial_seeds() == [3, 4] and seeds.base_trial_config()["seed"] == 3
    decay = StudySpec.from_dict(
        spec_with(search__space=["fedavgm", "decay"], decay={"enabled": True})
    )
    point = {p.path: p.initial() for p in decay.search_space().enabled if not p.tied}
    assert "decay.window" in point and decay.search_space().find("cooldown").tie == "decay.window"
    assert StudySpec.from_dict(spec_with(tracking={})).experiment == BASE["name"]


def test_default_space_is_the_algorithms():
    spec = StudySpec.from_dict(spec_with(algorithm="fedprox", search=None))
    assert spec.search_space().name == "fedprox"
    assert "prox_alpha" in spec.search_space()


def test_grid_sampler_needs_a_grid():
    inline = {"client_lr": {"type": "float", "low": 1e-3, "high": 1.0, "log": True}}
    data = spec_with(search={"parameters": inline}, sampler={"name": "grid"})
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(data)
    assert err.value.field == "search.parameters.client_lr.grid"
    inline["client_lr"]["grid"] = "half-decade"
    assert StudySpec.from_dict(data).sampler.name == SamplerName.GRID
    shipped = spec_with(sampler={"name": "grid"})  # every shipped parameter has a grid
    assert StudySpec.from_dict(shipped).search_space().find("client_lr").grid_values()


def test_files_user_spaces_and_sources(tmp_path):
    space = {"extends": "fedavgm", "parameters": {"server_momentum": {"low": 0.5, "grid": [0.9]}}}
    (tmp_path / "my_space.yaml").write_text(yaml.safe_dump(space))
    data = spec_with(search={"space": "my_space.yaml"})
    path = tmp_path / "study.json"
    path.write_text(json.dumps(data))
    spec = StudySpec.from_file(path)  # the space file is found next to the spec
    assert spec.search_space().find("server_momentum").low == 0.5
    (tmp_path / "my_space.yaml").write_text("parameters: {lr: {type: float, low: 2, high: 1}}\n")
    with pytest.raises(ConfigError) as err:
        StudySpec.from_file(path)
    assert err.value.field == "parameters.lr.low" and err.value.source.endswith("my_space.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(spec_with(budget={"trials": 0})))
    with pytest.raises(ConfigError) as err:
        StudySpec.from_file(bad)
    assert err.value.field == "budget.trials" and err.value.source == str(bad)
    assert str(bad) in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        StudySpec.from_file(tmp_path / "missing.yaml")


def test_narrowing_a_shipped_space_reports_every_conflict_at_once():
    """Defaults and grids outside the narrowed ranges and a value the base
    configuration also fixes, in one error (it used to stop at the first)."""
    from fedtune.tuning.spec import StudySpec

    raw = {
        "name": "narrow",
        "task": {"name": "quadratic", "clients": 6, "dim": 3},
        "algorithm": "fedavg",
        "train": {"rounds": 10},
        "hparams": {"client_lr": 0.01},
        "search": {
            "space": "fedavg",
            "override": {
                "client_lr": {"high": 0.005},
                "server_lr": {"low": 2.0, "grid": [0.5, 3.0]},
            },
        },
    }
    with pytest.raises(ConfigError) as info:
        StudySpec.from_dict(raw)
    err = info.value
    assert err.field == "search.override" and err.reason.startswith("4 conflicts: ")
    assert [e.field for e in err.parts] == [
        "search.override.client_lr.default",
        "search.override.server_lr.default",
        "search.override.server_lr.grid",
        "hparams.client_lr",
    ]
    assert "\n" not in str(err)  # one line for the CLI


NARROWED = {
    "hparams": {"client_lr": 0.01},
    "search": {
        "space": "fedavg",
        "override": {"client_lr": {"high": 0.005}, "server_lr": {"low": 2.0, "grid": [0.5, 3.0]}},
    },
}
NARROWED_FIXED = {
    "search": {
        "space": "fedavg",
        "override": {
            "client_lr": {"high": 0.005, "default": 0.001},
            "server_lr": {"low": 2.0, "default": 3.0, "grid": [2.0, 3.0]},
        },
    },
}


def test_a_narrowed_space_reports_every_conflict_on_one_line_and_its_fix_validates():
    """Narrowing a shipped space reports its conflicts at once, each by its dotted path; one
    edit per conflict validates."""
    printed = (
        "study.yaml: search.override: 4 conflicts: search.override.client_lr.default: 0.1 lies "
        "outside the parameter's range/choices; search.override.server_lr.default: 0.1 lies "
        "outside the parameter's range/choices; search.override.server_lr.grid: value 0.5 lies "
        "outside the parameter's range/choices; hparams.client_lr: is also searched "
        "(search.override.client_lr); set it in one place (remove it here, or from the search "
        "with null)"
    )
    raw = {
        "name": "narrow",
        "task": {"name": "quadratic", "clients": 6, "dim": 3},
        "algorithm": "fedavg",
        "train": {"rounds": 10},
    }
    with pytest.raises(ConfigError) as info:
        StudySpec.from_dict({**raw, **NARROWED}, source="study.yaml")
    assert str(info.value) == printed
    StudySpec.from_dict({**raw, **NARROWED_FIXED})


SHORT = {
    "name": "short",
    "task": {"name": "quadratic", "clients": 6, "dim": 3},
    "algorithm": "fedavg",
    "train": {"rounds": 3},
}


def _asha_rungs(grace: int, factor: float, rounds: int) -> list[int]:
    """The rungs ASHA stops trials at (milestones below ``max_t``), as Ray Tune builds them."""
    rungs, k = [], 0
    while grace * factor**k < rounds:
        rungs.append(int(grace * factor**k))
        k += 1
    return rungs


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"scheduler": {"name": "asha"}},
        {"scheduler": {"name": "median"}},
        {"search": {"strategy": "asha"}},
        {"search": {"strategy": "median"}},
        {"search": {"strategy": "hyperband"}},
        {"search": {"strategy": "tradeoff"}},
        {"scheduler": {"name": "asha", "reduction_factor": 2}},
        {"objective": {"metrics": ["final_loss", "rounds_to_target"], "target_loss": 0.1}},
    ],
)
def test_defaults_fit_a_short_study(extra):
    """A spec that names no round count but ``train.rounds`` is never refused for a default:
    ``objective.last_rounds`` and ``scheduler.grace_rounds`` scale to the study, and ASHA's
    ladder (grace, grace·factor, …) keeps a rung below the last round."""
    spec = StudySpec.from_dict({**SHORT, **extra})
    assert spec.objective.last_rounds <= 3 and spec.scheduler.grace_rounds <= 3
    if spec.scheduler_name == SchedulerName.ASHA:
        assert _asha_rungs(spec.scheduler.grace_rounds, spec.scheduler.reduction_factor, 3)
    again = StudySpec.from_dict(spec.to_dict())  # stored and reloaded: the same values
    assert again.to_dict() == spec.to_dict()


@pytest.mark.parametrize(
    ("rounds", "grace", "last"),
    [(1, 1, 1), (3, 1, 3), (10, 3, 10), (29, 9, 10), (30, 10, 10), (100, 10, 10)],
)
def test_default_round_counts_scale_with_the_rounds(rounds, grace, last):
    raw = {**SHORT, "train": {"rounds": rounds}, "scheduler": {"name": "asha"}}
    spec = StudySpec.from_dict(raw)
    assert (spec.scheduler.grace_rounds, spec.objective.last_rounds) == (grace, last)
    assert StudySpec.from_dict({**SHORT, "train": {}}).scheduler.grace_rounds == 10  # 100 rounds


@pytest.mark.parametrize(
    ("extra", "field", "written"),
    [
        ({"scheduler": {"name": "asha", "grace_rounds": 10}}, "scheduler.grace_rounds", "10"),
        ({"scheduler": {"name": "median", "grace_rounds": 4}}, "scheduler.grace_rounds", "4"),
        ({"objective": {"last_rounds": 10}}, "objective.last_rounds", "10"),
        ({"report_every": 5}, "report_every", "5"),
    ],
)
def test_a_round_count_the_user_wrote_is_refused_by_its_own_name(extra, field, written):
    with pytest.raises(ConfigError) as info:
        StudySpec.from_dict({**SHORT, **extra})
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: {written} exceeds train.rounds = 3")
