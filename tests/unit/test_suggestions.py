"""Unknown keys and names suggest the closest known one (issue 59, requirement 5).

A typo in a searched parameter names the space's parameters (``did you mean client_lr?``) instead
of ``clinet_lr.type: must be one of float, int, categorical; got None``; an unknown key anywhere
in the study spec says the closest key its mapping takes, then lists them all.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedtune.errors import ConfigError
from fedtune.suggest import closest, did_you_mean, unknown_key
from fedtune.tuning.spec import StudySpec

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
FEDAVGM = "client_lr, server_lr, local_steps, local_epochs, server_momentum, server_opt, "


def _refused(change) -> ConfigError:
    spec = copy.deepcopy(QUICKSTART)
    change(spec)
    with pytest.raises(ConfigError) as err:
        StudySpec.from_dict(spec)
    return err.value


def test_the_closest_name_is_suggested_and_a_far_one_is_not() -> None:
    assert closest("clinet_lr", ["client_lr", "server_lr"]) == "client_lr"
    assert closest("zzz", ["client_lr", "server_lr"]) is None
    assert did_you_mean("rouds", ["rounds", "seed"]) == "; did you mean rounds?"
    assert did_you_mean(3, ["rounds"]) == ""  # a key that is no string: no guess, no error
    assert unknown_key("trails", ["trials", "time"]) == (
        "unknown key; did you mean trials? (known: trials, time)"
    )
    assert unknown_key("x", []) == "unknown key"


def test_a_misspelt_searched_parameter_names_the_spaces_parameters() -> None:
    error = _refused(lambda s: s["search"]["override"].update(clinet_lr={"low": 1e-3}))
    assert error.field == "search.override.clinet_lr"
    assert error.reason.startswith(
        "not a parameter of the space 'fedavgm' (did you mean client_lr?); its parameters: "
        + FEDAVGM
    )
    assert "type" not in error.field  # not 'clinet_lr.type: must be one of float, ...'


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        (
            lambda s: s["search"]["override"].update(clinet_lr=None),
            "search.override.clinet_lr",
            "not in space 'fedavgm' (did you mean client_lr?); nothing to remove",
        ),
        (
            lambda s: s["search"]["override"].update(
                clinet_lr={"type": "float", "low": 0.1, "high": 1.0}
            ),
            "search.override.clinet_lr",
            "algorithm 'fedavgm' has no hyperparameter 'clinet_lr'; did you mean client_lr?",
        ),
        (
            lambda s: s["search"]["override"].update({"train.rouds": {"low": 1, "high": 3}}),
            "search.override.train.rouds",
            "; did you mean train.rounds?",
        ),
        (
            lambda s: s["search"]["override"]["client_lr"].update(hihg=1.0),
            "search.override.client_lr.hihg",
            "unknown key; did you mean high? (known: type, low, high, log,",
        ),
        (
            lambda s: s.update(budgte={}),
            "budgte",
            "unknown key; did you mean budget? (known: name,",
        ),
        (
            lambda s: s["budget"].update(trails=3),
            "budget.trails",
            "unknown key; did you mean trials? (known: trials, max_concurrent, time,",
        ),
        (lambda s: s["search"].update(spase="x"), "search.spase", "did you mean space?"),
        (lambda s: s["objective"].update(metrc="x"), "objective.metrc", "did you mean metric?"),
        (lambda s: s["resources"].update(cpus=1), "resources.cpus", "did you mean cpu?"),
        (lambda s: s["train"].update(rouds=3), "train.rouds", "did you mean rounds?"),
        (lambda s: s["task"].update(dirichelt=0.3), "task.dirichelt", "did you mean dirichlet?"),
        (lambda s: s.update(hparams={"clinet_lr": 0.1}), "hparams.clinet_lr", "client_lr?"),
        (lambda s: s.update(algorithm="fedavgn"), "algorithm", "; did you mean fedavg"),
        (lambda s: s["task"].update(name="digts"), "task.name", "; did you mean digits?"),
        (lambda s: s["search"].update(space="fedprx"), "search.space", "did you mean fedprox?"),
    ],
)
def test_unknown_keys_and_names_suggest_the_closest(change, field, reason) -> None:
    error = _refused(change)
    assert error.field == field and reason in error.reason, str(error)


def test_fedtune_tune_says_it_in_one_line() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedtune.cli",
            "tune",
            str(REPO / "examples" / "quickstart.yaml"),
            "--set",
            "search.override.clinet_lr.low=0.001",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert (
        "search.override.clinet_lr: not a parameter of the space 'fedavgm' (did you mean "
        in (lines[0])
    )
