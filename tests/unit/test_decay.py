"""LocalUpdateDecay controller (ALGORITHMS.md §2) and its use in the engine."""

from __future__ import annotations

import pytest

from fedtune.trainers import DecayConfig, Trainer
from fedtune.trainers.decay import DecayController
from tests.conftest import quadratic_config


def ctl(**kw) -> DecayController:
    base = {"enabled": True, "window": 1, "patience": 1, "cooldown": 0, "threshold": 1e-4}
    return DecayController(DecayConfig(**{**base, **kw}))


def test_base_algorithm_decays_on_first_non_improving_round():
    c = ctl()
    assert [c.observe(v) for v in (5.0, 4.0, 3.0)] == [False, False, False]
    assert c.observe(3.0) is True  # 3.0 > min(5, 4, 3) − Δ
    assert (c.client_scale, c.server_scale) == pytest.approx((0.1, 0.9))


def test_steady_progress_never_decays():
    c = ctl(window=3, patience=2, cooldown=3)
    assert not any(c.observe(10.0 - 0.1 * t) for t in range(50))
    assert c.decays == 0


def test_patience_needs_consecutive_plateaus_and_resets():
    c = ctl(patience=3)
    seq = [5.0, 5.0, 5.0, 4.0, 4.0, 4.0, 4.0]  # plateau 2, progress resets, plateau 3 → decay
    out = [c.observe(v) for v in seq]
    assert out == [False, False, False, False, False, False, True]


def test_startup_cooldown_and_cooldown_after_decay():
    c = ctl(cooldown=4)
    out = [c.observe(1.0) for _ in range(12)]
    # rounds 1–4: start-up cooldown; round 5 is the first test → patience 1 → decay;
    # rounds 6–9 cooldown; round 10 decays again
    assert [i + 1 for i, d in enumerate(out) if d] == [5, 10]
    assert c.decays == 2


def test_window_smooths_noise():
    noisy = [1.0 if t % 2 else 1.3 for t in range(40)]
    trend = [v - 0.02 * t for t, v in enumerate(noisy)]
    c1, c2 = ctl(window=1), ctl(window=2)
    d1 = sum(c1.observe(v) for v in trend)
    d2 = sum(c2.observe(v) for v in trend)
    assert d1 > 0 and d2 == 0


def test_disabled_never_decays():
    c = DecayController(DecayConfig(enabled=False))
    assert not any(c.observe(1.0) for _ in range(500))


def test_state_roundtrip():
    c = ctl(window=3, patience=2, cooldown=2)
    for v in (3.0, 2.0, 2.0, 2.0, 2.0):
        c.observe(v)
    d = ctl(window=3, patience=2, cooldown=2)
    d.load_state_dict(c.state_dict())
    tail = [2.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    assert [c.observe(v) for v in tail] == [d.observe(v) for v in tail]


def test_engine_records_rates_in_force():
    cfg = quadratic_config(
        "fedavg",
        hparams={"client_lr": 0.05, "server_lr": 1e-6},
        train={"rounds": 12},
        decay={"enabled": True, "window": 1, "patience": 1, "cooldown": 2, "threshold": 1.0},
    )
    t = Trainer(cfg)
    while not t.done:
        t.step()
    lrs = [(r.client_lr, r.server_lr) for r in t.records]
    assert lrs[0] == pytest.approx((0.05, 1e-6))
    assert t.decay.decays >= 2
    changes = [i for i in range(1, len(lrs)) if lrs[i] != lrs[i - 1]]
    assert lrs[changes[0]] == pytest.approx((0.005, 0.9e-6))
