"""Unit tests of the quadratic theory formulas (fedtune.trainers.theory).

Closed forms are compared with the defining sums / explicit matrices, and invalid settings must
raise ConfigError naming the violated condition (docs/explanation/algorithms.md §3.2–3.7).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedtune.cli import main as cli_main
from fedtune.errors import ConfigError
from fedtune.trainers.theory import (
    LocalUpdateConfig,
    QuadraticInstance,
    ReportRow,
    ServerOpt,
    ThetaFamily,
    checks,
    client_messages,
    delta_eq17,
    delta_lemma5,
    distortion_matrices,
    frontier,
    kappa_closed_form,
    log_int_grid,
    log_kappa_closed_form,
    log_q,
    log_q_extremes,
    phi,
    psi,
    q_eigen,
    random_instance,
    rate,
    rate_from_log_kappa,
    simulate,
    surrogate_minimizer,
    surrogate_spectrum,
    theta_from_coeffs,
    theta_last,
    theta_maml,
    theta_sum,
    tuned_server,
    two_client_instance,
    universal_delta,
)
from tests.images import assert_plot_png


def _explicit_q(z, coeffs):
    return sum(c * (1.0 - z) ** k for k, c in enumerate(coeffs))


@pytest.fixture
def inst() -> QuadraticInstance:
    return random_instance(6, 4, 1.0, 8.0, np.random.default_rng(0))


# ----------------------------------------------------------------------------- Θ


def test_theta_presets_and_coefficients():
    np.testing.assert_array_equal(theta_sum(3).coeffs, [1, 1, 1])
    np.testing.assert_array_equal(theta_last(3).coeffs, [0, 0, 1])
    assert theta_maml(2) == theta_last(5)
    assert theta_sum(4).total_weight == 4 and theta_last(4).total_weight == 1
    assert theta_from_coeffs([1, 1, 0, 0]) == theta_sum(2)
    assert theta_from_coeffs([0, 0, 1, 0]) == theta_last(3)
    general = theta_from_coeffs([0.5, 0, 2.0])
    assert general.family is ThetaFamily.GENERAL and general.K == 3


@pytest.mark.parametrize("coeffs", [[], [0, 0], [1, -1], [np.nan]])
def test_theta_invalid_coefficients(coeffs):
    with pytest.raises(ConfigError) as exc:
        theta_from_coeffs(coeffs)
    assert exc.value.field == "theta"


def test_theta_invalid_K():
    with pytest.raises(ConfigError, match="local_steps"):
        theta_sum(0)


# ----------------------------------------------------------------------------- eigen-functions


@pytest.mark.parametrize(
    "theta", [theta_sum(7), theta_last(7), theta_from_coeffs([0.3, 0, 1.2, 0.5])]
)
def test_q_closed_forms_match_defining_sum(theta):
    z = np.array([0.0, 1e-9, 0.01, 0.3, 0.99, 1.0, 1.4, 1.9])
    np.testing.assert_allclose(
        q_eigen(z, theta), _explicit_q(z, theta.coeffs), rtol=1e-12, atol=1e-14
    )
    zs = z[z < 1]
    np.testing.assert_allclose(log_q(zs, theta), np.log(_explicit_q(zs, theta.coeffs)), atol=1e-12)


def test_phi_psi_match_eigenvalues_of_explicit_QA():
    lam, alpha, gamma, K = np.array([1.0, 2.5, 7.0]), 0.4, 0.05, 9
    A = np.diag(lam)
    for theta, closed in ((theta_sum(K), phi), (theta_last(K), psi)):
        Q = distortion_matrices(A, alpha, gamma, theta, method="power")
        np.testing.assert_allclose(np.diag(Q @ A), closed(lam, alpha, gamma, K), rtol=1e-12)
    assert phi(3.0, 0.0, 0.0, 5) == pytest.approx(15.0)  # φ = Kλ at γ = 0
    k_sum = kappa_closed_form(1.0, 7.0, alpha, gamma, "sum", K)
    k_last = kappa_closed_form(1.0, 7.0, alpha, gamma, "last", 2)
    assert k_sum == pytest.approx(phi(7.0, alpha, gamma, K) / phi(1.0, alpha, gamma, K))
    assert k_last == pytest.approx(psi(7.0, alpha, gamma, 2) / psi(1.0, alpha, gamma, 2))


def test_log_space_for_million_steps():
    K, gamma = 10**6, 0.001
    assert np.isfinite(phi(10.0, 0.0, gamma, K)) and phi(10.0, 0.0, gamma, K) == pytest.approx(
        1 / gamma
    )
    assert psi(10.0, 0.0, gamma, K) == 0.0  # underflows …
    lq = log_q(gamma * 10.0, theta_last(K))  # … but its log does not
    assert lq == pytest.approx((K - 1) * np.log1p(-0.01), rel=1e-14)
    lk = log_kappa_closed_form(1.0, 10.0, 0.0, 1e-7, "last", 10**6 - 1)
    assert np.isfinite(lk) and 0 < lk < np.log(10)


def test_distortion_matrices_eig_equals_power(inst):
    theta = theta_from_coeffs([1.0, 0.2, 0.0, 0.7])
    Qe = distortion_matrices(inst.A, 0.3, 0.07, theta)
    Qp = distortion_matrices(inst.A, 0.3, 0.07, theta, method="power")
    np.testing.assert_allclose(Qe, Qp, atol=1e-12)
    # Q_i commutes with A_i, so Q_i A_i is symmetric (Lemma 9)
    QA = Qe @ inst.A
    np.testing.assert_allclose(QA, np.swapaxes(QA, 1, 2), atol=1e-12)


# ----------------------------------------------------------------------------- x*(α,γ,Θ), κ


def test_surrogate_minimizer_matches_explicit_solve(inst):
    theta, alpha, gamma = theta_from_coeffs([0.5, 1.0, 0.0, 2.0]), 0.2, 0.06
    Q = distortion_matrices(inst.A, alpha, gamma, theta, method="power")
    H = np.einsum("i,ijk->jk", inst.p, Q @ inst.A)
    b = np.einsum("i,ijk,ik->j", inst.p, Q @ inst.A, inst.c)
    np.testing.assert_allclose(
        surrogate_minimizer(inst, alpha, gamma, theta), np.linalg.solve(H, b), atol=1e-12
    )


def test_surrogate_minimizer_equals_x_star_without_distortion(inst):
    x_star = inst.x_star()
    for alpha, gamma, theta in (
        (0.0, 0.0, theta_sum(9)),
        (0.5, 0.1, theta_sum(1)),
        (0.0, 0.1, theta_last(1)),
    ):
        np.testing.assert_allclose(
            surrogate_minimizer(inst, alpha, gamma, theta), x_star, atol=1e-12
        )
    assert np.linalg.norm(surrogate_minimizer(inst, 0.0, 0.1, theta_sum(5)) - x_star) > 1e-3


def test_surrogate_minimizer_does_not_underflow_for_huge_K(inst):
    gamma = 0.5 / inst.L
    x = surrogate_minimizer(inst, 0.0, gamma, theta_last(10**6))
    assert np.all(np.isfinite(x))


def test_client_lr_condition_is_enforced(inst):
    gamma = 1.0 / inst.L
    with pytest.raises(ConfigError, match=r"client_lr must be < 1/\(L\+alpha\) = "):
        surrogate_minimizer(inst, 0.0, gamma, theta_sum(3))
    with pytest.raises(ConfigError, match=r"1/\(L\+alpha\) = 0\.0909"):
        log_kappa_closed_form(1.0, 10.0, 1.0, 0.1, "sum", 5)
    with pytest.raises(ConfigError, match=r"client_lr must be < 1/\(K\*L\+alpha\) = "):
        log_kappa_closed_form(1.0, 10.0, 0.0, 0.01, "last", 20)
    with pytest.raises(ConfigError, match="client_lr"):
        surrogate_minimizer(inst, 0.0, -0.1, theta_sum(3))


def test_non_strict_minimizer_beyond_one_over_L():
    """Charles & Konečný 2020 (arXiv:2007.00878) §4: Θ_{1:2} is PD up to γ = 6/5; beyond it there is
    no minimiser."""
    two = two_client_instance()
    for g in (0.7, 1.1):
        x = surrogate_minimizer(two, 0.0, g, theta_sum(2), strict=False)[0]
        assert x == pytest.approx((4 - 3 * g) / (6 - 5 * g), abs=1e-12)
    with pytest.raises(ConfigError, match="not positive definite"):
        surrogate_minimizer(two, 0.0, 1.3, theta_sum(2), strict=False)


@pytest.mark.parametrize("theta", [theta_sum(6), theta_last(4), theta_from_coeffs([1, 0, 3])])
def test_spectrum_eig_equals_matrix(inst, theta):
    a = surrogate_spectrum(inst, 0.2, 0.03, theta)
    b = surrogate_spectrum(inst, 0.2, 0.03, theta, method="matrix")
    assert a.L_tilde == pytest.approx(b.L_tilde, rel=1e-10)
    assert a.mu_tilde == pytest.approx(b.mu_tilde, rel=1e-10)


def test_closed_form_kappa_tight_on_diagonal_client():
    mu, L, alpha, gamma = 1.0, 10.0, 0.5, 0.02
    one = QuadraticInstance(np.diag([L, mu])[None], np.zeros((1, 2)), np.ones(1))
    for family, K in (("sum", 13), ("last", 4)):
        theta = theta_sum(K) if family == "sum" else theta_last(K)
        explicit = surrogate_spectrum(one, alpha, gamma, theta, method="matrix").log_kappa
        assert log_kappa_closed_form(mu, L, alpha, gamma, family, K) == pytest.approx(
            explicit, abs=1e-12
        )


def test_problem_validation():
    with pytest.raises(ConfigError, match="mu"):
        log_kappa_closed_form(0.0, 1.0, 0.0, 0.1, "sum", 2)
    with pytest.raises(ConfigError, match="L"):
        log_kappa_closed_form(2.0, 1.0, 0.0, 0.1, "sum", 2)
    with pytest.raises(ConfigError, match="prox_alpha"):
        log_kappa_closed_form(1.0, 2.0, -1.0, 0.1, "sum", 2)


# ----------------------------------------------------------------------------- rates and Δ


def test_rate_identities():
    k = np.array([1.0, 2.0, 10.0, 1e4])
    np.testing.assert_allclose(rate(k, "gd"), (k - 1) / (k + 1), atol=1e-15)
    np.testing.assert_allclose(
        rate(k, "heavy_ball"), (np.sqrt(k) - 1) / (np.sqrt(k) + 1), atol=1e-15
    )
    np.testing.assert_allclose(rate(k, "nesterov"), 1 - 2 / np.sqrt(3 * k + 1), atol=1e-15)
    assert np.all(rate_from_log_kappa([1e4, np.inf], "nesterov") == 1.0)
    with pytest.raises(ConfigError):
        rate(0.5, "gd")
    with pytest.raises(ValueError):
        rate(2.0, "adam")


@pytest.mark.parametrize("opt", list(ServerOpt))
def test_tuned_server_attains_rate(opt):
    """Spectral radius of the tuned linear iteration, max over λ ∈ [μ̃, L̃], equals ρ(κ)."""
    mu, L = 0.7, 9.1
    ts = tuned_server(mu, L, opt)
    eta, beta = ts.server_lr, ts.server_momentum
    radii = []
    for lam in np.linspace(mu, L, 801):
        if opt is ServerOpt.NESTEROV:
            M = [[(1 + beta) * (1 - eta * lam), -beta * (1 - eta * lam)], [1, 0]]
        else:
            M = [[1 + beta - eta * lam, -beta], [1, 0]]
        radii.append(np.abs(np.linalg.eigvals(np.array(M))).max())
    assert max(radii) == pytest.approx(ts.rate, rel=1e-6)
    assert ts.rate == pytest.approx(float(rate(L / mu, opt)))


def test_delta_forms():
    assert delta_eq17(0.0, np.log(10)) == pytest.approx((np.sqrt(10) - 1) / (np.sqrt(10) + 1))
    assert delta_eq17(np.log(10), np.log(10)) == 0.0
    assert delta_eq17(np.log(20), np.log(10)) < 0  # eq. (17) goes negative past κ₀
    assert delta_lemma5(np.log(4.0), 0.0) == pytest.approx(1 / 3)


def test_lemma5_equals_eq17_in_analytic_regime():
    """b/a = κ₀/κ when the spectrum ends are attained (§3.11)."""
    mu, L, gamma, K = 1.0, 10.0, 0.01, 30
    one = QuadraticInstance(np.diag([mu, 4.0, L])[None], np.zeros((1, 3)), np.ones(1))
    log_b, log_a = log_q_extremes(one, 0.0, gamma, theta_sum(K))
    lk = log_kappa_closed_form(mu, L, 0.0, gamma, "sum", K)
    assert delta_lemma5(log_b, log_a) == pytest.approx(delta_eq17(lk, np.log(L / mu)), abs=1e-14)


# ----------------------------------------------------------------------------- frontiers


def test_frontier_points_and_universal_curve():
    f = frontier(
        1, 10, 0, "sum", "K", log_int_grid(1, 10**6, 50), gamma="half-L", server_opt="nesterov"
    )
    pts = f.points()
    assert pts.shape == (f.param.size, 4)
    assert pts[0, 1] == pytest.approx(10.0) and pts[0, 3] == pytest.approx(0.0, abs=1e-15)
    np.testing.assert_allclose(universal_delta(f.rho, np.log(10), "nesterov"), f.delta, atol=1e-9)
    json.dumps(f.rows(), allow_nan=False)


def test_frontier_alpha_and_gamma_sweeps():
    alphas = [0.0, 0.5, 1.0, 5.0]
    f = frontier(1, 10, 0, "sum", "alpha", alphas, gamma="half-L", K=10**6)
    np.testing.assert_allclose(f.gamma, 0.5 / (10 + np.array(alphas)))
    np.testing.assert_allclose(
        f.kappa, 10 * (1 + np.array(alphas)) / (10 + np.array(alphas)), rtol=1e-12
    )
    g = frontier(1, 10, 0, "sum", "gamma", [1e-6, 0.05, 0.099], K=100)
    assert g.kappa[0] == pytest.approx(10, rel=1e-3) and np.all(np.diff(g.kappa) < 0)
    maml = frontier(1, 10, 0, "last", "K", [1, 10, 1000], gamma="half-KL")
    np.testing.assert_allclose(maml.gamma, 1 / (20 * np.array([1, 10, 1000])))


def test_frontier_config_errors():
    with pytest.raises(ConfigError, match="K"):
        frontier(1, 10, 0, "sum", "gamma", [0.01, 0.02])
    with pytest.raises(ConfigError, match="integers"):
        frontier(1, 10, 0, "sum", "K", [1.5], gamma=0.01)
    with pytest.raises(ConfigError, match="frontier"):
        frontier(1, 10, 0, "median", "K", [1], gamma=0.01)
    with pytest.raises(ConfigError, match=r"1/\(K\*L\+alpha\)"):
        frontier(1, 10, 0, "last", "K", [1, 200], gamma=0.001)
    kept = frontier(1, 10, 0, "last", "K", [1, 50, 200], gamma=0.001, drop_invalid=True)
    np.testing.assert_array_equal(kept.K, [1, 50])
    with pytest.raises(ConfigError, match=r"1/\(L\+alpha\)"):
        frontier(1, 10, 0, "last", "K", [5], gamma=0.2, simulated=True)


# ----------------------------------------------------------------------------- simulator


def test_deterministic_client_message_is_Q_A_grad(inst):
    """Theorem 1 (no noise): q_i = Q_i A_i (x − c_i) exactly, with prox α and a general Θ."""
    theta, alpha, gamma = theta_from_coeffs([0.2, 1.0, 0.0, 0.5, 1.5]), 0.3, 0.05
    x = np.random.default_rng(1).standard_normal((1, inst.dim))
    msg = client_messages(inst.A, inst.c, x, alpha, gamma, theta.coeffs, 0.0, None)[0]
    Q = distortion_matrices(inst.A, alpha, gamma, theta)
    np.testing.assert_allclose(msg, np.einsum("ijk,ik->ij", Q @ inst.A, x - inst.c), atol=1e-12)


def test_simulation_config_validation(inst):
    with pytest.raises(ConfigError, match="server_lr"):
        LocalUpdateConfig(theta_sum(2), 0.1, 0.0)
    with pytest.raises(ConfigError, match="server_opt"):
        LocalUpdateConfig(theta_sum(2), 0.1, 0.1, server_opt="sgdx")
    with pytest.raises(ConfigError, match="rng"):
        simulate(
            inst, LocalUpdateConfig(theta_sum(2), 0.1, 0.1, clients_per_round=2), np.zeros(4), 3
        )


def test_nesterov_forms_reach_the_same_point(inst):
    theta, gamma = theta_sum(4), 0.3 / inst.L
    target = surrogate_minimizer(inst, 0.0, gamma, theta)
    for form in ("theory", "keras"):
        cfg = LocalUpdateConfig(
            theta, gamma, 0.02, server_opt="nesterov", server_momentum=0.8, nesterov_form=form
        )
        x = simulate(inst, cfg, np.zeros(inst.dim), 1500).final[0]
        np.testing.assert_allclose(x, target, atol=1e-10)


# ----------------------------------------------------------------------------- CLI and report


def test_cli_frontier_free_form_and_errors(tmp_path, capsys):
    out = tmp_path / "ff"
    rc = cli_main(
        [
            "frontier",
            "--out",
            str(out),
            "--alpha",
            "0",
            "1",
            "--gamma",
            "0.001",
            "--theta",
            "last",
            "--simulated",
            "--dim",
            "20",
            "--points",
            "30",
            "--server-opt",
            "gd",
            "heavy_ball",
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out.split()
    assert [p.rsplit(".", 1)[1] for p in printed] == ["png", "csv", "json"]
    doc = json.loads((out / "frontier.json").read_text())
    assert [p["title"] for p in doc["panels"]] == ["gd", "heavy_ball"]
    assert len(doc["panels"][0]["curves"]) == 2
    assert cli_main(["frontier", "--out", str(out), "--gamma", "0.5"]) == 2
    assert "client_lr must be < 1/(L+alpha)" in capsys.readouterr().err
    assert cli_main(["frontier", "--out", str(out), "--sweep", "gamma"]) == 2
    assert cli_main(["frontier", "--out", str(out), "--figure", "6"]) == 2


def test_cli_frontier_documented_command_accepts_scientific_notation(tmp_path, capsys):
    """The documented ``--K-range 1 1e6`` command (README.md or docs/**) runs (issue 13 item 7);
    non-whole numbers are rejected."""
    import re
    import shlex

    from tests.docs.pages import documentation

    text = "\n".join(documentation().values())
    line = re.search(r"fedtune (frontier [^\n]*--K-range[^\n]*)", re.sub(r"\\\n\s*", " ", text))
    assert line, "no page shows the --K-range frontier command any more"
    argv = shlex.split(line.group(1))
    if "--out" in argv:
        argv[argv.index("--out") + 1] = str(tmp_path / "prox")
    else:
        argv += ["--out", str(tmp_path / "prox")]
    assert argv[argv.index("--K-range") + 2] == "1e6"
    assert cli_main(argv) == 0
    doc = json.loads((tmp_path / "prox" / "frontier.json").read_text())
    ks = [p["K"] for p in doc["panels"][0]["curves"][0]["points"]]
    assert ks[0] == 1 and ks[-1] == 10**6
    out = str(tmp_path / "k")
    assert cli_main(["frontier", "--out", out, "--K-range", "1E1", "2.0e3", "--points", "5"]) == 0
    doc = json.loads((tmp_path / "k" / "frontier.json").read_text())
    assert [p["K"] for p in doc["panels"][0]["curves"][0]["points"]][-1] == 2000
    capsys.readouterr()
    for bad in ("1.5", "1e-1", "inf", "ten"):
        with pytest.raises(SystemExit) as exc:
            cli_main(["frontier", "--out", out, "--K-range", "1", bad])
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "--K-range" in err and f"expected a whole number, got {bad!r}" in err


def assert_figure_png(out, stem):
    """The figure is a decodable PNG of 4.2 × 3.8 inches per panel at 100 dpi (figures.py) with
    a drawing in it; the panel count comes from the figure's JSON."""
    panels = json.loads((out / f"{stem}.json").read_text())["panels"]
    assert panels
    assert_plot_png(out / f"{stem}.png", (4.2 * len(panels), 3.8), 100)


def test_cli_frontier_figure(tmp_path, capsys):
    assert cli_main(["frontier", "--figure", "3", "--out", str(tmp_path), "--quick"]) == 0
    assert (tmp_path / "fig3.csv").stat().st_size > 0
    assert_figure_png(tmp_path, "fig3")


@pytest.mark.slow
def test_reproduce_quick_report(tmp_path, capsys):
    """`fedtune reproduce --quick`: every report row passes and every figure file is written."""
    assert cli_main(["reproduce", "--out", str(tmp_path), "--quick"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == str(tmp_path / "REPORT.md")
    rows = [
        ln
        for ln in (tmp_path / "REPORT.md").read_text().splitlines()
        if ln.endswith("PASS |") or ln.endswith("FAIL |")
    ]
    assert len(rows) >= 25 and all(ln.endswith("| PASS |") for ln in rows)
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 10):
        assert (tmp_path / "figures" / f"fig{n}.csv").stat().st_size > 0
        assert_figure_png(tmp_path / "figures", f"fig{n}")


def test_report_rows_fail_when_off():
    row = checks(quick=True)[0]
    assert row.passed
    assert not ReportRow(
        row.check, row.source, row.expected, row.measured + 1.0, row.tolerance
    ).passed
