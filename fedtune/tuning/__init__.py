"""One study end to end: the study spec, the measured trade-off and its figures.

* :class:`StudySpec` — what a user writes (task, algorithm, search space, objective, sampler,
  scheduler, budget, resources, tracking), validated into typed values (``spec``).
* :func:`analyze_tradeoff` — rounds-to-target vs final loss, Pareto set and the lower envelope
  "best loss reachable within R rounds" from the trials' curves (``tradeoff``).
* :func:`write_artifacts` and the ``plot_*`` functions — PNG figures (``plots``).
* :func:`run_study` — run/resume a study with Optuna + Ray Tune + MLflow (``study``); it, the
  other execution names and the figures are imported lazily, so the spec (and a trial process)
  needs no MLflow or matplotlib, and the package itself imports nothing heavy.
"""

from fedtune.lazy import lazy_attributes

# Every name is imported on first use (PEP 562), so importing a light submodule — the
# timeline, the Ray plumbing that ``fedtune tune`` starts before anything else — costs no
# torch: the spec (torch, pydantic), the trade-off (numpy), execution (Optuna + Ray Tune +
# MLflow) and the figures (matplotlib) load when asked for. name -> module.
_SPEC = (
    "MULTI_OBJECTIVE_SAMPLERS",
    "BudgetSpec",
    "Metric",
    "Mode",
    "MultiMetric",
    "ObjectiveSpec",
    "ResourcesSpec",
    "SamplerName",
    "SamplerSpec",
    "SchedulerName",
    "SchedulerSpec",
    "SearchSpec",
    "Strategy",
    "StudySpec",
    "TrackingSpec",
)
_TRADEOFF = (
    "EnvelopePoint",
    "RegimeChange",
    "TradeOff",
    "TrialCurve",
    "TrialSummary",
    "analyze_tradeoff",
    "lower_envelope",
    "pareto_front",
    "rounds_to_target",
    "smooth",
)
_PLOTS = (
    "TheoryRow",
    "config_label",
    "contraction_rate",
    "plot_curves",
    "plot_envelope",
    "plot_pareto",
    "plot_theory",
    "theory_table",
    "write_artifacts",
)
_LAZY = {
    **dict.fromkeys(_SPEC, "spec"),
    **dict.fromkeys(_TRADEOFF, "analysis.tradeoff"),
    **dict.fromkeys(_PLOTS, "analysis.plots"),
    "run_study": "driver.study",
    "StudyResult": "driver.phases",
    "StudyTracker": "mlflow.tracking",
    "MlflowCallback": "mlflow.callback",
    "FedtuneSearch": "optuna.searcher",
    "ProgressCallback": "driver.progress",
}
__all__ = sorted(_LAZY)


__getattr__ = lazy_attributes(__name__, _LAZY)
