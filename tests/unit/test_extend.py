"""The public extension API: user code registers tasks, models and
algorithms through the built-ins' registries, is found through a study's ``code:`` section or
entry points, and bad user code fails early with the field and the file:line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedtune.errors import CodeError, ConfigError
from fedtune.extend import load_code
from fedtune.trainers import run_trial
from fedtune.trainers.algorithms.registry import REGISTRY as ALGORITHMS
from fedtune.trainers.tasks.registry import REGISTRY as TASKS
from fedtune.tuning.spec import StudySpec

USER_CODE = Path(__file__).resolve().parent / "user_code"
REPO = Path(__file__).resolve().parents[2]


def user_config(**extra) -> dict:
    return {
        "code": {"path": str(USER_CODE), "modules": ["ft_user_lab.methods"]},
        "task": {"name": "ft_user_blobs", "clients": 5, "seed": 3},
        "algorithm": "ft_user_fomaml_delta",
        "train": {"rounds": 3, "clients_per_round": 3, "local_steps": 2, "eval_every": 1},
        "hparams": {"client_lr": 0.1},
        **extra,
    }


def write_pkg(root: Path, name: str, files: dict[str, str]) -> Path:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for rel, text in files.items():
        (pkg / rel).write_text(textwrap.dedent(text))
    return root


def test_load_code_registers_with_code_origin_and_is_idempotent():
    report = load_code({"path": str(USER_CODE), "modules": ["ft_user_lab.methods"]})
    assert report.tasks == ["ft_user_blobs"]
    assert report.models == ["ft_user_affine"]
    assert "ft_user_fomaml_delta" in report.algorithms
    assert report.files["ft_user_lab.methods"].endswith("ft_user_lab/methods.py")
    origin = TASKS.origin("ft_user_blobs")
    assert origin.kind == "code" and origin.detail == str(USER_CODE)
    assert str(ALGORITHMS.origin("ft_user_fomaml_delta")) == f"code {USER_CODE}"
    assert str(TASKS.origin("digits")) == "builtin"
    again = load_code({"path": str(USER_CODE), "modules": ["ft_user_lab.methods"]})
    assert again.tasks == report.tasks and again.algorithms == report.algorithms


def test_user_task_and_algorithm_train_through_the_trial_config():
    a = run_trial(user_config())
    b = run_trial(user_config())
    assert a.outcome == "completed" and len(a.records) == 3
    assert [r.client_loss for r in a.records] == [r.client_loss for r in b.records]
    assert a.config["code"]["modules"] == ["ft_user_lab.methods"]


def test_study_code_section_is_relative_to_the_study_file(tmp_path):
    study = {
        "name": "user-study",
        **{k: v for k, v in user_config().items() if k != "code"},
        "code": {"path": os.path.relpath(USER_CODE, tmp_path), "modules": ["ft_user_lab.methods"]},
        "search": {"parameters": {"client_lr": {"type": "float", "low": 0.01, "high": 0.5}}},
        "hparams": {},
        "objective": {"last_rounds": 2},
        "scheduler": {"name": "none"},
    }
    spec = StudySpec.from_dict(study, base_dir=tmp_path)
    assert spec.code.modules == ["ft_user_lab.methods"]
    assert spec.base_trial_config()["code"]["path"] == str(USER_CODE)
    shape_only = StudySpec.from_dict(
        {**study, "task": {"name": "not_registered_anywhere"}}, import_code=False
    )
    assert shape_only.task.name == "not_registered_anywhere"


def test_code_section_fields_are_validated():
    with pytest.raises(ConfigError) as err:
        load_code({"path": str(USER_CODE), "modules": []})
    assert err.value.field == "code.modules"
    with pytest.raises(ConfigError) as err:
        load_code({"path": str(USER_CODE), "modules": ["not a module"]})
    assert err.value.field == "code.modules[0]"
    with pytest.raises(CodeError) as err:
        load_code({"path": "/nonexistent/lab", "modules": ["lab"]})
    assert err.value.field == "code.path"


@pytest.mark.parametrize(
    ("source", "reason", "line"),
    [
        ("x = 1\ndef broken(:\n", "syntax error", 2),
        ("import os\nimport ft_no_such_dependency_xyz\n", "ft_no_such_dependency_xyz", 2),
        ("a = 1\nb = 2\nraise RuntimeError('builder setup failed')\n", "RuntimeError", 3),
        (
            "from fedtune.extend import register_task\n\n"
            "@register_task('digits')\ndef clash(params, seed):\n    pass\n",
            "already registered (builtin)",
            3,
        ),
    ],
    ids=["syntax-error", "import-error", "raises", "duplicate-name"],
)
def test_bad_user_code_names_field_and_file_line(tmp_path, source, reason, line):
    name = f"bad_{tmp_path.name.replace('-', '_')}"
    write_pkg(tmp_path, name, {"mod.py": source})
    with pytest.raises(CodeError) as err:
        load_code({"path": str(tmp_path), "modules": ["os", f"{name}.mod"]})
    assert err.value.field == "code.modules[1]"
    assert reason in err.value.reason
    assert err.value.location == f"{tmp_path / name / 'mod.py'}:{line}"


def test_module_not_found_names_the_module(tmp_path):
    with pytest.raises(CodeError) as err:
        load_code({"path": str(tmp_path), "modules": ["ft_absent_pkg.tasks"]})
    assert err.value.field == "code.modules[0]"
    assert "'ft_absent_pkg.tasks' not found under" in err.value.reason


def test_missing_registration_names_the_task_and_what_the_code_registered(tmp_path):
    study = {
        "name": "missing",
        "task": {"name": "ft_user_never_registered"},
        "algorithm": "fedavg",
        "code": {"path": str(USER_CODE), "modules": ["ft_user_lab.methods"]},
    }
    with pytest.raises(CodeError) as err:
        StudySpec.from_dict(study)
    assert err.value.field == "task.name"
    assert "registered ft_user_blobs" in err.value.reason
    assert err.value.location.endswith("ft_user_lab/methods.py")


def test_code_error_survives_pickling_with_its_location():
    import pickle

    err = CodeError("code.modules[0]", "boom", "/x/y.py:3", "study.yaml")
    back = pickle.loads(pickle.dumps(err))
    assert (back.field, back.location, back.source, str(back)) == (
        err.field,
        err.location,
        err.source,
        str(err),
    )


def _cli(args: list[str], env_path: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*env_path, str(REPO)])}
    return subprocess.run(
        [sys.executable, "-m", "fedtune.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_entry_points_and_code_are_listed_with_their_origin(tmp_path):
    site = tmp_path / "site"
    write_pkg(
        site,
        "ft_ep_lab",
        {
            "plugin.py": """
            from fedtune.extend import register_algorithm, register_task

            def register():
                register_algorithm("ft_ep_fedavg", summary="from an entry point",
                                   params=("client_lr", "server_lr"))

            @register_task("ft_ep_task", "a task from an installed distribution")
            def build(params, seed):
                raise NotImplementedError
            """
        },
    )
    info = site / "ft_ep_lab-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ft-ep-lab\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(
        "[fedtune.tasks]\nlab = ft_ep_lab.plugin\n\n"
        "[fedtune.algorithms]\nlab = ft_ep_lab.plugin:register\n"
    )
    out = _cli(["tasks"], [str(site)], tmp_path)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("ft_ep_task "))
    assert "entry point ft-ep-lab==0.3" in line
    assert "digits" in out.stdout and "builtin" in out.stdout
    out = _cli(
        ["algorithms", "--code", str(USER_CODE), "--module", "ft_user_lab.methods"],
        [str(site)],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    lines = {ln.split()[0]: ln for ln in out.stdout.splitlines()}
    assert "entry point ft-ep-lab==0.3" in lines["ft_ep_fedavg"]
    assert f"code {USER_CODE}" in lines["ft_user_fomaml_delta"]
    assert " builtin " in lines["fedavg"]


def test_broken_entry_point_is_one_line_exit_2(tmp_path):
    site = tmp_path / "site"
    write_pkg(site, "ft_bad_ep", {"plugin.py": "x = 1\nraise ImportError('no backend')\n"})
    info = site / "ft_bad_ep-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ft-bad-ep\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[fedtune.tasks]\nbad = ft_bad_ep.plugin\n")
    out = _cli(["tasks"], [str(site)], tmp_path)
    assert out.returncode == 2
    assert "entry_points.fedtune.tasks.bad" in out.stderr
    assert f"{site / 'ft_bad_ep' / 'plugin.py'}:2" in out.stderr


def test_register_algorithm_takes_an_aggregator_part():
    """The documented ``register_algorithm(..., aggregator=...)``: a LocalUpdate method whose
    round average is the user's part, called with the stacked messages and every τ_i."""
    from fedtune.extend import register_algorithm, weighted_mean
    from tests.conftest import quadratic_config

    calls = []

    def half_mean(messages, weights, steps, client_lr):
        calls.append((next(iter(messages.values())).shape[0], steps.tolist(), client_lr))
        return weighted_mean(messages, weights / 2), {"half": 0.5}

    register_algorithm(
        "ft_test_half_mean",
        summary="half the FedAvg average",
        params=("client_lr", "server_lr"),
        aggregator=half_mean,
    )
    cfg = quadratic_config("ft_test_half_mean", hparams={"client_lr": 0.05, "server_lr": 0.1})
    half = run_trial(cfg)
    cfg = quadratic_config("fedavg", hparams={"client_lr": 0.05, "server_lr": 0.05})
    fedavg = run_trial(cfg)  # η/2 with the full mean is the same step
    assert calls[0] == (3, [3, 3, 3], 0.05)
    assert half.records[-1].extra["half"] == 0.5
    for a, b in zip(half.records, fedavg.records, strict=True):
        assert a.client_loss == pytest.approx(b.client_loss, rel=1e-12)
    with pytest.raises(CodeError) as err:
        register_algorithm("ft_test_both", aggregator=half_mean, build=lambda *a: None)
    assert err.value.field == "algorithm.aggregator"
    with pytest.raises(CodeError) as err:
        register_algorithm("ft_test_not_callable", aggregator=3)
    assert err.value.field == "algorithm.aggregator" and "callable" in err.value.reason


_RUNTIME_BAD = {
    "builder": (
        """
        from fedtune.extend import register_task

        @register_task("{name}_task")
        def build(params, seed):
            x = 1
            raise OSError("the data share is not mounted")
        """,
        "task.name",
        ["the builder of task '{name}_task'", "OSError: the data share is not mounted"],
        7,
    ),
    "shape": (
        """
        import torch
        from torch import nn
        from fedtune.extend import FederatedData, Task, build_model, register_model, register_task
        from fedtune.trainers.tasks.losses import cross_entropy

        @register_model("{name}_flat")
        def flat(input_shape, num_outputs):
            return nn.Sequential(nn.Linear(input_shape[0], num_outputs), nn.Flatten(0))

        @register_task("{name}_task")
        def build(params, seed):
            g = torch.Generator().manual_seed(seed)
            data = [(torch.randn(4, 3, generator=g), torch.tensor([0, 1, 2, 1])) for _ in range(3)]
            return Task("{name}_task", FederatedData.from_clients(data),
                        lambda gen: build_model("{name}_flat", (3,), 3, gen), cross_entropy)
        """,
        "task.model",
        ["outputs of shape [6]", "targets of shape [2]", "'{name}_task'"],
        None,
    ),
    "outputs": (  # client 0's first examples are all label 0
        """
        import torch
        from torch import nn
        from fedtune.extend import FederatedData, Task, build_model, register_model, register_task
        from fedtune.trainers.tasks.losses import cross_entropy

        @register_model("{name}_one")
        def one(input_shape, num_outputs):
            return nn.Linear(input_shape[0], num_outputs)

        @register_task("{name}_task")
        def build(params, seed):
            g = torch.Generator().manual_seed(seed)
            data = [(torch.randn(4, 3, generator=g), torch.tensor([0, 0, 1, 1])) for _ in range(3)]
            return Task("{name}_task", FederatedData.from_clients(data),
                        lambda gen: build_model("{name}_one", (3,), 1, gen), cross_entropy)
        """,
        "task.model",
        [
            "outputs of shape [2, 1]",
            "labels its data holds (0..1)",
            "out of bounds",
            "'{name}_task'",
        ],
        16,  # the task's model_fn
    ),
}


@pytest.mark.parametrize("kind", sorted(_RUNTIME_BAD))
def test_user_code_that_fails_only_at_run_time_names_the_field(tmp_path, kind):
    """A task builder that raises (CodeError naming task.name and the builder's file:line) and
    a model whose outputs do not fit the loss (ConfigError naming task.model): one line each,
    before any training, instead of a traceback from inside the vectorized runner."""
    from fedtune.trainers import Trainer

    source, field, words, line = _RUNTIME_BAD[kind]
    name = f"rt_{kind}_{tmp_path.name.replace('-', '_')}"
    write_pkg(tmp_path, name, {"mod.py": source.replace("{name}", name)})
    load_code({"path": str(tmp_path), "modules": [f"{name}.mod"]})
    cfg = {
        "task": {"name": f"{name}_task"},
        "algorithm": "fedavg",
        "train": {"rounds": 1, "clients_per_round": 2, "local_steps": 1, "batch_size": 2},
        "hparams": {"client_lr": 0.1},
    }
    with pytest.raises(ConfigError) as err:
        Trainer(cfg)
    assert err.value.field == field
    for w in words:
        assert w.replace("{name}", name) in str(err.value), str(err.value)
    if line is not None:
        assert err.value.location == f"{tmp_path / name / 'mod.py'}:{line}"


def test_an_installed_copy_of_the_package_never_silently_shadows_code_path(tmp_path, monkeypatch):
    """``pip install ./mypkg`` then a study whose ``code.path`` is an edited
    copy: the installed module was imported (entry points load first) and used by the driver
    while the trials ran the edited one. Now the study stops with one line naming both."""
    import importlib

    name = f"shadow_{tmp_path.name.replace('-', '_')}"
    installed = write_pkg(tmp_path / "site-packages", name, {"tasks.py": "VERSION = 1\n"})
    edited = write_pkg(tmp_path / "edited", name, {"tasks.py": "VERSION = 2\n"})
    monkeypatch.syspath_prepend(str(installed))
    try:
        assert importlib.import_module(f"{name}.tasks").VERSION == 1  # as an entry point would
        with pytest.raises(CodeError) as err:
            load_code({"path": str(edited), "modules": [f"{name}.tasks"]})
        assert err.value.field == "code.modules[0]"
        text = str(err.value)
        assert str(installed / name / "tasks.py") in text and str(edited) in text
        assert "\n" not in text
    finally:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
    report = load_code({"path": str(edited), "modules": [f"{name}.tasks"]})  # alone: it wins
    assert report.files[f"{name}.tasks"] == str(edited / name / "tasks.py")
    assert importlib.import_module(f"{name}.tasks").VERSION == 2
