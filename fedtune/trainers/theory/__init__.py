"""Exact quadratic theory of local-update methods (docs/explanation/algorithms.md §3, §8).

Pure numpy/float64, no torch. Sources: Charles & Konečný 2021, "Convergence and Accuracy Trade-Offs
in Federated Learning and Meta-Learning" (arXiv:2103.05032), and Charles & Konečný 2020, "On the
Outsized Importance of Learning Rates in Local Update Methods" (arXiv:2007.00878).

* :mod:`.instances`  quadratic federated instances (A_i, c_i, p_i) and SPD generators
* :mod:`.surrogate`  Θ, distortion matrices Q_i, eigen-functions φ/ψ/ν, x*(α,γ,Θ), κ
* :mod:`.rates`      ρ for GD / Nesterov / heavy-ball with tuned (η, β); Δ; distance bounds
* :mod:`.frontier`   analytic and simulated (ρ, Δ) Pareto frontiers
* :mod:`.simulate`   vectorised float64 simulation of LocalUpdate (the reference for tests)
* :mod:`.figures`    Figures 1–5, 7–10 of Charles & Konečný 2021 (PNG + CSV + JSON)
* :mod:`.reproduce`  figures plus a pass/fail REPORT.md against the stated numbers
"""

from __future__ import annotations

from fedtune.lazy import lazy_attributes

# each name is imported from its module when first used: importing one module (a task needs
# only .instances) does not import the others (.simulate imports SciPy)
_LAZY = {
    "FIGURES": "figures",
    "FigurePaths": "figures",
    "FigureSpec": "figures",
    "figure_spec": "figures",
    "make_figure": "figures",
    "render": "figures",
    "Frontier": "frontier",
    "FrontierSpec": "frontier",
    "GammaRule": "frontier",
    "Sweep": "frontier",
    "frontier": "frontier",
    "frontier_from_spec": "frontier",
    "log_int_grid": "frontier",
    "maml_cusp": "frontier",
    "resolve_gamma": "frontier",
    "simulated_log_kappa": "frontier",
    "universal_delta": "frontier",
    "QuadraticInstance": "instances",
    "random_instance": "instances",
    "spd_affine_gaussian": "instances",
    "spd_with_spectrum": "instances",
    "two_client_instance": "instances",
    "ServerOpt": "rates",
    "TunedServer": "rates",
    "bound_cor20": "rates",
    "bound_cor22": "rates",
    "bound_lemma5": "rates",
    "bound_thm4": "rates",
    "bound_thm16": "rates",
    "bound_thm17": "rates",
    "bound_thm21": "rates",
    "chi": "rates",
    "delta_eq17": "rates",
    "delta_lemma5": "rates",
    "heterogeneity": "rates",
    "log_q_extremes": "rates",
    "message_variance_bound": "rates",
    "rate": "rates",
    "rate_from_log_kappa": "rates",
    "tuned_server": "rates",
    "Report": "reproduce",
    "ReportRow": "reproduce",
    "checks": "reproduce",
    "reproduce": "reproduce",
    "ContinuumExample": "simulate",
    "InstancePool": "simulate",
    "LocalUpdateConfig": "simulate",
    "NesterovForm": "simulate",
    "SimulationResult": "simulate",
    "Thm27Schedule": "simulate",
    "Thm29Schedule": "simulate",
    "client_messages": "simulate",
    "simulate": "simulate",
    "SurrogateSpectrum": "surrogate",
    "Theta": "surrogate",
    "ThetaFamily": "surrogate",
    "check_client_lr": "surrogate",
    "check_problem": "surrogate",
    "distortion_matrices": "surrogate",
    "kappa_closed_form": "surrogate",
    "log_kappa_closed_form": "surrogate",
    "log_nu": "surrogate",
    "log_q": "surrogate",
    "nu": "surrogate",
    "phi": "surrogate",
    "psi": "surrogate",
    "q_eigen": "surrogate",
    "surrogate_gap": "surrogate",
    "surrogate_minimizer": "surrogate",
    "surrogate_spectrum": "surrogate",
    "theta_from_coeffs": "surrogate",
    "theta_last": "surrogate",
    "theta_maml": "surrogate",
    "theta_sum": "surrogate",
}
__all__ = sorted(_LAZY)


__getattr__ = lazy_attributes(__name__, _LAZY)
