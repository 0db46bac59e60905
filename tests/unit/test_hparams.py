"""Each part owns its hyperparameters: one declaration (type, bounds, default
search entry) drives trial validation (pydantic; errors name ``hparams.<name>``), the default
search space, the study spec's bounds check, Optuna and ``fedtune spaces`` — for built-in and
user parts alike; a user hyperparameter without bounds is an error naming it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import optuna
import pytest
import yaml

from fedtune.cli import main
from fedtune.errors import CodeError, ConfigError
from fedtune.extend import load_code
from fedtune.search_spaces import (
    declaration_problem,
    declared_space,
    default_space,
    shipped_spaces,
    suggest,
)
from fedtune.trainers import algorithms, get_recipe, parse_trial_config, run_trial
from fedtune.tuning.spec import StudySpec
from tests.conftest import quadratic_config

USER_CODE = Path(__file__).resolve().parent / "user_code"
CODE = {"path": str(USER_CODE), "modules": ["ft_user_lab.methods"]}


def user_trial(**hparams) -> dict:
    return {
        "code": CODE,
        "task": {"name": "ft_user_blobs", "clients": 5, "seed": 3},
        "algorithm": "ft_user_damped",
        "train": {"rounds": 2, "clients_per_round": 3, "local_steps": 2, "eval_every": 1},
        "hparams": hparams,
    }


def user_study(**search) -> dict:
    trial = user_trial()
    return {
        "name": "damped",
        **{k: v for k, v in trial.items() if k != "hparams"},
        "objective": {"last_rounds": 2},
        "scheduler": {"name": "none"},
        "budget": {"trials": 2},
        "search": search,
    }


# -- shipped spaces vs declarations ------------------------------------------------------


SHIPPED = [
    (space_name, algorithm)
    for space_name, space in shipped_spaces().items()
    for algorithm in space.algorithms
]


@pytest.mark.parametrize(("space_name", "algorithm"), SHIPPED)
def test_shipped_space_lies_inside_the_declared_bounds(space_name, algorithm):
    """Every hyperparameter a shipped space searches is one the algorithm accepts, declared by
    one of its parts, with range, grid, default and choices inside the declaration."""
    recipe = get_recipe(algorithm)
    space = shipped_spaces()[space_name]
    for p in space.parameters:
        section, key = p.path.split(".", 1)
        if section != "hparams":
            continue
        assert key in recipe.params, f"{space_name}: {algorithm} does not accept {key}"
        assert declaration_problem(p, recipe.declared[key]) == "", (space_name, key)


@pytest.mark.parametrize("name", sorted(algorithms()))
def test_every_builtin_declared_space_parses_inside_its_bounds(name):
    recipe = get_recipe(name)
    space = declared_space(recipe)
    assert space is not None and space.algorithms == (name,)
    for p in space.parameters:
        key = p.path.split(".", 1)[1]
        assert key in recipe.params
        assert declaration_problem(p, recipe.declared[key]) == ""
        if key in recipe.defaults and p.default is not None:
            assert p.default == recipe.defaults[key]


def test_a_range_beyond_the_declaration_names_the_override():
    spec = {
        "name": "fedavgm-wide",
        "task": {"name": "quadratic"},
        "algorithm": "fedavgm",
        "train": {"rounds": 10},
        "search": {"override": {"server_momentum": {"grid": None, "high": 1.0}}},
    }
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec)
    assert err.value.field == "search.override.server_momentum"
    assert "declaration of hparams.server_momentum" in err.value.reason
    assert "in [0, 1)" in err.value.reason


# -- one declaration drives validation, space, study and Optuna (user part) ----------------


def test_user_declaration_validates_trial_configurations():
    load_code(CODE)
    parsed = parse_trial_config(user_trial(ft_damping="0.25"))  # YAML 1.1 reads 2.5e-1 as text
    assert parsed.hparams == {"ft_damping": 0.25}
    result = run_trial(user_trial(ft_damping=0.25))
    assert result.outcome == "completed"
    assert {r.extra.get("ft_damping") for r in result.records} == {0.25}
    for value, reason in ((0.0, "must be in (0, 1], got 0.0"), (True, "must be a number")):
        with pytest.raises(ConfigError) as err:
            parse_trial_config(user_trial(ft_damping=value))
        assert err.value.field == "hparams.ft_damping"
        assert reason in err.value.reason
    with pytest.raises(ConfigError) as err:
        parse_trial_config({**user_trial(), "algorithm": "fedavg", "hparams": {"ft_damping": 1}})
    assert err.value.field == "hparams.ft_damping" and "not a parameter" in err.value.reason


def test_user_declaration_is_the_default_search_space_for_study_and_optuna():
    load_code(CODE)
    assert default_space("ft_user_damped") == declared_space(get_recipe("ft_user_damped"))
    spec = StudySpec.from_dict(user_study())
    space = spec.search_space()
    rho = space.find("ft_damping")
    assert (rho.low, rho.high, rho.log, rho.default) == (0.05, 1.0, True, 0.5)
    assert {p.name for p in space.enabled} == {"client_lr", "server_lr", "ft_damping"}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        sampled = suggest(study.ask(), space)
        assert 0.05 <= sampled["hparams.ft_damping"] <= 1.0
        spec.trial(sampled)
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(user_study(override={"ft_damping": {"low": 0.0, "log": False}}))
    assert err.value.field == "search.override.ft_damping"
    assert "must be in (0, 1]" in err.value.reason


def test_fedtune_spaces_lists_and_prints_the_user_declaration(capsys):
    opts = ["--code", str(USER_CODE), "--module", "ft_user_lab.methods"]
    assert main(["spaces", *opts]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert f"code {USER_CODE}" in lines["ft_user_damped"]
    assert " builtin " in lines["fedavgm"]
    assert main(["spaces", "ft_user_damped", *opts]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["parameters"]["ft_damping"]["low"] == 0.05
    assert main(["spaces", "ft_user_damped", "--hparams", *opts]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ft_damping"))
    assert "in (0, 1]" in row and "[0.05, 1.0] log" in row and "study" in row


# -- bad declarations in user code ---------------------------------------------------------


def _write(root: Path, name: str, body: str) -> str:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(textwrap.dedent(body))
    return f"{name}.mod"


@pytest.mark.parametrize(
    ("body", "names", "line"),
    [
        (
            """
            from fedtune.extend import HParam, register_algorithm

            register_algorithm(
                "ft_nobounds_alg",
                hparams=(HParam("ft_nobounds", float, 0.1),),
            )
            """,
            ("ft_nobounds", "without bounds"),
            6,
        ),
        (
            """
            from fedtune.extend import register_algorithm

            register_algorithm("ft_undeclared_alg", params=("client_lr", "ft_undeclared"))
            """,
            ("ft_undeclared", "no part declares it"),
            4,
        ),
        (
            """
            import math
            from fedtune.extend import HParam, Space, register_algorithm

            wide = HParam("ft_wide", float, 0.5, bounds=(0.0, 1.0), space=Space(0.1, 2.0))
            register_algorithm("ft_wide_alg", hparams=(wide,))
            """,
            ("ft_wide", "2.0"),
            5,
        ),
    ],
    ids=["no-bounds", "undeclared", "space-beyond-bounds"],
)
def test_bad_user_declaration_names_the_hyperparameter_and_line(tmp_path, body, names, line):
    module = _write(tmp_path, f"bad_{tmp_path.name.replace('-', '_')}", body)
    with pytest.raises(CodeError) as err:
        load_code({"path": str(tmp_path), "modules": [module]})
    assert err.value.field == "code.modules[0]"
    for text in names:
        assert text in err.value.reason
    assert err.value.location == f"{tmp_path / module.replace('.', '/')}.py:{line}"


def test_study_with_a_hyperparameter_without_bounds_fails_before_any_trial(tmp_path):
    module = _write(
        tmp_path,
        "ft_study_nobounds",
        """
        from fedtune.extend import HParam, register_algorithm

        register_algorithm("ft_study_nobounds", hparams=(HParam("ft_rho", float, 0.1),))
        """,
    )
    study = {
        "name": "nobounds",
        "task": {"name": "quadratic"},
        "algorithm": "ft_study_nobounds",
        "code": {"path": str(tmp_path), "modules": [module]},
    }
    with pytest.raises(CodeError) as err:
        StudySpec.from_dict(study)
    assert err.value.field == "code.modules[0]" and "ft_rho" in err.value.reason


# -- the built-ins' validation: one system, dotted fields ----------------------------------


@pytest.mark.parametrize(
    ("algorithm", "hparams", "field", "reason"),
    [
        ("fedavg", {"client_lr": -0.1}, "hparams.client_lr", "must be >= 0, got -0.1"),
        ("fedavg", {"server_lr": 0}, "hparams.server_lr", "must be > 0, got 0"),
        ("fedavgm", {"server_momentum": 1.0}, "hparams.server_momentum", "in [0, 1)"),
        ("fedavg", {"server_bias_correction": "yes"}, "hparams.server_bias_correction", "true"),
        ("local_update", {"theta": [1.0, -1.0]}, "hparams.theta[1]", "must be >= 0"),
        ("local_update", {"theta": [0.0]}, "hparams.theta", "positive weight"),
        ("scaffold", {"scaffold_option": 1.5}, "hparams.scaffold_option", "one of 1 or 2"),
        ("mixed_pt", {"central_steps": "3"}, "hparams.central_steps", "an integer"),
        ("fedga", {"ga_beta": float("inf")}, "hparams.ga_beta", "finite"),
    ],
)
def test_invalid_values_name_the_dotted_field(algorithm, hparams, field, reason):
    with pytest.raises(ConfigError) as err:
        parse_trial_config(quadratic_config(algorithm, hparams=hparams))
    assert err.value.field == field
    assert reason in err.value.reason


def test_recipe_values_are_typed_and_validated_once():
    parsed = parse_trial_config(
        quadratic_config("fedavgm", hparams={"server_momentum": 0, "client_lr": "1e-2"})
    )
    assert parsed.hparams == {"server_momentum": 0.0, "client_lr": 0.01}
    assert type(parsed.hparams["server_momentum"]) is float
    assert parsed.to_dict()["hparams"] == {"client_lr": 0.01, "server_momentum": 0.0}
    theta = parse_trial_config(quadratic_config("local_update", hparams={"theta": [1, 0, 2]}))
    assert theta.to_dict()["hparams"]["theta"] == [1.0, 0.0, 2.0]


@pytest.mark.parametrize(
    ("section", "value", "field", "reason"),
    [
        ("train", {"local_steps": "5"}, "train.local_steps", "must be an integer, got '5'"),
        ("train", {"local_steps": True}, "train.local_steps", "must be an integer"),
        ("train", {"divergence_factor": "1e3", "rounds": 2.5}, "train.rounds", "an integer"),
        ("train", {"weighting": "sizes"}, "train.weighting", "'uniform' or 'examples'"),
        ("decay", {"enabled": 1}, "decay.enabled", "must be true or false, got 1"),
        ("train", {"speed": 3}, "train.speed", "unknown key (known: batch_sampling"),
        ("task", {"dirichlet": "high"}, "task.dirichlet", "must be a number, got 'high'"),
    ],
)
def test_sections_share_the_one_validation_system(section, value, field, reason):
    """train/decay/task fields go through the same pydantic rules as hyperparameters."""
    cfg = quadratic_config("fedavg")
    cfg[section] = {**cfg.get(section, {}), **value}
    with pytest.raises(ConfigError) as err:
        if section == "task":
            run_trial({**cfg, "task": {"name": "digits", **value}})
        else:
            parse_trial_config(cfg)
    assert err.value.field == field
    assert reason in err.value.reason
