"""A comparison seen as its user sees it: headless Chromium renders the self-contained HTML page
(its script runs, its inline SVG figures and matched-budget table show, nothing is fetched) and
the comparison's MLflow run page (the run, its note linking to the compared parent runs, its
metrics). The compared studies are two parent runs in a real ``mlflow server`` with synthetic
trade-offs: what is tested is what the comparison shows, not a study run."""

from __future__ import annotations

import re
from pathlib import Path

from mlflow import MlflowClient

from fedtune.tuning.compare import RunRef, StudyInput, compare
from fedtune.tuning.compare_runs import record_comparison
from fedtune.tuning.mlflow_urls import UI_QUERY
from fedtune.tuning.tradeoff import TrialCurve, analyze_tradeoff
from tests.integration.conftest import mlflow_server_process
from tests.needs import need

from .test_mlflow_ui import CHROMIUM, _chromium, _text

TASK = {"name": "quadratic", "clients": 10, "dim": 5, "seed": 0}


def _tradeoff(floors: list[float]) -> dict:
    rounds = list(range(1, 13))
    curves = [
        TrialCurve(i, {"client_lr": 0.1 / (i + 1)}, rounds, [f + 5 * 0.7**r for r in rounds])
        for i, f in enumerate(floors)
    ]
    return analyze_tradeoff(curves, last_rounds=3, smooth_window=1).to_dict()


def test_chromium_shows_the_page_and_the_mlflow_run(tmp_path):
    need(
        "chromium",
        None if CHROMIUM.is_file() else f"{CHROMIUM} is not installed (apt-get install chromium)",
    )
    with mlflow_server_process(
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        tmp_path / "server.log",
        artifacts=str(tmp_path / "artifacts"),
    ) as (_, url):
        client = MlflowClient(tracking_uri=url)
        exp = client.create_experiment("ui-compare")
        inputs = []
        for algorithm, floors in (("fedavg", [0.9, 0.6]), ("fedprox", [0.4, 0.7])):
            name = f"ui-methods-{algorithm}"
            run = client.create_run(exp, run_name=name, tags={"algorithm": algorithm})
            client.set_terminated(run.info.run_id)
            document = {"name": name, "algorithm": algorithm, "task": TASK, "objective": {}}
            inputs.append(
                StudyInput(name, document, _tradeoff(floors), run=RunRef(url, exp, run.info.run_id))
            )
        c = compare(inputs)
        recorded = record_comparison(c, tmp_path / "out", url)
        page = Path(recorded["files"]["html"])
        shown = _chromium(["--dump-dom", page.as_uri()], tmp_path / "profile-page")
        run_url = f"{url}/#/experiments/{exp}/runs/{recorded['run_id']}?{UI_QUERY}"
        run_page = _chromium(["--dump-dom", run_url], tmp_path / "profile-run")
        parents = {s.key: s.run_id for s in c.studies}

    assert shown.returncode == 0, shown.stderr[-2000:]
    dom = shown.stdout
    assert 'data-ready="true"' in dom  # the inline script ran (offline: nothing to fetch)
    assert len(re.findall(r"<polyline", dom)) >= 6  # two studies × three panels
    text = _text(dom)
    assert "The studies are comparable" in text
    assert "Comparison: ui-methods-fedavg vs ui-methods-fedprox" in text
    best = re.search(r'<tr class="best"><td>whole study</td>.*?</tr>', dom)
    assert best and "ui-methods-fedprox" in best.group(0)  # its 0.4 floor beats 0.6
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.read_text())

    assert run_page.returncode == 0, run_page.stderr[-2000:]
    run_text = _text(run_page.stdout)
    name = "compare-ui-methods-fedavg-ui-methods-fedprox"
    assert name in run_text, run_text[:800]
    assert "Comparison of ui-methods-fedavg, ui-methods-fedprox" in run_text  # the note
    for parent in parents.values():
        assert parent in run_page.stdout  # tags compared.<study> and the note's links
    assert "ui-methods-fedprox.final_loss_all" in run_text  # a metric of the run
