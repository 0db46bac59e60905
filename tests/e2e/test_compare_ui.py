"""A comparison seen as its user sees it: headless Chromium renders the self-contained HTML page
(its script runs, its inline SVG figures and matched-budget table show, nothing is fetched) and
the comparison's MLflow run page (the run, its note linking to the compared parent runs, its
metrics). The compared studies are two parent runs in a real ``mlflow server`` with synthetic
trade-offs: what is tested is what the comparison shows, not a study run."""

from __future__ import annotations

import re
from pathlib import Path

from mlflow import MlflowClient

from fedtune.tuning.analysis.compare import RunRef, StudyInput, compare
from fedtune.tuning.analysis.tradeoff import TrialCurve, analyze_tradeoff
from fedtune.tuning.mlflow.comparisons import record_comparison
from fedtune.tuning.mlflow.urls import UI_QUERY
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


#: per panel of the page: each axis's scale, its tick labels with their boxes and its label's
#: box, the plot frame, and every point's centre; null until the page's script has run (its
#: last line marks the body ready), so a page still being parsed is never measured
AXES = """(document.body && document.body.dataset.ready === 'true') ? JSON.stringify(Array.from(document.querySelectorAll('figure.panel svg'), (svg) => {
    const box = (e) => { const r = e.getBoundingClientRect();
        return [r.left, r.top, r.right, r.bottom]; };
    const axes = {};
    svg.querySelectorAll('g.axis').forEach((g) => {
        axes[g.dataset.axis] = {
            scale: g.dataset.scale,
            ticks: Array.from(g.querySelectorAll('text.tick'), (t) => [t.textContent, box(t)]),
            label: box(g.querySelector('text.label')),
        };
    });
    return {axes: axes, frame: box(svg.querySelector('rect.frame')),
            points: Array.from(svg.querySelectorAll('circle'), (c) => {
                const b = box(c); return [(b[0] + b[2]) / 2, (b[1] + b[3]) / 2]; })};
})) : null"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_chromium_draws_each_axis_as_the_png_does_with_readable_ticks(tmp_path):
    """The page's figures, as Chromium lays them out, have the description's scales and tick
    labels (the PNG's, ``tests/unit/test_figure.py``), at least three ticks on every axis, no
    two labels overlapping, and every point inside its frame."""
    import json
    import time

    from fedtune.tuning.analysis.compare_render import comparison_figure, render_html
    from tests.chromium import evaluate, page_session
    from tests.unit.test_figure import wide_comparison

    need("chromium", None if CHROMIUM.is_file() else f"{CHROMIUM} is not installed")
    c = wide_comparison()
    page = render_html(c, tmp_path / "comparison.html")
    with page_session(tmp_path / "profile") as call:
        call("Page.navigate", url=page.as_uri())
        deadline, panels = time.monotonic() + 60, []
        while time.monotonic() < deadline and not panels:
            value = evaluate(call, AXES)
            panels = json.loads(value) if isinstance(value, str) else []
            time.sleep(0.2)
    figure = comparison_figure(c)
    assert len(panels) == len(figure.panels) == 3
    for drawn, panel in zip(panels, figure.panels, strict=True):
        for name, spec in (("x", panel.x), ("y", panel.y)):
            shown = drawn["axes"][name]
            assert shown["scale"] == ("log" if spec.log else "linear"), (panel.title, name)
            labels = [text for text, _ in shown["ticks"]]
            assert labels == list(spec.tick_labels) and len(labels) >= 3, (panel.title, name)
            assert len(set(labels)) == len(labels), (panel.title, name, labels)
            boxes = [b for _, b in shown["ticks"]]
            for i, a in enumerate(boxes):
                assert not _overlap(a, shown["label"]), (panel.title, name, labels[i])
                for b in boxes[i + 1 :]:
                    assert not _overlap(a, b), (panel.title, name, labels)
        left, top, right, bottom = drawn["frame"]
        for x, y in drawn["points"]:
            assert left - 0.5 <= x <= right + 0.5 and top - 0.5 <= y <= bottom + 0.5
    envelope = panels[0]["axes"]
    assert envelope["y"]["scale"] == "log" and envelope["x"]["scale"] == "log"
