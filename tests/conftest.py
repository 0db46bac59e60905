"""Shared test configuration: markers from the test folders, small float64 engine
configurations."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

os.environ.setdefault("MPLBACKEND", "Agg")
torch.set_num_threads(1)


def _without_a_sandbox() -> None:
    """On a machine without a working bubblewrap (outside CI), the tests that merely use code
    upload run its check unsandboxed (``FEDTUNE_CODE_SANDBOX=none``), since a service with
    uploads on refuses to start otherwise; the tests of the sandbox itself skip, saying why
    (``tests/needs.py``, ``FEDTUNE_REQUIRE_BWRAP=1`` in CI makes that a failure)."""
    from fedtune.sandbox import sandbox_missing
    from tests.needs import required

    missing = sandbox_missing()
    if missing is not None and not required("bwrap"):
        print(f"no code sandbox here ({missing}): code checks in the tests run unsandboxed")
        os.environ.setdefault("FEDTUNE_CODE_SANDBOX", "none")


_without_a_sandbox()

TESTS = Path(__file__).resolve().parent

#: The marker every test in a folder of ``tests/`` gets (``-m science`` runs tests/science).
#: A marker that only some files of a folder need (``slow``, ``image``, ``box``, ``integration``
#: outside tests/integration) stays in those files as ``pytestmark``.
FOLDER_MARKERS = {
    "integration": "integration",
    "e2e": "e2e",
    "science": "science",
    "docs": "docs",
}


def folder_marker(path: Path) -> str | None:
    """Give the marker of the ``tests/`` folder that a test file lives in.

    Args:
        path: the test file.

    Returns:
        The folder's marker, or ``None`` (no folder marker, or a file outside ``tests/``).
    """
    try:
        folder = path.resolve().relative_to(TESTS).parts[0]
    except ValueError:
        return None
    return FOLDER_MARKERS.get(folder)


#: Markers whose tests share one pytest-xdist worker, the group :data:`HOST_GROUP` (``make
#: test`` runs ``-n TEST_WORKERS --dist loadgroup``): the image is built once per worker
#: session and its working container mounted once, and the cluster in a box owns host-wide
#: names (network namespaces, nftables tables). ``docs/development/testing.md`` says more.
HOST_MARKERS = ("image", "box")
HOST_GROUP = "image"


def serial_group(item: pytest.Item) -> str | None:
    """Give the pytest-xdist group a test must run in, if any.

    Args:
        item: the collected test.

    Returns:
        :data:`HOST_GROUP` for a test of :data:`HOST_MARKERS` or one that uses the built
        image (``image_root``), else ``None`` (any worker).
    """
    if "image_root" in getattr(item, "fixturenames", ()) or any(
        item.get_closest_marker(m) is not None for m in HOST_MARKERS
    ):
        return HOST_GROUP
    return None


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects on the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Add to each collected test the marker of its folder (:data:`FOLDER_MARKERS`) and the
    pytest-xdist group it must run in (:func:`serial_group`, or the ``xdist_group`` its module
    names: tests/e2e/test_team_network.py shares one pair of network namespaces among its tests).

    Args:
        config: pytest's configuration.
        items: the collected tests.
    """
    for item in items:
        marker = folder_marker(item.path)
        if marker is not None:
            item.add_marker(marker)
        group = serial_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        else:  # a module's own group (``pytestmark = pytest.mark.xdist_group(...)``)
            own = item.get_closest_marker("xdist_group")
            group = (own.args[0] if own.args else own.kwargs.get("name")) if own else None
            if group is None:
                group = module_group(item)
                if group is not None:
                    item.add_marker(pytest.mark.xdist_group(group))
        if group is not None and getattr(config.option, "loadgroup", False):
            _name_group(item, group)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """With ``FEDTUNE_TEST_TIMELINE=FILE``, append each test's start and end (wall clock),
    worker and the worker's own CPU-seconds during it to FILE as a JSON line: when the suite's
    CPU is idle, which tests were running (``benchmarks/suite_idle.py``), and which tests spend
    the CPU of pytest's own processes (``benchmarks/proc_census.py report --tests``).

    Args:
        item: the test.
        nextitem: the next test (unused).
    """
    path = os.environ.get("FEDTUNE_TEST_TIMELINE")
    started, cpu = time.time(), time.process_time()
    try:
        return (yield)
    finally:
        if path:
            line = {
                "test": item.nodeid,
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                "pid": os.getpid(),
                "start": round(started, 2),
                "end": round(time.time(), 2),
                "cpu_s": round(time.process_time() - cpu, 3),  # the worker's, threads included
            }
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")


def module_group(item: pytest.Item) -> str | None:
    """Give the group that keeps a module's tests on one worker when they share a module fixture.

    ``--dist loadgroup`` hands ungrouped tests to either worker, and each worker sets up a
    module-scoped fixture its tests ask for: a module's cluster, service or killed-and-resumed
    study was made twice in one run (e.g. 82 s and 74 s for the shared-Ray world of
    ``tests/e2e/test_shared_ray_credentials.py``), two of them at once on two cores.

    Args:
        item: the collected test.

    Returns:
        The module's path, for a test that uses a fixture of module scope; else ``None``.
    """
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info is not None else ():
        if any(d.scope == "module" for d in defs):
            return item.path.relative_to(TESTS.parent).as_posix()
    return None


def _name_group(item: pytest.Item, group: str) -> None:
    """Give ``item`` the node id pytest-xdist's ``loadgroup`` schedules by (``<id>@<group>``).

    pytest-xdist 3.8 appends the suffix to ``item._nodeid``, which pytest 9 no longer reads (a
    node keeps its id in ``item._id``): without this every group is split over the workers, and
    each worker built its own cluster in a box (two 106 s and 143 s setups in one run).

    Args:
        item: a test of ``group``.
        group: its xdist group.
    """
    try:
        from _pytest.nodes import coerce_node_id
    except ImportError:  # pytest 8: pytest-xdist's own suffix takes
        return
    if not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")


def quadratic_config(algorithm: str = "fedavg", **overrides) -> dict:
    """A tiny heterogeneous quadratic trial in float64 (exact checks)."""
    cfg = {
        "task": {
            "name": "quadratic",
            "clients": 6,
            "dim": 3,
            "examples": 8,
            "noise": 0.5,
            "L": 4.0,
            "init_scale": 3.0,
            "seed": 1,
        },
        "algorithm": algorithm,
        "train": {
            "rounds": 4,
            "clients_per_round": 3,
            "local_steps": 3,
            "batch_size": 2,
            "eval_every": 2,
            "dtype": "float64",
        },
        "hparams": {},
        "seed": 7,
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


@pytest.fixture
def qconfig():
    return quadratic_config


@pytest.fixture
def collector():
    """Python's cyclic collector on for the test, and after it as before it, nothing frozen:
    for the tests of ``fedtune.tuning.common.start_gc``, whose pause and freeze would
    otherwise outlive them in pytest's process."""
    import gc

    from fedtune.tuning.common import start_gc

    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        start_gc.resume()
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


#: the example project's package (examples/byo): user code that only child processes import
USER_PACKAGE = "fedlab"


@pytest.fixture(autouse=True)
def _user_code_stays_out_of_this_process(request):
    """Fail the test that imports the example's user package into pytest's own process.

    fedtune never imports user code in the process that submits or checks it (the API, the
    CLI's parent); the tests that say so (``test_user_contract``, ``tests/e2e/test_byo_*``) read
    ``sys.modules``, so a leak from any other test would fail them far from its cause."""
    import sys

    before = USER_PACKAGE in sys.modules
    yield
    if not before and USER_PACKAGE in sys.modules:
        for name in [m for m in sys.modules if m.split(".")[0] == USER_PACKAGE]:
            del sys.modules[name]
        pytest.fail(
            f"{request.node.nodeid} imported the user package {USER_PACKAGE!r} into "
            "the test process",
            pytrace=False,
        )
