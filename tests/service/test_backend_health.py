"""The backend's health: one log line per change of state, probes when stale (a replica that
does not lead the scheduler), and the scheduler claims nothing while the backend is down."""

from __future__ import annotations

import logging

from fedtune.errors import BackendError
from fedtune.service.backend_health import BackendHealth, unusable_reason
from fedtune.service.backends.base import BackendAuthError, BackendUnreachableError
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, submit_study

from .helpers import FakeBackend, tiny_spec


class _Flaky(FakeBackend):
    """A fake backend whose ``check``/``launch`` raise ``self.error`` while it is set."""

    def __init__(self) -> None:
        super().__init__()
        self.error: BackendError | None = None
        self.checks = 0

    def check(self) -> None:
        self.checks += 1
        if self.error is not None:
            raise self.error

    def launch(self, request):
        if self.error is not None:
            raise self.error
        return super().launch(request)


def test_changes_of_state_are_logged_once(caplog) -> None:
    now = [0.0]
    backend = _Flaky()
    health = BackendHealth(backend, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="fedtune.service.backend_health"):
        assert health.current().up is True and backend.checks == 1
        assert health.current().up is True and backend.checks == 1  # fresh: no probe
        backend.error = BackendAuthError("answered 401 (RAY_AUTH_TOKEN is not set)")
        now[0] = 31.0
        assert health.current().up is False and backend.checks == 2  # stale: probed
        for _ in range(5):
            health.probe()
            health.failed(BackendAuthError("Authentication required: Unauthorized"))  # reworded
        backend.error = BackendUnreachableError("connection refused")
        health.probe()
        backend.error = None
        health.probe()
        health.probe()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "backend 'local' unusable",
        "backend 'local' unusable",
        "backend 'local' usable again",
    ]
    assert "authentication failed" in caplog.records[0].getMessage()
    assert "unreachable" in caplog.records[1].getMessage()


def test_only_auth_and_unreachable_errors_make_the_backend_down() -> None:
    assert unusable_reason(BackendAuthError("403\n\ndetails")) == "authentication failed: 403"
    assert unusable_reason(BackendUnreachableError("refused")) == "unreachable: refused"
    assert unusable_reason(BackendError("RayJob x exists and is not this study's")) is None


def test_while_the_backend_is_down_no_study_is_claimed(database, make_settings) -> None:
    ctx = ServiceContext(database, make_settings(database_url=database.url, backend="local"))
    backend = _Flaky()
    backend.error = BackendAuthError("answered 403 (RAY_AUTH_TOKEN refused)")
    now = [0.0]
    scheduler = Scheduler(ctx.db, backend, ctx.settings, clock=lambda: now[0])
    sids = [submit_study(ctx, tiny_spec(name=f"s{i}"))[0].id for i in range(2)]
    for _ in range(3):
        now[0] += 100.0  # past the backoff
        assert scheduler.tick().dispatched == []
    assert backend.launched == []
    with ctx.db.session(readonly=True) as s:
        studies = [Repository(s).require_study(sid) for sid in sids]
    for study in studies:
        assert (str(study.state), study.attempts) == ("queued", 0)
        assert study.queued_reason == (
            "backend 'local' unusable: authentication failed: answered 403 (RAY_AUTH_TOKEN refused)"
        )
    backend.error = None
    now[0] += 100.0
    assert sorted(scheduler.tick().dispatched) == sorted(sids)


def test_a_slow_backend_never_holds_a_reader_past_its_wait() -> None:
    """``/readyz`` has a probe timeout of its own: a backend slow to answer is not waited for."""
    import threading
    import time

    release = threading.Event()

    class _Slow(FakeBackend):
        def check(self) -> None:
            release.wait(10)
            raise BackendUnreachableError("connect timeout")

    health = BackendHealth(_Slow())
    started = time.monotonic()
    assert health.current(wait_s=0.2).up is None  # not known yet: answered at once
    assert time.monotonic() - started < 2.0
    release.set()
    assert health.current(wait_s=5.0).up is False  # the same probe's result, once it lands
    assert health.state.reason == "unreachable: connect timeout"
