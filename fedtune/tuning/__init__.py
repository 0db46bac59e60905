"""One study end to end: the study spec, the measured trade-off and its figures.

* :class:`StudySpec` — what a user writes (task, algorithm, search space, objective, sampler,
  scheduler, budget, resources, tracking), validated into typed values (``spec``).
* :func:`analyze_tradeoff` — rounds-to-target vs final loss, Pareto set and the lower envelope
  "best loss reachable within R rounds" from the trials' curves (``tradeoff``).
* :func:`write_artifacts` and the ``plot_*`` functions — PNG figures (``plots``).
* :func:`run_study` — run/resume a study with Optuna + Ray Tune + MLflow (``study``); it and the
  other execution names below are imported lazily, so the spec needs no Ray or MLflow.
"""

from .plots import (
    TheoryRow,
    config_label,
    contraction_rate,
    plot_curves,
    plot_envelope,
    plot_pareto,
    plot_theory,
    theory_table,
    write_artifacts,
)
from .spec import (
    MULTI_OBJECTIVE_SAMPLERS,
    BudgetSpec,
    Metric,
    Mode,
    MultiMetric,
    ObjectiveSpec,
    ResourcesSpec,
    SamplerName,
    SamplerSpec,
    SchedulerName,
    SchedulerSpec,
    SearchSpec,
    StudySpec,
    TrackingSpec,
)
from .tradeoff import (
    EnvelopePoint,
    RegimeChange,
    TradeOff,
    TrialCurve,
    TrialSummary,
    analyze_tradeoff,
    lower_envelope,
    pareto_front,
    rounds_to_target,
    smooth,
)

__all__ = [
    "MULTI_OBJECTIVE_SAMPLERS",
    "BudgetSpec",
    "EnvelopePoint",
    "Metric",
    "Mode",
    "MultiMetric",
    "ObjectiveSpec",
    "RegimeChange",
    "ResourcesSpec",
    "SamplerName",
    "SamplerSpec",
    "SchedulerName",
    "SchedulerSpec",
    "SearchSpec",
    "StudySpec",
    "TheoryRow",
    "TrackingSpec",
    "TradeOff",
    "TrialCurve",
    "TrialSummary",
    "analyze_tradeoff",
    "config_label",
    "contraction_rate",
    "lower_envelope",
    "pareto_front",
    "plot_curves",
    "plot_envelope",
    "plot_pareto",
    "plot_theory",
    "rounds_to_target",
    "smooth",
    "theory_table",
    "write_artifacts",
]

# Execution (Optuna + Ray Tune + MLflow), imported on first use: name -> module.
_LAZY = {
    "run_study": "study",
    "StudyResult": "study",
    "StudyTracker": "tracking",
    "MlflowCallback": "tracking",
    "FedtuneSearch": "optuna_glue",
    "ProgressCallback": "progress",
    "make_trainable": "trainable",
}
__all__ += sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
