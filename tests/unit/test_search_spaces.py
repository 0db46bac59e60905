"""Declarative search spaces: shipped files, validation errors, conditions, ties, Optuna, grids."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import optuna
import pytest
import yaml

from fedtune.cli import main
from fedtune.errors import ConfigError
from fedtune.search_spaces import (
    SHIPPED_DIR,
    ParamDecl,
    ParamType,
    default_point,
    enqueue,
    grid_points,
    grid_search_space,
    load_space,
    merge,
    parse_condition,
    parse_space,
    resolve_path,
    resolve_values,
    shipped_spaces,
    space_for_algorithm,
    suggest,
    to_optuna_distributions,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

EXPECTED = {
    "fedavg",
    "fedsgd",
    "fedprox",
    "fedavgm",
    "fedadam",
    "maml",
    "scaffold",
    "fedga",
    "mixed",
    "mass",
    "decay",
    "fedavg_vanilla",
    "lookahead",
    "gradalign",
    "mixed_gt1",
    "fedavg_nesterov",
    "fednova",
}
HALF_DECADE = [10 ** (k / 2) for k in range(-6, 3)]  # {1e-3, 1e-2.5, ..., 1e1}

# a space with a condition chain and ties, used with real Optuna studies
CONDITIONAL = {
    "parameters": {
        "client_lr": {"type": "float", "low": 1e-3, "high": 1.0, "log": True, "grid": "decade"},
        "server_opt": {"type": "categorical", "choices": ["sgd", "momentum", "nesterov"]},
        "server_momentum": {
            "type": "float",
            "low": 0.0,
            "high": 0.99,
            "grid": [0.5, 0.9],
            "when": "server_opt in ['momentum', 'nesterov']",
        },
        "nesterov_form": {
            "type": "categorical",
            "choices": ["keras", "theory"],
            "when": 'server_opt == "nesterov"',
        },
        "window": {"type": "int", "low": 5, "high": 50, "log": True, "grid": [10, 20]},
        "patience": {"tie": "window"},
        "cooldown": {"tie": "decay.patience"},
    }
}


def write(tmp_path: Path, text: str, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------- shipped spaces


def test_every_shipped_file_loads_and_round_trips():
    spaces = shipped_spaces()
    assert set(spaces) == EXPECTED
    assert {p.stem for p in SHIPPED_DIR.glob("*.yaml")} == EXPECTED
    for name, space in spaces.items():
        assert space.name == name and space.description, name
        again = parse_space(space.to_dict())
        assert again.fingerprint() == space.fingerprint(), name
        assert again.paths == space.paths
        for p in space.enabled:  # every shipped space supports grid search
            assert p.tied or p.grid_values(), (name, p.name)
        assert grid_points(space)


def test_shipped_defaults_cover_the_papers_grids():
    fedavg = load_space("fedavg")
    for name in ("client_lr", "server_lr"):
        p = fedavg.find(name)
        assert (p.low, p.high, p.log) == (1e-3, 10.0, True)
        assert p.grid_values() == pytest.approx(HALF_DECADE, rel=1e-12)
    beta = load_space("fedavgm").find("server_momentum")
    assert (beta.low, beta.high) == (0.0, 0.99)
    k = fedavg.find("local_steps")
    assert k.type == ParamType.INT and k.path == "train.local_steps" and not k.enabled
    decay = load_space("decay")
    assert decay.find("patience").tie == decay.find("cooldown").tie == "decay.window"
    point = default_point(decay)
    assert point["decay.window"] == point["decay.patience"] == point["decay.cooldown"] == 100


def test_extends_inherits_and_overrides():
    fedprox = load_space("fedprox")
    assert fedprox.paths[:2] == ("hparams.client_lr", "hparams.server_lr")
    assert "prox_alpha" in fedprox and fedprox.algorithms == ("fedprox",)
    assert load_space("fedadam").find("server_lr").default == 0.01
    assert load_space("fedavg").find("server_lr").default == 0.1


def test_space_for_algorithm():
    assert space_for_algorithm("fedavgm").name == "fedavgm"
    assert space_for_algorithm("reptile").name == "fedavg"
    assert space_for_algorithm("fedyogi").name == "fedadam"
    assert space_for_algorithm("no_such_algorithm") is None


def test_path_resolution():
    assert resolve_path("client_lr") == "hparams.client_lr"
    assert resolve_path("ga_beta") == "hparams.ga_beta"  # unknown names are hyperparameters
    assert resolve_path("local_steps") == "train.local_steps"
    assert resolve_path("clients_per_round") == "train.clients_per_round"
    assert resolve_path("window") == "decay.window"
    assert resolve_path("hparams.client_lr") == "hparams.client_lr"
    assert resolve_path("task.dirichlet") == "task.dirichlet"
    for bad in ("foo.bar", "train.nope", "decay.x", "a.b.c", "1x", "client-lr"):
        assert resolve_path(bad) is None, bad


# ---------------------------------------------------------------- validation errors


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ("{type: float, low: 2.0, high: 1.0}", "parameters.lr.low", "low (2.0) > high"),
        ("{type: float, low: 0.0, high: 1.0, log: true}", "parameters.lr.log", "low > 0"),
        ("{type: gaussian, low: 0, high: 1}", "parameters.lr.type", "must be one of"),
        (
            "{type: float, low: 0, high: 1, when: 'opt == 1'}",
            "parameters.lr.when",
            "unknown parameter 'opt'",
        ),
        (
            "{type: float, low: 0, high: 1, when: 'k = 1'}",
            "parameters.lr.when",
            "invalid condition",
        ),
        ("{type: float, low: 0, high: 1, step: 0.3}", "parameters.lr.step", "must divide"),
        ("{type: float, low: 1.0e-3, high: 1, log: true, step: 0.1}", "parameters.lr.step", "log"),
        ("{type: float, low: 0, high: 1, default: 3}", "parameters.lr.default", "outside"),
        ("{type: float, low: 0.1, high: 1, grid: [0.5, 2]}", "parameters.lr.grid", "outside"),
        ("{type: float, low: 0, high: 1, grid: weekly}", "parameters.lr.grid", "unknown grid"),
        ("{type: int, low: 1, high: 9.5}", "parameters.lr.high", "integer"),
        ("{type: float, low: 0, hi: 1}", "parameters.lr.hi", "unknown key"),
        ("{type: float, high: 1}", "parameters.lr.low", "is required"),
        ("{type: categorical, choices: []}", "parameters.lr.choices", "non-empty"),
        ("{type: categorical, choices: [a, a]}", "parameters.lr.choices", "repeat"),
        ("{type: categorical, choices: [a], low: 0}", "parameters.lr.low", "categorical"),
        ("{tie: nothing}", "parameters.lr.tie", "unknown parameter 'nothing'"),
        ("{tie: k, low: 0}", "parameters.lr.low", "tied"),
        (
            "{type: float, low: 0, high: 1, enabled: maybe}",
            "parameters.lr.enabled",
            "true or false",
        ),
    ],
)
def test_errors_name_file_parameter_and_reason(tmp_path, entry, field, words):
    path = write(tmp_path, f"parameters:\n  k: {{type: int, low: 1, high: 4}}\n  lr: {entry}\n")
    with pytest.raises(ConfigError) as err:
        load_space(path)
    assert err.value.field == field
    assert words in err.value.reason
    assert err.value.source == str(path.resolve())
    assert str(path.name) in str(err.value) and "lr" in str(err.value)


def test_tie_and_condition_cycles_are_rejected(tmp_path):
    path = write(tmp_path, "parameters:\n  a: {tie: b}\n  b: {tie: a}\n")
    with pytest.raises(ConfigError, match="cycle") as err:
        load_space(path)
    assert err.value.field == "parameters.a.tie"
    path = write(
        tmp_path,
        """\
        parameters:
          a: {type: categorical, choices: [x, y], when: "b == 1"}
          b: {type: int, low: 1, high: 3, when: "a == 'x'"}
        """,
        "cond.yaml",
    )
    with pytest.raises(ConfigError, match="cycle") as err:
        load_space(path)
    assert err.value.field == "parameters.a.when" and err.value.source.endswith("cond.yaml")


def test_bad_names_and_top_level_keys(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_space(write(tmp_path, "parameters:\n  train.nope: {type: int, low: 1, high: 2}\n"))
    assert err.value.field == "parameters.train.nope"
    with pytest.raises(ConfigError) as err:
        load_space(write(tmp_path, "paramters: {}\n", "typo.yaml"))
    assert err.value.field == "paramters"
    with pytest.raises(ConfigError) as err:
        load_space(write(tmp_path, "parameters: [1, 2]\n", "list.yaml"))
    assert err.value.field == "parameters"
    with pytest.raises(ConfigError) as err:
        load_space("no_such_space")
    assert err.value.field == "space" and "fedavgm" in err.value.reason


def test_extends_cycle_and_relative_file(tmp_path):
    write(tmp_path, "extends: b.yaml\nparameters: {x: {type: int, low: 1, high: 2}}\n", "a.yaml")
    write(tmp_path, "extends: a.yaml\nparameters: {y: {type: int, low: 1, high: 2}}\n", "b.yaml")
    with pytest.raises(ConfigError, match="cycle"):
        load_space(tmp_path / "a.yaml")
    write(tmp_path, "extends: fedavg\nparameters: {client_lr: {high: 1.0}}\n", "mine.yaml")
    space = load_space(tmp_path / "mine.yaml")
    assert space.find("client_lr").high == 1.0 and "server_lr" in space


# ---------------------------------------------------------------- merge / overrides


def test_merge_updates_adds_and_removes():
    base = load_space("fedavgm")
    out = merge(
        base,
        {
            "client_lr": {"high": 1.0},
            "local_steps": None,
            "prox_alpha": {"type": "float", "low": 0.0, "high": 1.0},
        },
    )
    lr = out.find("client_lr")
    assert (lr.low, lr.high, lr.log) == (1e-3, 1.0, True)
    assert lr.grid_values() == pytest.approx(HALF_DECADE[:7])  # half-decade grid re-expanded
    assert "local_steps" not in out and out.find("prox_alpha").path == "hparams.prox_alpha"
    assert out.fingerprint() != base.fingerprint()
    assert merge(base, {}).fingerprint() == base.fingerprint()
    # a dotted key overrides the same parameter as its short name
    assert merge(base, {"hparams.server_lr": {"default": 1.0}}).find("server_lr").default == 1.0
    # changing the type replaces the entry instead of mixing fields
    k = merge(base, {"server_momentum": {"type": "categorical", "choices": [0.0, 0.9]}})
    assert k.find("server_momentum").choices == (0.0, 0.9)


def test_merge_errors_name_the_override_path():
    base = load_space("fedavgm")
    with pytest.raises(ConfigError) as err:
        merge(base, {"client_lr": {"low": 10.0, "high": 1.0}}, field="search.override")
    assert err.value.field == "search.override.client_lr.low"
    with pytest.raises(ConfigError) as err:
        merge(base, {"ga_beta": None}, field="search.override")
    assert err.value.field == "search.override.ga_beta" and "nothing to remove" in err.value.reason
    with pytest.raises(ConfigError) as err:  # the narrowed range no longer holds the grid
        merge(base, {"server_momentum": {"high": 0.9}}, field="search.override")
    assert err.value.field == "search.override.server_momentum.grid"
    # removing a parameter that a shipped condition refers to names the referring entry
    with pytest.raises(ConfigError, match="unknown parameter") as err:
        merge(base, {"server_opt": None})
    assert err.value.field == "parameters.nesterov_form.when"
    assert err.value.source.endswith("fedavgm.yaml")


def test_a_spec_holds_declarations_that_keep_only_what_is_written():
    from fedtune.tuning.spec import StudySpec

    doc = {
        "name": "decl",
        "task": "quadratic",
        "algorithm": "fedavgm",
        "search": {
            "override": {"client_lr": {"high": "1e-1"}, "local_steps": None},
            "space": "fedavgm",
        },
    }
    spec = StudySpec.from_dict(doc)
    decl = spec.search.override["client_lr"]
    assert isinstance(decl, ParamDecl) and decl.given() == ("high",) and decl.high == 0.1
    # the stored spec writes the keys given, and reads back as the same spec
    assert spec.to_dict()["search"]["override"] == {"client_lr": {"high": 0.1}, "local_steps": None}
    again = StudySpec.from_dict(spec.to_dict())
    assert again.search_space().fingerprint() == spec.search_space().fingerprint()
    lr = again.search_space().find("client_lr")
    assert (lr.low, lr.high, lr.log) == (1e-3, 0.1, True)  # the rest from the shipped entry


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        ({"low": True}, "search.override.client_lr.low", "must be a finite number, got True"),
        ({"high": "ten"}, "search.override.client_lr.high", "must be a number, got 'ten'"),
        ({"log": "yes"}, "search.override.client_lr.log", "must be true or false"),
        ({"type": "normal"}, "search.override.client_lr.type", "must be one of float, int"),
        ({"choices": [[1]]}, "search.override.client_lr.choices[0]", "must be null, a boolean"),
        ({"grid": []}, "search.override.client_lr.grid", "must be a non-empty list"),
        ({"hgih": 1.0}, "search.override.client_lr.hgih", "unknown key"),
        (3, "search.override.client_lr", "must be a mapping"),
    ],
)
def test_a_declarations_values_are_checked_where_written(entry, field, words):
    from fedtune.tuning.spec import StudySpec

    doc = {"name": "decl", "task": "quadratic", "algorithm": "fedavgm"}
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(doc | {"search": {"override": {"client_lr": entry}}})
    assert err.value.field == field and words in err.value.reason, err.value
    with pytest.raises(ConfigError) as err:  # a space file's entry, with its file
        merge(load_space("fedavgm"), {"client_lr": entry}, field="parameters", source="f.yaml")
    assert err.value.field == field.replace("search.override", "parameters")
    assert words in err.value.reason and err.value.source == "f.yaml"


# ---------------------------------------------------------------- conditions


def test_condition_language():
    v = {"a": "x", "n": 3, "f": True}
    cases = {
        'a == "x"': True,
        "a != 'x'": False,
        "n == 3": True,
        "n in [1, 2, 3]": True,
        "n not in [1, 2]": True,
        "a == 'x' and n == 4": False,
        "a == 'y' or n == 3": True,
        "not (a == 'y')": True,
        "f == true": True,
        "(a == 'x' or n == 1) and f == false": False,
        "missing == 1": False,
        "missing != 1": False,
        "missing not in [1]": False,
    }
    for text, expected in cases.items():
        assert parse_condition(text)(v) is expected, text
    assert parse_condition("a == 1 and b in [2]").names == {"a", "b"}
    for bad in ("a = 1", "a ==", "__import__('os')", "a == 1 b", "a in 1", "", "a == 1 or"):
        with pytest.raises(ValueError):
            parse_condition(bad)


def test_condition_operators_on_inactive_parameters():
    """Module docstring: a comparison on an inactive parameter is false whatever the operator,
    and ``not`` never turns it true (``not x == v`` is ``x != v``)."""
    inactive = {"other": 1}  # "x" is absent: inactive
    false_on_inactive = [
        "x == 1",
        "x != 1",
        "x in [1, 2]",
        "x not in [1, 2]",
        "not x == 1",
        "not x != 1",
        "not x in [1, 2]",
        "not x not in [1, 2]",
        "not (x == 1)",
        "not not x == 1",
        "not not x != 1",
        "not (x == 1 or x != 1)",
        "not (x == 1 and other == 1)",
        "not (x in [1] or other == 2)",
        "x == 1 or x != 1",
        "not x == 1 or not x != 1",
    ]
    for text in false_on_inactive:
        assert parse_condition(text)(inactive) is False, text
    # the same texts on an active x: every negated form equals its operator dual
    duals = {
        "not x == 1": "x != 1",
        "not x != 1": "x == 1",
        "not x in [1, 2]": "x not in [1, 2]",
        "not x not in [1, 2]": "x in [1, 2]",
        "not not x == 1": "x == 1",
        "not (x == 1 or other == 1)": "x != 1 and other != 1",
        "not (x == 1 and other == 1)": "x != 1 or other != 1",
    }
    for values in ({"x": 1, "other": 1}, {"x": 3, "other": 1}, {"x": 2, "other": 5}, inactive):
        for negated, dual in duals.items():
            got, want = parse_condition(negated)(values), parse_condition(dual)(values)
            assert got is want, (negated, dual, values)
    # an active other parameter still decides an ``or`` whose other side is inactive
    assert parse_condition("not (x == 1) or other == 1")(inactive) is True
    assert parse_condition("not (x == 1 and other == 2)")(inactive) is True  # other != 2 holds


# ---------------------------------------------------------------- Optuna


@pytest.mark.parametrize("sampler", [optuna.samplers.RandomSampler, optuna.samplers.TPESampler])
def test_suggest_with_conditions_and_ties(sampler):
    space = parse_space(CONDITIONAL)
    study = optuna.create_study(sampler=sampler(seed=3))
    seen_opts = set()
    for _ in range(30):
        trial = study.ask()
        values = suggest(trial, space)
        opt = values["hparams.server_opt"]
        seen_opts.add(opt)
        assert ("hparams.server_momentum" in values) == (opt in ("momentum", "nesterov"))
        assert ("hparams.nesterov_form" in values) == (opt == "nesterov")
        assert values["decay.patience"] == values["decay.cooldown"] == values["decay.window"]
        assert 1e-3 <= values["hparams.client_lr"] <= 1.0
        assert isinstance(values["decay.window"], int) and 5 <= values["decay.window"] <= 50
        # Optuna saw exactly the sampled (untied, active) parameters
        assert set(trial.params) == set(values) - {"decay.patience", "decay.cooldown"}
        assert resolve_values(space, trial.params) == values
        study.tell(trial, math.log(values["hparams.client_lr"]) ** 2)
    assert seen_opts == {"sgd", "momentum", "nesterov"}


def test_optuna_distributions_of_the_unconditional_part():
    dists = to_optuna_distributions(parse_space(CONDITIONAL))
    assert set(dists) == {"hparams.client_lr", "hparams.server_opt", "decay.window"}
    assert dists["hparams.client_lr"] == optuna.distributions.FloatDistribution(1e-3, 1.0, log=True)
    assert dists["decay.window"] == optuna.distributions.IntDistribution(5, 50, log=True)
    assert dists["hparams.server_opt"].choices == ("sgd", "momentum", "nesterov")
    assert set(to_optuna_distributions(load_space("fedavgm"))) == {
        "hparams.client_lr",
        "hparams.server_lr",
        "hparams.server_momentum",
    }


def test_resolve_values_fills_ties_and_drops_inactive():
    space = parse_space(CONDITIONAL)
    got = resolve_values(space, {"server_opt": "sgd", "server_momentum": 0.9, "window": 7})
    assert "hparams.server_momentum" not in got
    assert got["decay.cooldown"] == 7 and got["hparams.client_lr"] == pytest.approx(math.sqrt(1e-3))
    with pytest.raises(ConfigError):
        resolve_values(space, {}, fill_defaults=False)


# ---------------------------------------------------------------- grids


def test_grid_points_conditional_and_tied():
    points = grid_points(parse_space(CONDITIONAL))
    # client_lr 4 decades × (sgd: 1 + momentum: 2 + nesterov: 2 momenta × 2 forms) × window 2
    assert len(points) == 4 * (1 + 2 + 4) * 2
    assert len({tuple(sorted(p.items())) for p in points}) == len(points)
    assert all(p["decay.cooldown"] == p["decay.window"] for p in points)
    assert all(
        ("hparams.nesterov_form" in p) == (p["hparams.server_opt"] == "nesterov") for p in points
    )
    assert len(grid_points(load_space("fedavgm"))) == 9 * 9 * 4


def test_grid_needs_a_grid():
    space = parse_space({"parameters": {"lr": {"type": "float", "low": 0.0, "high": 1.0}}})
    with pytest.raises(ConfigError) as err:
        grid_points(space)
    assert err.value.field == "parameters.lr.grid"
    stepped = parse_space({"parameters": {"k": {"type": "int", "low": 2, "high": 10, "step": 4}}})
    assert grid_points(stepped) == [{"hparams.k": 2}, {"hparams.k": 6}, {"hparams.k": 10}]


def test_optuna_grid_sampler_visits_the_grid():
    space = load_space("fedavgm")
    space = merge(space, {"client_lr": {"grid": [0.01, 0.1]}, "server_lr": {"grid": [1.0]}})
    study = optuna.create_study(sampler=optuna.samplers.GridSampler(grid_search_space(space)))
    study.optimize(lambda t: suggest(t, space)["hparams.client_lr"], n_trials=20)
    visited = {
        (t.params["hparams.client_lr"], t.params["hparams.server_momentum"]) for t in study.trials
    }
    assert visited == {(lr, b) for lr in (0.01, 0.1) for b in (0.0, 0.5, 0.9, 0.99)}


def test_enqueued_grid_points_are_replayed_exactly():
    space = parse_space(CONDITIONAL)
    points = grid_points(space)[:8]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for point in points:
        enqueue(study, space, point)  # ties are not sent; suggest recomputes them
    replayed = []
    for _ in points:
        trial = study.ask()
        replayed.append(suggest(trial, space))
        study.tell(trial, 0.0)
    assert replayed == points


# ---------------------------------------------------------------- CLI


def test_cli_lists_and_prints(capsys):
    assert main(["spaces"]) == 0
    out = capsys.readouterr().out.splitlines()  # (user algorithms' declared spaces follow)
    assert sorted(ln.split()[0] for ln in out if ln.split()[1] == "builtin") == sorted(EXPECTED)
    assert main(["spaces", "fedavgm"]) == 0
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed) == yaml.safe_load((SHIPPED_DIR / "fedavgm.yaml").read_text())
    assert main(["spaces", "fedprox", "--resolved"]) == 0
    resolved = capsys.readouterr().out
    assert load_space("fedprox").fingerprint() in resolved
    assert (
        parse_space(yaml.safe_load(resolved)).fingerprint() == load_space("fedprox").fingerprint()
    )
    assert main(["spaces", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
