"""User code packages through the API in-process: upload (content-addressed, size-limited,
unsafe zips refused), submission checked in a subprocess (422 with field and file:line), the
operator switch, and the per-study download URL of a RayJob."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from fedtune.code_package import check_package, pack
from fedtune.errors import ConfigError
from fedtune.service.api import create_app
from fedtune.service.code_url import code_token, code_uri, code_url_key
from fedtune.service.models import CodePackageRow

from .code_fixtures import BAD, write_package, zip_with
from .conftest import TOKEN
from .helpers import FakeBackend, tiny_spec

AUTH = {"Authorization": f"Bearer {TOKEN}"}
ZIP = {"Content-Type": "application/zip"}


@pytest.fixture
def make_client(make_settings: Callable) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**overrides) -> TestClient:
        settings = make_settings(
            **(
                {"api_token": TOKEN, "allow_code_upload": True, "max_code_bytes": 64 * 1024}
                | overrides
            )
        )
        client = TestClient(
            create_app(settings, backend=FakeBackend(), schedule=False), headers=AUTH
        )
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def _upload(client: TestClient, data: bytes):
    return client.post("/v1/code", content=data, headers=ZIP)


def _code_spec(sha: str, task: str = "user_quadratic", **extra) -> dict:
    spec = tiny_spec(name="user-code", code={"sha256": sha, "modules": ["user_lab.tasks"]})
    spec["task"] = {**spec["task"], "name": task}
    spec.update(extra)
    return spec


# ---------------------------------------------------------------- packing


def test_packing_is_deterministic_and_skips_caches(tmp_path: Path) -> None:
    root = write_package(tmp_path / "lab")
    first = pack(root)
    (root / "user_lab" / "__pycache__").mkdir()
    (root / "user_lab" / "__pycache__" / "tasks.cpython-311.pyc").write_bytes(b"\0" * 64)
    again = pack(root)
    assert again.sha256 == first.sha256 and again.data == first.data
    names = check_package(first.data)
    assert names == ["pyproject.toml", "user_lab/__init__.py", "user_lab/tasks.py"]
    (root / "user_lab" / "tasks.py").write_text("# changed\n")
    assert pack(root).sha256 != first.sha256


def test_packing_refuses_symbolic_links(tmp_path: Path) -> None:
    root = write_package(tmp_path / "lab")
    (root / "user_lab" / "secrets.py").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError) as err:
        pack(root)
    assert err.value.field == "code.path" and "symbolic link" in err.value.reason


# ---------------------------------------------------------------- upload


def test_identical_code_is_stored_once(make_client, tmp_path: Path) -> None:
    client = make_client()
    package = pack(write_package(tmp_path / "lab"))
    first, second = _upload(client, package.data), _upload(client, package.data)
    assert first.status_code == 201 and second.status_code == 200
    assert first.json() == {
        "sha256": package.sha256,
        "size": package.size,
        "created": True,
        "check_timeout_s": 60.0,  # the bound a submission's answer may take (FEDTUNE_CODE_CHECK_…)
    }
    assert second.json()["created"] is False
    with client.app.state.runtime.db.session(readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(CodePackageRow)) == 1


@pytest.mark.parametrize(
    ("data", "status", "reason"),
    [
        (zip_with({"../evil.py": b"x = 1\n"}), 422, "escapes the package root"),
        (zip_with({"/etc/cron.d/evil": b"x"}), 422, "absolute path"),
        (zip_with({"ok.py": b""}, link="user_lab/link.py"), 422, "symbolic link"),
        (b"not a zip at all", 422, "not a zip archive"),
        (zip_with({"big.bin": b"\0" * 700_000}), 413, "unpacks to"),  # a zip bomb, small packed
    ],
    ids=["dotdot", "absolute", "symlink", "not-zip", "bomb"],
)
def test_unsafe_packages_are_refused_naming_the_field(make_client, data, status, reason) -> None:
    r = _upload(make_client(), data)
    assert r.status_code == status, r.text
    assert r.json()["error"]["field"] == "code" and reason in r.json()["error"]["message"]


def test_a_package_over_the_limit_is_refused_with_413(make_client) -> None:
    import os

    r = _upload(make_client(), zip_with({"noise.bin": os.urandom(80 * 1024)}))
    assert r.status_code == 413
    assert r.json()["error"]["field"] == "code"


def test_uploads_are_refused_unless_the_operator_enables_them(make_client, tmp_path) -> None:
    client = make_client(allow_code_upload=False)
    package = pack(write_package(tmp_path / "lab"))
    r = _upload(client, package.data)
    assert r.status_code == 403 and r.json()["error"]["code"] == "code_upload_disabled"
    r = client.post("/v1/studies", json=_code_spec(package.sha256))
    assert r.status_code == 403 and r.json()["error"]["field"] == "code"


# ---------------------------------------------------------------- submission


def test_a_study_with_uploaded_code_is_checked_in_a_subprocess(make_client, tmp_path) -> None:
    import sys

    client = make_client()
    package = pack(write_package(tmp_path / "lab"))
    assert _upload(client, package.data).status_code == 201
    r = client.post("/v1/studies", json=_code_spec(package.sha256))
    assert r.status_code == 201, r.text
    study = r.json()
    assert study["code_sha256"] == package.sha256 and study["task"] == "user_quadratic"
    assert study["spec"]["code"] == {"modules": ["user_lab.tasks"]}  # no path, no digest
    assert "user_lab" not in sys.modules  # never imported in the API process


@pytest.mark.parametrize("kind", sorted(BAD))
def test_bad_code_is_a_422_naming_the_field_and_file_line(make_client, tmp_path, kind) -> None:
    client = make_client()
    package = pack(write_package(tmp_path / "lab", BAD[kind]))
    _upload(client, package.data)
    r = client.post("/v1/studies", json=_code_spec(package.sha256))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "code.modules[0]"
    if kind != "import":  # a missing module has no line of the user's to blame
        assert "(at user_lab/tasks.py:" in error["message"]  # as the package names it
    assert "code-check-" not in error["message"]  # not the check's deleted scratch copy
    assert client.get("/v1/studies").json()["total"] == 0


_RAISING_BUILDER = """
from fedtune.extend import register_task


@register_task("user_quadratic")
def build(params, seed):
    raise OSError("the data share is not mounted")
"""


def test_a_task_builder_that_raises_is_a_422_at_submission(make_client, tmp_path) -> None:
    """The validation subprocess builds the task once; every trial of the
    study used to fail with this error after Ray started."""
    client = make_client()
    package = pack(write_package(tmp_path / "lab", _RAISING_BUILDER))
    _upload(client, package.data)
    r = client.post("/v1/studies", json=_code_spec(package.sha256))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "task.name"
    assert "OSError: the data share is not mounted" in error["message"]
    assert error["message"].endswith("(at user_lab/tasks.py:7)"), error["message"]
    assert client.get("/v1/studies").json()["total"] == 0


def test_a_missing_registration_names_the_task(make_client, tmp_path) -> None:
    client = make_client()
    package = pack(write_package(tmp_path / "lab", "x = 1\n"))
    _upload(client, package.data)
    r = client.post("/v1/studies", json=_code_spec(package.sha256))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"].startswith("task") and "user_quadratic" in r.text


def test_a_slow_import_is_stopped_at_the_time_limit(make_client, tmp_path) -> None:
    client = make_client(code_check_timeout_s=3)
    package = pack(write_package(tmp_path / "lab", "import time\ntime.sleep(60)\n"))
    _upload(client, package.data)
    r = client.post("/v1/studies", json=_code_spec(package.sha256))
    assert r.status_code == 422 and "longer than 3 s" in r.json()["error"]["message"]


def test_the_service_never_reads_a_code_path_or_an_unknown_digest(make_client) -> None:
    client = make_client()
    r = client.post("/v1/studies", json=tiny_spec(code={"path": "/etc", "modules": ["x"]}))
    assert r.status_code == 422 and r.json()["error"]["field"] == "code.path"
    r = client.post("/v1/studies", json=_code_spec("0" * 64))
    assert r.status_code == 422 and r.json()["error"]["field"] == "code.sha256"


# ---------------------------------------------------------------- the RayJob's download


def test_a_study_serves_its_package_with_a_per_study_credential(make_client, tmp_path) -> None:
    client = make_client(public_url="http://fedtune.example:8000")
    package = pack(write_package(tmp_path / "lab"))
    _upload(client, package.data)
    one = client.post("/v1/studies", json=_code_spec(package.sha256)).json()["id"]
    other = client.post("/v1/studies", json=_code_spec(package.sha256)).json()["id"]
    settings = client.app.state.settings
    uri = code_uri(settings, one, package.sha256)
    assert uri.startswith(f"http://fedtune.example:8000/v1/studies/{one}/code.zip?token=")
    path = uri.removeprefix("http://fedtune.example:8000")
    bare = {"Authorization": ""}
    r = client.get(path, headers=bare)  # no bearer token needed: the URL carries its own
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:  # one top folder: Ray strips it
        assert {n.split("/", 1)[0] for n in z.namelist()} == {"fedtune-code"}
        assert (
            z.read("fedtune-code/user_lab/tasks.py")
            == (tmp_path / "lab" / "user_lab" / "tasks.py").read_bytes()
        )
    token = code_token(code_url_key(settings), one, package.sha256)
    wrong = client.get(f"/v1/studies/{other}/code.zip?token={token}", headers=bare)
    assert wrong.status_code == 404  # one study's credential opens no other study
    assert client.get(f"/v1/studies/{one}/code.zip?token={'0' * 64}").status_code == 404


# ---------------------------------------------------------------- SDK and CLI


def test_sdk_and_cli_upload_the_code_of_a_study_file(
    make_client, tmp_path, monkeypatch, capsys
) -> None:
    import yaml

    from fedtune.cli import main, remote
    from fedtune.client import Client

    tc = make_client()
    lab = write_package(tmp_path / "lab")
    spec = _code_spec("unused")
    spec["code"] = {"path": "lab", "modules": ["user_lab.tasks"]}  # relative to the file
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(spec))
    sdk = Client("http://testserver", token=TOKEN, transport=tc._transport, retries=0)
    status = sdk.submit(str(path)).status()
    assert status.code_sha256 == pack(lab).sha256 and status.task == "user_quadratic"
    again = sdk.submit({**spec, "code": {"modules": ["user_lab.tasks"]}}, code=lab).status()
    assert again.code_sha256 == status.code_sha256  # the same code, stored once

    monkeypatch.setattr(
        remote,
        "_client",
        lambda args: Client(args.url, token=TOKEN, transport=tc._transport, retries=0),
    )
    bad = write_package(tmp_path / "bad", BAD["syntax"])
    assert main(["submit", str(path), "--code", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "code.modules[0]" in err[0] and "user_lab/tasks.py:1" in err[0]


def test_a_study_of_methods_with_code_is_checked_once_per_algorithm(
    make_client, tmp_path, monkeypatch
) -> None:
    from fedtune.service import code_services

    checked: list[str] = []
    real = code_services.check_in_sandbox

    def counting(spec, package, settings):
        checked.append(spec["algorithm"])
        return real(spec, package, settings)

    monkeypatch.setattr(code_services, "check_in_sandbox", counting)
    client = make_client()
    package = pack(write_package(tmp_path / "lab"))
    assert _upload(client, package.data).status_code == 201
    spec = _code_spec(package.sha256, name="m")
    spec["algorithm"] = ["fedavg", {"name": "fedprox", "search": {"space": "fedprox"}}]
    r = client.post("/v1/methods", json=spec)
    assert r.status_code == 201, r.text
    assert [s["code_sha256"] for s in r.json()["studies"]] == [package.sha256] * 2
    assert sorted(checked) == ["fedavg", "fedprox"]  # one sandboxed check each, not two
    bad = {**spec, "algorithm": ["fedavg", "no-such-algorithm"]}
    before = len(client.get("/v1/studies").json()["items"])
    assert client.post("/v1/methods", json=bad).status_code == 422
    assert len(client.get("/v1/studies").json()["items"]) == before  # nothing queued


def test_a_members_study_of_methods_with_code_goes_to_their_project(make_client, tmp_path) -> None:
    """A member of one project who names none submits there, as for one study: the package
    they uploaded there is found, and each algorithm's check runs for that project."""
    from fedtune.service import identity

    client = make_client()
    with client.app.state.runtime.db.session() as s:
        identity.create_project(s, "vision")
        identity.create_user(s, "mia")
        identity.add_member(s, "mia", "vision", "member")
        mia = {"Authorization": f"Bearer {identity.issue_token(s, 'mia').secret}"}
    package = pack(write_package(tmp_path / "lab"))
    up = client.post("/v1/code", content=package.data, headers={**ZIP, **mia})
    assert up.status_code == 201, up.text
    spec = _code_spec(package.sha256, name="m")
    spec["algorithm"] = ["fedavg", {"name": "fedprox", "search": {"space": "fedprox"}}]
    r = client.post("/v1/methods", json=spec, headers=mia)
    assert r.status_code == 201, r.text
    assert [s["project"] for s in r.json()["studies"]] == ["vision", "vision"]


def test_a_passed_check_is_remembered_per_project_code_and_spec(
    make_client, make_settings, tmp_path, monkeypatch
) -> None:
    """The same code and spec submitted again to the same project is not checked again; a
    refused check is never remembered; a remembered answer is checked against the submission
    again (``fedtune.service.code_check_cache``). The check itself is a stand-in here."""
    from fedtune.errors import CodeError
    from fedtune.service import code_services
    from fedtune.service.code_check import accepted_answer
    from fedtune.service.code_check_cache import PassedChecks

    checked: list[str] = []

    def check(spec, package, settings):
        checked.append(spec["name"])
        if spec["name"].startswith("bad"):  # a refusal, a crash or a timeout: all raise
            raise CodeError("code.modules[0]", "refused", "user_lab/tasks.py:1")
        return accepted_answer(
            spec, {**spec, "task": {**spec["task"], "name": "quadratic"}}, settings
        )

    monkeypatch.setattr(code_services, "check_in_sandbox", check)
    client = make_client()
    package = pack(write_package(tmp_path / "lab"))
    assert _upload(client, package.data).status_code == 201
    spec = _code_spec(package.sha256, task="quadratic")
    for body in (spec, spec, {**spec, "name": "other"}, spec):
        r = client.post("/v1/studies", json=body)
        assert r.status_code == 201, r.text
        assert r.json()["code_sha256"] == package.sha256
    assert checked == ["user-code", "other"]  # the same spec again: no second check
    for _ in range(2):
        r = client.post("/v1/studies", json={**spec, "name": "bad"})
        assert r.status_code == 422 and r.json()["error"]["field"] == "code.modules[0]"
    assert checked == ["user-code", "other", "bad", "bad"]  # refused: checked each time
    passed: PassedChecks = client.app.state.runtime.ctx.passed_checks
    key = passed.key(
        "default",
        package.sha256,
        {**spec, "code": {"modules": ["user_lab.tasks"]}},
        client.app.state.runtime.ctx.settings,
    )
    tampered = passed.get(key)
    assert tampered is not None
    passed.put(key, {**tampered, "budget": {"trials": 999, "max_concurrent": 1}})
    r = client.post("/v1/studies", json=spec)
    assert r.status_code == 422 and "not the submitted one" in r.json()["error"]["message"]
    settings = make_settings()
    base = PassedChecks.key("a", "0" * 64, spec, settings)
    assert (
        len(
            {
                base,
                PassedChecks.key("b", "0" * 64, spec, settings),  # another project
                PassedChecks.key("a", "1" * 64, spec, settings),  # other code
                PassedChecks.key("a", "0" * 64, {**spec, "seed": 1}, settings),  # another spec
                PassedChecks.key("a", "0" * 64, spec, make_settings(code_sandbox_memory_mib=1024)),
            }
        )
        == 5
    )


def test_the_passed_checks_kept_are_bounded_in_number_and_bytes() -> None:
    from fedtune.service.code_check_cache import PassedChecks

    passed = PassedChecks(size=2, max_bytes=100)
    passed.put("a", {"x": 1})
    passed.put("b", {"x": 2})
    assert passed.get("a") == {"x": 1}  # now the most recently used
    passed.put("c", {"x": 3})
    assert passed.get("b") is None and passed.get("a") == {"x": 1}  # the least recent went
    passed.put("d", {"x": "y" * 90})  # over the bytes: the older ones go first
    assert passed.get("a") is None and passed.get("c") is None and passed.get("d") is not None
    passed.put("e", {"x": "z" * 200})  # larger than all the bytes: not kept
    assert passed.get("e") is None
    got = passed.get("d")
    got["x"] = "changed"
    assert passed.get("d") == {"x": "y" * 90}  # a copy: the caller's changes stay its own
