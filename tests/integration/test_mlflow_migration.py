"""``fedtune db mlflow-workspaces``: existing experiments move into their projects' workspaces.

A real MLflow SQLite store written before workspaces (everything in ``default``), studies of
three projects, and MLflow's own ``mlflow db move-resources`` doing the moves.
"""

from __future__ import annotations

import io

import sqlalchemy as sa

from fedtune.service.mlflow_migrate import migrate_experiments, plan_migration


class _Studies:
    """The one query the migration makes of fedtune's database: (experiment id, project)."""

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        self.rows = rows

    def execute(self, _query):
        return list(self.rows)


def _workspaces(url: str) -> dict[str, str]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT name, workspace FROM experiments")).all()
    engine.dispose()
    return {name: workspace for name, workspace in rows}


def test_plan_keeps_shared_and_placed_experiments():
    plan = plan_migration(
        {"1": {"team-a"}, "2": {"team-a", "team-b"}, "3": {"default"}, "4": {"b"}, "5": {"x"}},
        {
            "1": ("one", "default"),
            "2": ("two", "default"),
            "3": ("three", "default"),
            "4": ("four", "default"),
            "5": ("five", "elsewhere"),
        },
    )
    assert plan.moves == {"team-a": ["one"], "project-b": ["four"]}
    assert plan.shared == ["two"] and plan.placed == ["five"]


def test_studies_experiments_move_to_their_projects_workspaces(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_WORKSPACE", "MLFLOW_ENABLE_WORKSPACES"):
        monkeypatch.delenv(name, raising=False)
    url = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=url)
    ids = {}
    for name in ("study-a", "study-b", "study-default", "shared"):
        ids[name] = client.create_experiment(name, artifact_location=str(tmp_path / name))
        run = client.create_run(ids[name])
        client.log_metric(run.info.run_id, "loss", 1.0)
    studies = _Studies(
        [
            (ids["study-a"], "team-a"),
            (ids["study-b"], "team-b"),
            (ids["study-default"], "default"),
            (ids["shared"], "team-a"),
            (ids["shared"], "team-b"),
        ]
    )
    out = io.StringIO()
    migrate_experiments(studies, url, dry_run=True, out=out)
    assert set(_workspaces(url).values()) == {"default"}  # a dry run changes nothing
    assert "team-a: study-a" in out.getvalue() and "'shared'" in out.getvalue()

    plan = migrate_experiments(studies, url, out=io.StringIO())
    assert plan.moves == {"team-a": ["study-a"], "team-b": ["study-b"]}
    assert _workspaces(url) == {
        "Default": "default",
        "study-a": "team-a",
        "study-b": "team-b",
        "study-default": "default",
        "shared": "default",
    }
    # idempotent: a second run moves nothing
    assert migrate_experiments(studies, url, out=io.StringIO()).moves == {}
    # the runs went along: in workspace team-a the experiment and its run are found
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        (count,) = conn.execute(
            sa.text("SELECT COUNT(*) FROM runs WHERE experiment_id = :e"),
            {"e": int(ids["study-a"])},
        ).one()
        (location,) = conn.execute(
            sa.text("SELECT artifact_location FROM experiments WHERE name = 'study-a'")
        ).one()
    engine.dispose()
    assert count == 1
    assert location == str(tmp_path / "study-a")  # artifacts stay where they were
