"""What one submission may ask of the server (in-process app).

* the server reads no file of its own for a client (shipped space names only; task data paths
  only under ``FEDTUNE_DATA_ROOTS``, symlinks and ``..`` resolved);
* sizes are bounded by settings and each refusal is a 422 naming the field;
* validation cost does not grow with the number of choices beyond a cheap check per value
  (trial-configuration builds are counted, not timed), and submissions are validated in a
  bounded pool (503 ``busy`` when it is full).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fedtune.service.api import create_app
from tests.spies import count_calls

from .conftest import TOKEN
from .helpers import FakeBackend, tiny_spec

AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "TOP-SECRET-CONTENT-1d5e"


@pytest.fixture
def make_client(make_settings: Callable, fake_backend: FakeBackend) -> Iterator[Callable]:
    clients: list[TestClient] = []

    def make(**overrides) -> TestClient:
        settings = make_settings(api_token=TOKEN, **overrides)
        c = TestClient(create_app(settings, backend=fake_backend, schedule=False), headers=AUTH)
        clients.append(c.__enter__())
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client()


def _error(r) -> dict:
    assert r.status_code == 422, r.text
    return r.json()["error"]


# ---------------------------------------------------------------- no server files


class _Opens:
    """Every file the process opens while ``watching`` (an audit hook: nothing escapes it)."""

    def __init__(self) -> None:
        self.watching = False
        self.paths: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self.watching and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            self.paths.append(os.fsdecode(args[0]))


_OPENS = _Opens()


@pytest.mark.parametrize("name", ["fedtune.db", "server.log", "secret-space"])
def test_a_relative_space_name_is_refused_without_reading_the_file(
    client: TestClient, tmp_path: Path, monkeypatch, name: str
) -> None:
    monkeypatch.chdir(tmp_path)  # the server's cwd holds a file of that name
    (tmp_path / name).write_text(f"parameters: {{{SECRET}: 1}}\n")
    _OPENS.paths.clear()
    _OPENS.watching = True
    try:
        r = client.post("/v1/studies", json=tiny_spec(search={"space": name}))
    finally:
        _OPENS.watching = False
    error = _error(r)
    assert error["field"] == "search.space" and "shipped" in error["message"]
    assert SECRET not in r.text
    assert not [p for p in _OPENS.paths if Path(p).name == name], _OPENS.paths


def test_a_list_of_spaces_names_the_entry(client: TestClient) -> None:
    r = client.post("/v1/studies", json=tiny_spec(search={"space": ["fedavg", "fedtune.db"]}))
    assert _error(r)["field"] == "search.space[1]"


def test_shipped_spaces_are_still_accepted(client: TestClient) -> None:
    spec = tiny_spec(
        search={"space": "fedavg", "override": {"client_lr": {"high": 0.05, "default": 0.01}}}
    )
    assert client.post("/v1/studies", json=spec).status_code == 201


def _tff(search: dict | None = None, **task) -> dict:
    spec = tiny_spec(task={"name": "emnist", **task})
    if search is not None:
        spec["search"]["parameters"] = search["parameters"]
        spec["search"].pop("override")
    return spec


def test_data_paths_need_a_data_root(client: TestClient) -> None:
    error = _error(client.post("/v1/studies", json=_tff(train_path="/etc/passwd")))
    assert error["field"] == "task.train_path" and "FEDTUNE_DATA_ROOTS" in error["message"]


@pytest.mark.parametrize(
    ("key", "where"),
    [
        ("train_path", "/etc/passwd"),
        ("test_path", "{root}/../outside.h5"),
        ("train_path", "{root}/link.h5"),  # a symlink out of the root
        ("train_path", "relative.h5"),
    ],
)
def test_data_paths_outside_the_roots_are_422(make_client, tmp_path, key, where) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (tmp_path / "outside.h5").write_text(SECRET)
    (root / "link.h5").symlink_to(tmp_path / "outside.h5")
    c = make_client(data_roots=str(root))
    r = c.post("/v1/studies", json=_tff(**{key: where.format(root=root)}))
    error = _error(r)
    assert error["field"] == f"task.{key}" and SECRET not in r.text


def test_data_paths_under_a_root_pass_the_root_check(make_client, tmp_path) -> None:
    root = tmp_path / "data"
    (root / "emnist").mkdir(parents=True)
    c = make_client(data_roots=f"/nonexistent,{root}")
    r = c.post("/v1/studies", json=_tff(train_path=f"{root}/emnist/../emnist/train.h5"))
    assert r.status_code == 201, r.text


def test_searched_data_paths_are_checked_too(make_client, tmp_path) -> None:
    c = make_client(data_roots=str(tmp_path))
    search = {
        "parameters": {
            "task.train_path": {
                "type": "categorical",
                "choices": [f"{tmp_path}/a.h5", "/etc/shadow"],
            }
        }
    }
    r = c.post("/v1/studies", json=_tff(search=search))
    assert _error(r)["field"] == "search.parameters.task.train_path.choices[1]"


def test_data_roots_are_a_setting(make_settings) -> None:
    from fedtune.errors import ConfigError

    assert make_settings(data_roots="/srv/a, /srv/b").data_roots == [Path("/srv/a"), Path("/srv/b")]
    with pytest.raises(ConfigError, match="FEDTUNE_DATA_ROOTS"):
        make_settings(data_roots="relative/dir")


# ---------------------------------------------------------------- resource sanity


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"train": {"rounds": 1e12, "clients_per_round": 3, "local_steps": 2}}, "train.rounds"),
        ({"task": {"name": "quadratic", "clients": 1e9, "dim": 3}}, "task.clients"),
        ({"task": {"name": "quadratic", "clients": 6, "dim": 1e9}}, "task.dim"),
        ({"train": {"rounds": 4, "clients_per_round": 10**8}}, "train.clients_per_round"),
        ({"budget": {"trials": 2, "max_concurrent": 1e9}}, "budget.max_concurrent"),
        ({"budget": {"trials": 10**6}}, "budget.trials"),
        ({"resources": {"cpu": 1e308}}, "resources.cpu"),
        ({"resources": {"gpu": 1e6}}, "resources.gpu"),
        (
            {"search": {"override": {"rounds": {"type": "int", "low": 2, "high": 10**12}}}},
            "search.override.rounds.high",
        ),
        # What failed only inside a trial (allocator error, overflow)
        (
            {"train": {"rounds": 4, "clients_per_round": 3, "local_steps": 10**12}},
            "train.local_steps",
        ),
        (
            {
                "train": {
                    "rounds": 4,
                    "clients_per_round": 3,
                    "local_epochs": 10**9,
                    "batch_size": 2,
                }
            },
            "train.local_epochs",
        ),
        ({"train": {"rounds": 4, "clients_per_round": 3, "batch_size": 10**9}}, "train.batch_size"),
        ({"train": {"rounds": 4, "clients_per_round": 3, "eval_every": 10**9}}, "train.eval_every"),
        ({"seed": 10**30}, "seed"),
        ({"task": {"name": "quadratic", "clients": 6, "dim": 3, "seed": 10**30}}, "task.seed"),
        (
            {"search": {"override": {"local_steps": {"type": "int", "low": 1, "high": 10**12}}}},
            "search.override.local_steps.high",
        ),
        # a bound written as a string (YAML 1.1 reads `1e12` so) is the number it reads as
        (
            {"search": {"parameters": {"rounds": {"type": "int", "low": 2, "high": "1e12"}}}},
            "search.parameters.rounds.high",
        ),
    ],
)
def test_absurd_sizes_are_422_naming_the_field(client: TestClient, change, field) -> None:
    error = _error(client.post("/v1/studies", json=tiny_spec() | change))
    assert error["code"] == "invalid_config" and error["field"] == field, error
    assert "FEDTUNE_MAX_" in error["message"]


def test_size_limits_are_settings(make_client) -> None:
    c = make_client(max_rounds=3)
    error = _error(c.post("/v1/studies", json=tiny_spec(rounds=4)))
    assert error["field"] == "train.rounds" and "at most 3" in error["message"]
    assert (
        c.post("/v1/studies", json=tiny_spec(rounds=3, objective={"last_rounds": 2})).status_code
        == 201
    )


def test_a_budget_in_compute_is_bounded_by_what_the_service_runs(make_client) -> None:
    c = make_client(max_trials=10, max_rounds=4, study_deadline_s=3600)
    budget = {"configuration_rounds": 41, "max_concurrent": 1}
    error = _error(c.post("/v1/studies", json=tiny_spec() | {"budget": budget}))
    assert error["field"] == "budget.configuration_rounds"
    assert "at most 40 (FEDTUNE_MAX_TRIALS × FEDTUNE_MAX_ROUNDS)" in error["message"]
    error = _error(c.post("/v1/studies", json=tiny_spec() | {"budget": {"time": "1h1s"}}))
    assert error["field"] == "budget.time" and "at most 3600 s" in error["message"]
    error = _error(c.post("/v1/studies", json=tiny_spec() | {"budget": {"time": "1 hour"}}))
    assert error["field"] == "budget.time" and "'30m'" in error["message"]
    ok = c.post("/v1/studies", json=tiny_spec() | {"budget": {"time": "1h", "trials": None}})
    assert ok.status_code == 201, ok.text
    study = c.get(f"/v1/studies/{ok.json()['id']}").json()
    # no trial count: at most the service's most trials; the stored spec says time in seconds
    assert study["trials_requested"] == 10 and study["progress"]["requested"] == 10
    assert study["spec"]["budget"] | {} == {
        "trials": None,
        "max_concurrent": 1,
        "time": 3600.0,
        "configuration_rounds": None,
    }


# ---------------------------------------------------------------- validation cost


def _choices_spec(n: int, **extra) -> dict:
    """server_lr searched over ``n`` categorical choices."""
    choices = [round(0.001 * (i + 1), 6) for i in range(n)]
    search = {
        "override": {
            "client_lr": {"high": 0.05, "default": 0.01},
            "server_lr": {"type": "categorical", "choices": choices},
        }
    }
    return tiny_spec(search=search, **extra)


@pytest.fixture
def builds(monkeypatch) -> list[int]:
    """Counts full trial-configuration builds (``StudySpec.trial``) during validation."""
    from fedtune.tuning.spec import StudySpec

    return count_calls(monkeypatch, StudySpec, "trial")


def test_trial_config_builds_do_not_grow_with_the_choices(client: TestClient, builds) -> None:
    assert client.app.state.runtime.ctx.warmup.done.wait(300)  # its builds are not ours
    counts = {}
    for n in (10, 1000):
        builds.clear()
        r = client.post("/v1/studies", json=_choices_spec(n, name=f"c{n}"))
        assert r.status_code == 201, r.text
        counts[n] = len(builds)
    assert 1 <= counts[1000] == counts[10] <= 8, counts


@pytest.mark.parametrize(("bad", "message"), [(-1.0, "server_lr"), ("fast", "must be a number")])
def test_every_choice_is_still_checked(client: TestClient, builds, bad, message) -> None:
    assert client.app.state.runtime.ctx.warmup.done.wait(300)
    spec = _choices_spec(500)
    spec["search"]["override"]["server_lr"]["choices"][321] = bad
    error = _error(client.post("/v1/studies", json=spec))
    assert error["field"] == "search.override.server_lr", error
    assert repr(bad) in error["message"] and message in error["message"]
    assert len(builds) <= 8


def test_too_many_choices_or_parameters_are_422(make_client) -> None:
    c = make_client(max_choices=100, max_search_parameters=2)
    error = _error(c.post("/v1/studies", json=_choices_spec(101)))
    assert error["field"] == "search.override.server_lr.choices"
    assert "FEDTUNE_MAX_CHOICES" in error["message"]
    spec = _choices_spec(3)
    spec["search"]["override"]["prox_alpha"] = {"type": "float", "low": 0.0, "high": 1.0}
    error = _error(c.post("/v1/studies", json=spec))
    assert error["field"] == "search.override.prox_alpha"


def test_the_limits_are_in_the_api_docs(client: TestClient) -> None:
    post = client.get("/openapi.json").json()["paths"]["/v1/studies"]["post"]
    text = post["description"]
    for setting in (
        "FEDTUNE_MAX_CHOICES",
        "FEDTUNE_MAX_SEARCH_PARAMETERS",
        "FEDTUNE_DATA_ROOTS",
        "FEDTUNE_MAX_ROUNDS",
        "FEDTUNE_MAX_CONCURRENT_VALIDATIONS",
        "FEDTUNE_MAX_LOCAL_STEPS",
        "FEDTUNE_MAX_SEED",
    ):
        assert setting in text, setting
    assert "503" in post["responses"]
    reference = (Path(__file__).resolve().parents[2] / "docs/reference/environment.md").read_text()
    assert "`FEDTUNE_MAX_CHOICES`" in reference and "`FEDTUNE_DATA_ROOTS`" in reference


def test_validation_runs_in_a_bounded_pool(make_client, monkeypatch) -> None:
    """With one validation slot taken, another submission is answered 503 ``busy`` at once
    (no request thread waits on it); reads are not affected; the slot frees afterwards."""
    import fedtune.service.services as services

    c = make_client(max_concurrent_validations=1, validation_queue=0)
    entered, release = threading.Event(), threading.Event()
    real = services.accept_spec
    threads_seen: list[str] = []

    def slow(body, settings):
        threads_seen.append(threading.current_thread().name)
        entered.set()
        assert release.wait(60)
        return real(body, settings)

    monkeypatch.setattr(services, "accept_spec", slow)
    answers: list[int] = []
    first = threading.Thread(
        target=lambda: answers.append(
            c.post("/v1/studies", json=tiny_spec(name="first")).status_code
        )
    )
    first.start()
    try:
        assert entered.wait(60)
        r = c.post("/v1/studies", json=tiny_spec(name="second"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "busy", r.text
        assert r.headers["Retry-After"] == "1"
        assert c.get("/v1/studies").status_code == 200
    finally:
        release.set()
        first.join(60)
    assert answers == [201]
    assert threads_seen[0].startswith("fedtune-validate")
    monkeypatch.setattr(services, "accept_spec", real)
    assert c.post("/v1/studies", json=tiny_spec(name="third")).status_code == 201


def test_the_pool_admits_its_slots_and_queue_then_refuses() -> None:
    """``slots`` run, ``queue`` wait (holding no server thread), the next is refused at once."""
    import asyncio

    from fedtune.service.api.pool import ValidationPool
    from fedtune.service.errors import ServiceBusyError

    pool = ValidationPool(slots=1, queue=1)
    release = threading.Event()
    ran: list[str] = []

    def job(name: str) -> str:
        if name == "first":
            assert release.wait(60)
        ran.append(name)
        return name

    async def scenario() -> list[str]:
        first = asyncio.create_task(pool.run(job, "first"))
        queued = asyncio.create_task(pool.run(job, "queued"))
        await asyncio.sleep(0)  # both tasks ran up to their first await: both admitted
        with pytest.raises(ServiceBusyError, match="FEDTUNE_VALIDATION_QUEUE"):
            await pool.run(job, "refused")
        assert ran == []  # the queued one waits for the slot
        release.set()
        done = [await first, await queued]
        assert await pool.run(job, "later") == "later"  # places are given back
        return done

    try:
        assert asyncio.run(scenario()) == ["first", "queued"]
        assert ran == ["first", "queued", "later"]
    finally:
        release.set()
        pool.close()
