"""What a study ships to Ray workers through ``runtime_env``: the top-level
packages of ``code.modules`` under ``code.path`` — never the driver's path in the trials."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fedtune.errors import CodeError
from fedtune.tuning.driver.code_shipping import code_runtime_env, worker_spec
from fedtune.tuning.spec import StudySpec

USER_CODE = Path(__file__).resolve().parent / "user_code"
REPO = Path(__file__).resolve().parents[2]


def _spec(code: dict) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "ship",
            "code": code,
            "task": {"name": "ft_user_blobs", "clients": 4},
            "algorithm": "fedavg",
            "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 1},
            "budget": {"trials": 1},
            "objective": {"last_rounds": 1},
            "scheduler": {"name": "none"},
        }
    )


def test_a_directory_ships_its_packages_and_trials_import_by_name(tmp_path: Path) -> None:
    spec = _spec({"path": str(USER_CODE), "modules": ["ft_user_lab.methods", "ft_user_lab"]})
    env = code_runtime_env(spec, tmp_path)
    assert env["py_modules"] == [str(USER_CODE / "ft_user_lab")]  # once, the package itself
    assert "__pycache__" in env["excludes"]
    trials = worker_spec(spec)
    assert trials.base_trial_config()["code"] == {"path": None, "modules": spec.code.modules}
    assert spec.base_trial_config()["code"]["path"] == str(USER_CODE)  # the driver's is kept


def test_a_zip_is_unpacked_under_the_workdir(tmp_path: Path) -> None:
    """In a child process: the zip's copy of ``ft_user_lab``, imported here, would shadow
    ``USER_CODE``'s for every later test of this pytest worker that loads it (``test_extend``,
    ``test_hparams``: "another copy … shadows the study's code"), and a worker that had loaded
    ``USER_CODE``'s first would refuse the zip's."""
    archive = tmp_path / "lab.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in (USER_CODE / "ft_user_lab").glob("*.py"):
            z.write(f, f"ft_user_lab/{f.name}")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.unit.test_code_shipping import _spec\n"
        "from fedtune.tuning.driver.code_shipping import code_runtime_env\n"
        "spec = _spec({'path': sys.argv[1], 'modules': ['ft_user_lab.methods']})\n"
        "[shipped] = code_runtime_env(spec, Path(sys.argv[2]))['py_modules']\n"
        "print(shipped)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(archive), str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    shipped = Path(out.stdout.strip().splitlines()[-1])
    assert shipped.parent.parent == tmp_path / "w" / "code"
    assert (shipped / "methods.py").is_file()


def test_no_path_ships_nothing_and_a_module_outside_the_root_is_named(tmp_path: Path) -> None:
    spec = _spec({"path": str(USER_CODE), "modules": ["ft_user_lab.methods"]})
    assert code_runtime_env(spec.model_copy(update={"code": None}), tmp_path) is None
    root = tmp_path / "root"
    shutil.copytree(USER_CODE / "ft_user_lab", root / "ft_user_lab")
    # imported already from USER_CODE: a root holding another copy is refused at load
    with pytest.raises(CodeError, match=r"code\.modules\[0\].*shadows the study's code"):
        _spec({"path": str(root), "modules": ["ft_user_lab.methods"]})
    shutil.rmtree(root / "ft_user_lab")  # a root without it: the module is named at shipping
    moved = _spec({"path": str(root), "modules": ["ft_user_lab.methods"]})
    with pytest.raises(CodeError, match=r"code\.modules\[0\].*'ft_user_lab'"):
        code_runtime_env(moved, tmp_path)
