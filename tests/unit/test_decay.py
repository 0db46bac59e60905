"""LocalUpdateDecay controller (docs/explanation/algorithms.md §2) and its use in the engine."""

from __future__ import annotations

import itertools

import pytest

from fedtune.errors import ConfigError
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


# ------------------------------------------------------------ paper vs reference semantics
# The paper's eq. 25 (Charles & Konečný 2020 (arXiv:2007.00878)) against the TFF
# research code (google-research/federated adaptive_lr_decay/callbacks.py ReduceLROnPlateau). Every
# sequence below separates the two; each asserts the exact decay rounds (1-based) under both.


def decay_rounds(seq, semantics, base_rates=(1.0, 1.0), **kw):
    """Rounds at which a rate decayed, and the (γ, η) in force after the last round."""
    c = DecayController(
        DecayConfig(**{"enabled": True, "semantics": semantics, **kw}), base_rates=base_rates
    )
    rounds = [t + 1 for t, v in enumerate(seq) if c.observe(v)]
    return rounds, (base_rates[0] * c.client_scale, base_rates[1] * c.server_scale)


def test_keras_best_slow_descent_never_decays_in_reference():
    """A loss falling by 1e-5 per round (< Δ = 1e-4), paper defaults W = P = C = 100: the running
    minimum moves every round, so each round is a plateau (decay at 200/400/600); the reference's
    ``best`` only moves by more than Δ (every 11 rounds), so ``wait`` never reaches 100."""
    seq = [1.0 - 1e-5 * t for t in range(700)]
    assert decay_rounds(seq, "paper")[0] == [200, 400, 600]
    assert decay_rounds(seq, "reference")[0] == []


def test_reference_cooldown_blocks_c_minus_one_rounds():
    """Constant loss, defaults: first decay at 200 in both (cooldown 100, window 100, patience
    100); afterwards the paper skips C full rounds (400, 600), the reference C − 1 (399, 598)."""
    seq = [1.0] * 700
    assert decay_rounds(seq, "paper")[0] == [200, 400, 600]
    assert decay_rounds(seq, "reference")[0] == [200, 399, 598]
    small = {"window": 1, "patience": 1, "cooldown": 2, "threshold": 1.0}
    assert decay_rounds([1.0] * 12, "paper", **small)[0] == [3, 6, 9, 12]
    assert decay_rounds([1.0] * 12, "reference", **small)[0] == [2, 4, 6, 8, 10, 12]


def test_reference_decays_at_an_exact_tie_with_the_margin():
    """ℓ̂ = best − Δ exactly: progress for eq. 25 (plateau needs >), no improvement for the
    reference (improvement needs <). Values are exact in binary floating point."""
    seq, kw = [1.0, 0.75, 0.5, 0.25], {"window": 1, "patience": 1, "cooldown": 0, "threshold": 0.25}
    assert decay_rounds(seq, "paper", **kw)[0] == []
    # reference: best 1.0 (r1); 0.75 ties → decay (r2); 0.5 < 0.75 → best 0.5; 0.25 ties → decay
    assert decay_rounds(seq, "reference", **kw)[0] == [2, 4]


def test_reference_can_decay_on_a_window_padded_with_inf():
    """W = 3 with a cooldown C < W: the reference's window starts as [inf] * W, its mean is inf
    (no improvement on best = inf) and counts from round C on; the paper waits for W losses."""
    seq = [3.0, 2.0, 1.0, 0.5, 0.25, 0.125]
    for cooldown, want in ((0, [1, 2]), (1, [1, 2]), (2, [2]), (3, [])):
        kw = {"window": 3, "patience": 1, "cooldown": cooldown, "threshold": 1e-4}
        assert decay_rounds(seq, "paper", **kw)[0] == []
        assert decay_rounds(seq, "reference", **kw)[0] == want, cooldown


def test_maximize_mode_in_both_semantics():
    """``mode: max`` (e.g. accuracy): plateau when the value stops growing by Δ."""
    kw = {"window": 1, "patience": 1, "cooldown": 0, "threshold": 0.01}
    acc = [0.1, 0.2, 0.3, 0.3, 0.35, 0.35]
    assert decay_rounds(acc, "paper", mode="max", **kw)[0] == [4, 6]
    assert decay_rounds(acc, "reference", mode="max", **kw)[0] == [4, 6]
    assert decay_rounds(acc, "paper", mode="min", **kw)[0] == [2, 3, 4, 5, 6]
    # the reference starts a maximised metric at best = 0.0 (window padded with 0.0): a
    # negative metric that grows never "improves" there and decays every round
    neg = [-5.0, -4.0, -3.0, -2.0]
    assert decay_rounds(neg, "paper", mode="max", **kw)[0] == []
    assert decay_rounds(neg, "reference", mode="max", **kw)[0] == [1, 2, 3, 4]


def test_min_lr_in_both_semantics():
    """γ, η start at 1; factors 0.1 and 0.5; min_lr 0.05; constant loss, W = P = 1, C = 2.
    Paper: one shared event (rounds 3, 6, 9, …); γ stops at 0.05 after two, η after five.
    Reference: each rate its own machine; the one at min_lr no longer decays (nor restarts its
    cooldown) while the other continues."""
    kw = {"window": 1, "patience": 1, "cooldown": 2, "threshold": 1e-4, "server_decay": 0.5}
    seq = [1.0] * 20
    rounds, rates = decay_rounds(seq, "paper", min_lr=0.05, **kw)
    assert rounds == [3, 6, 9, 12, 15] and rates == pytest.approx((0.05, 0.05))
    rounds, rates = decay_rounds(seq, "reference", min_lr=0.05, **kw)
    assert rounds == [2, 4, 6, 8, 10] and rates == pytest.approx((0.05, 0.05))
    c = DecayController(DecayConfig(enabled=True, semantics="reference", min_lr=0.05, **kw))
    gammas = []
    for v in seq[:6]:
        c.observe(v)
        gammas.append(c.client_scale)
    assert gammas == pytest.approx([1.0, 0.1, 0.1, 0.05, 0.05, 0.05])
    assert c.server_scale == pytest.approx(0.125)  # 1 → 0.5 (r2) → 0.25 (r4) → 0.125 (r6)
    with pytest.raises(ConfigError, match=r"decay\.min_lr"):
        DecayController(DecayConfig(enabled=True, min_lr=0.5), base_rates=(0.1, 1.0))


def test_patience_zero_acts_as_one_in_both_semantics():
    seq, kw = [5.0, 4.0, 4.0, 3.0, 3.0], {"window": 1, "cooldown": 0, "threshold": 1e-4}
    for semantics in ("paper", "reference"):
        zero = decay_rounds(seq, semantics, patience=0, **kw)[0]
        assert zero == decay_rounds(seq, semantics, patience=1, **kw)[0] == [3, 5]


def test_semantics_fields_are_validated_with_dotted_names():
    from fedtune.trainers import parse_trial_config

    base = {"task": {"name": "quadratic"}, "algorithm": "fedavg"}
    bad = [
        ({"semantics": "tff"}, "decay.semantics"),
        ({"mode": "up"}, "decay.mode"),
        ({"min_lr": -1.0}, "decay.min_lr"),
        ({"patience": -1}, "decay.patience"),
        ({"semantics": "reference", "reset_min_after_decay": True}, "decay.reset_min_after_decay"),
    ]
    for decay, field in bad:
        with pytest.raises(ConfigError) as err:
            parse_trial_config({**base, "decay": {"enabled": True, **decay}})
        assert err.value.field == field


def test_engine_applies_each_semantics_from_the_next_round():
    """Through the Trainer: the rates recorded each round change one round after each decay
    round of the controller (paper 3, 6, 9; reference 2, 4, 6, 8, 10)."""
    changes = {}
    for semantics in ("paper", "reference"):
        cfg = quadratic_config(
            "fedavg",
            hparams={"client_lr": 0.05, "server_lr": 1e-6},
            train={"rounds": 12},
            decay={
                "enabled": True,
                "semantics": semantics,
                "window": 1,
                "patience": 1,
                "cooldown": 2,
                "threshold": 100.0,
            },  # every round a plateau
        )
        t = Trainer(cfg)
        while not t.done:
            t.step()
        recs = t.records
        changes[semantics] = [
            b.round for a, b in itertools.pairwise(recs) if b.client_lr != a.client_lr
        ]
    assert changes == {"paper": [4, 7, 10], "reference": [3, 5, 7, 9, 11]}


def test_reference_state_roundtrip():
    kw = {"enabled": True, "semantics": "reference", "window": 3, "patience": 2, "cooldown": 1}
    c, d = DecayController(DecayConfig(**kw)), DecayController(DecayConfig(**kw))
    for v in (3.0, 2.0, 2.0, 2.0, 2.0):
        c.observe(v)
    d.load_state_dict(c.state_dict())
    tail = [2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert [c.observe(v) for v in tail] == [d.observe(v) for v in tail]
    assert c.state_dict() == d.state_dict()


def test_the_default_is_the_paper_rule_and_the_reference_recipe_is_valid():
    """A user gets the paper's rule by default; the reference code's recipe (its flag
    defaults) is a valid decay section and behaves as the reference code."""
    from fedtune.trainers import parse_trial_config

    assert DecayConfig().semantics == "paper"
    decay = {
        "enabled": True,
        "semantics": "reference",
        "window": 100,
        "patience": 100,
        "cooldown": 100,
        "threshold": 1.0e-4,
        "client_decay": 0.1,
        "server_decay": 0.9,
        "min_lr": 0,
    }
    cfg = parse_trial_config({"task": {"name": "quadratic"}, "algorithm": "fedavg", "decay": decay})
    assert cfg.decay.semantics == "reference" and cfg.decay.enabled
    # the TFF research code's flag defaults: window = patience = cooldown = 100, Δ = 1e-4
    assert (cfg.decay.window, cfg.decay.patience, cfg.decay.cooldown) == (100, 100, 100)
    assert (cfg.decay.threshold, cfg.decay.client_decay, cfg.decay.server_decay) == (1e-4, 0.1, 0.9)
    # and the recipe behaves as the reference code: no decay for a loss falling 1e-5 per round
    slow = [1.0 - 1e-5 * t for t in range(700)]
    c = DecayController(cfg.decay)
    assert not any(c.observe(v) for v in slow)
