"""What a study ships to Ray workers through ``runtime_env``: the top-level
packages of ``code.modules`` under ``code.path`` — never the driver's path in the trials."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from fedtune.errors import CodeError
from fedtune.tuning.driver.code_shipping import code_runtime_env, worker_spec
from fedtune.tuning.spec import StudySpec

USER_CODE = Path(__file__).resolve().parent / "user_code"


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
    archive = tmp_path / "lab.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in (USER_CODE / "ft_user_lab").glob("*.py"):
            z.write(f, f"ft_user_lab/{f.name}")
    spec = _spec({"path": str(archive), "modules": ["ft_user_lab.methods"]})
    [shipped] = code_runtime_env(spec, tmp_path / "w")["py_modules"]
    assert Path(shipped).parent.parent == tmp_path / "w" / "code"
    assert (Path(shipped) / "methods.py").is_file()


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
