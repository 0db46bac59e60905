"""A first session with ``fedtune``: ``--version``, the grouped ``--help``, one name for the
study file, ``--set`` on ``tune``, quiet ends into a closed pipe, a verb whose extra is not
installed, and the search ``tune`` says it used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import fedtune
import fedtune.cli as cli
from fedtune.cli import common
from fedtune.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
FEDTUNE = [sys.executable, "-m", "fedtune.cli"]


def test_version_prints_the_version_and_exits_0(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"fedtune {fedtune.__version__}\n"


def _section(text: str, title: str) -> list[str]:
    lines = text.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.split()[0] for line in lines]


def test_help_groups_the_verbs_and_hides_the_worker(capsys) -> None:
    parser = cli.build_parser()
    text = parser.format_help()
    assert _section(text, "local work") == [
        "tune",
        "compare",
        "train",
        "spaces",
        "tasks",
        "algorithms",
        "frontier",
        "reproduce",
        "manifest",
    ]
    assert _section(text, "the service's client") == [
        "submit",
        "status",
        "studies",
        "wait",
        "cancel",
        "trials",
        "tradeoff",
        "whoami",
        "mlflow-login",
    ]
    assert _section(text, "getting started") == ["init"]
    assert _section(text, "administration") == ["serve", "mlflow-server", "db", "users", "projects"]
    assert "worker" not in text and "\nother:" not in text
    # hidden, not gone: the service starts it
    assert parser.parse_args(["worker", "run-study", "0123456789ab"]).func is not None
    # every verb has its one-line description
    assert all(
        len(line.split(None, 1)) == 2
        for t in ("local work", "administration")
        for line in text.split(f"\n{t}:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    )


def test_client_settings_are_documented_with_their_defaults(capsys) -> None:
    top = " ".join(cli.build_parser().format_help().split())
    assert "--url the service's base URL (default: $FEDTUNE_URL, else http://127.0.0.1:8000)" in top
    assert "(default: $FEDTUNE_TOKEN, else $FEDTUNE_API_TOKEN, else none)" in top
    with pytest.raises(SystemExit):
        cli.main(["submit", "--help"])
    submit = " ".join(capsys.readouterr().out.split())
    assert "$FEDTUNE_URL, else http://127.0.0.1:8000" in submit and "$FEDTUNE_TOKEN" in submit
    assert "$FEDTUNE_PROJECT" in submit and "--set KEY=VALUE" in submit


@pytest.mark.parametrize("verb", ["tune", "submit", "train", "manifest"])
def test_one_name_for_the_study_file(verb: str, capsys) -> None:
    args = cli.build_parser().parse_args([verb, "study.yaml"])
    assert args.study_file == "study.yaml"
    with pytest.raises(SystemExit):
        cli.main([verb, "--help"])
    usage = capsys.readouterr().out.split("\n\n", 1)[0]
    assert usage.startswith(f"usage: fedtune {verb}") and "STUDY_FILE" in usage


def test_set_applies_dotted_overrides_naming_the_key() -> None:
    data = {"name": "s", "task": "digits", "budget": {"trials": 4}}
    out = common.apply_sets(data, ["budget.trials=8", "task.clients=5", "search.space=fedavg"])
    assert out == {
        "name": "s",
        "task": {"name": "digits", "clients": 5},
        "budget": {"trials": 8},
        "search": {"space": "fedavg"},
    }
    assert data["budget"]["trials"] == 4  # a copy
    with pytest.raises(ConfigError) as err:
        common.apply_sets(data, ["name.first=x"])
    assert err.value.field == "name"
    with pytest.raises(ConfigError) as err:
        common.apply_sets(data, ["budget"])
    assert err.value.field == "--set"


def test_tune_applies_set_before_validation(tmp_path: Path, capsys) -> None:
    from fedtune.cli.tune import _load_spec

    args = cli.build_parser().parse_args(
        ["tune", str(QUICKSTART), "--set", "budget.trials=3", "--set", "search.strategy=asha"]
    )
    spec = _load_spec(args)
    assert spec.budget.trials == 3 and str(spec.strategy) == "asha"
    assert cli.main(["tune", str(QUICKSTART), "--set", "budget.trials=0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "budget.trials" in err


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """``fedtune tasks | head -0``: the reader is gone before the first write."""
    proc = subprocess.Popen(
        [*FEDTUNE, "tasks"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
    )
    proc.stdout.close()  # before the child writes: its first write finds no reader
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == cli.EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "BrokenPipeError" not in err and err == ""


def test_a_verb_without_its_extra_says_which_to_install(monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    assert cli.main(["tune", "x.yaml"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "fedtune: error: 'fedtune tune' needs the tune extra (torch is not "
        "installed): pip install 'fedtune[tune]'\n"
    )
    assert cli.main(["users", "list"]) == 2
    assert "pip install 'fedtune[service]'" in capsys.readouterr().err
    assert common.missing_extra("submit") is None  # the light install's verbs need nothing


def test_a_module_missing_at_run_time_names_the_extra_unless_it_is_the_users() -> None:
    assert common.missing_extra("train", "mlflow.tracking") == (
        "'fedtune train' needs the engine extra (mlflow is not installed): "
        "pip install 'fedtune[engine]'"
    )
    assert common.missing_extra("train", "my_lab") is None  # a user module: its own traceback


def test_tune_says_which_search_it_used() -> None:
    from fedtune.cli.tune import _search_line
    from fedtune.tuning.spec import StudySpec

    quickstart = StudySpec.from_file(QUICKSTART)
    assert _search_line(quickstart).endswith(
        "strategy tpe_guard (the default): TPE sampler + guard stop rule"
    )
    data = yaml.safe_load(QUICKSTART.read_text())
    named = StudySpec.from_dict({**data, "sampler": {"name": "tpe"}, "scheduler": {"name": "asha"}})
    assert _search_line(named).endswith(
        "sampler tpe, scheduler asha (as sampler/scheduler name them; no search.strategy)"
    )


def test_the_quickstart_header_names_the_search_it_uses() -> None:
    from fedtune.tuning.spec import StudySpec

    header = "".join(ln for ln in QUICKSTART.read_text().splitlines(True) if ln.startswith("#"))
    spec = StudySpec.from_file(QUICKSTART)
    assert str(spec.strategy) in header and "ASHA" not in header
    assert "(MEASURED)" not in header


def test_serve_on_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*FEDTUNE, "serve", "--port", str(port), "--workdir", str(tmp_path / "w")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"fedtune: error: --port: 127.0.0.1:{port} is in use: another process (another fedtune "
        "serve?) listens there; stop it, or pick another port with --port"
    ]
    assert not (tmp_path / "fedtune.db").exists()  # refused before the database was opened
