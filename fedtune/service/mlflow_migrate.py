"""Move the experiments of existing studies into their projects' MLflow workspaces.

Before MLflow workspaces every study logged into MLflow's ``default`` workspace. This moves each
study's experiment (``studies.mlflow_experiment_id``) into the workspace of the study's project
(:func:`~fedtune.service.mlflow_workspaces.workspace_for`) with MLflow's own tool,
``mlflow db move-resources --resource-type experiments --name …``, which moves an experiment
with its runs, metrics, tags and traces in one transaction and leaves artifacts where they are
(``--artifact-policy preserve``: stored artifact URIs keep resolving). It creates the target
workspaces in MLflow's database first (MLflow's workspace store; roles and users are the
service's sync, ``mlflow_tenancy``). Run it with the MLflow server stopped, after a backup.

An experiment shared by studies of several projects cannot be split: it stays where it is and
is reported.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .mlflow_workspaces import DEFAULT_WORKSPACE, workspace_for

__all__ = ["MigrationPlan", "migrate_experiments", "plan_migration"]


@dataclass
class MigrationPlan:
    """What :func:`migrate_experiments` moves: workspace -> experiment names."""

    moves: dict[str, list[str]] = field(default_factory=dict)
    #: experiment names whose studies belong to several projects (left in place)
    shared: list[str] = field(default_factory=list)
    #: experiments already in a workspace other than ``default`` (left in place)
    placed: list[str] = field(default_factory=list)


def plan_migration(
    study_experiments: Mapping[str, set[str]], experiments: Mapping[str, tuple[str, str]]
) -> MigrationPlan:
    """Which experiment goes to which workspace.

    Args:
        study_experiments: experiment id -> the projects of the studies that logged to it.
        experiments: experiment id -> (name, workspace) in MLflow's database.

    Returns:
        The plan.
    """
    plan = MigrationPlan()
    for experiment_id, projects in sorted(study_experiments.items()):
        if experiment_id not in experiments:
            continue  # deleted from MLflow meanwhile
        name, current = experiments[experiment_id]
        targets = {workspace_for(p) for p in projects}
        if len(targets) > 1:
            plan.shared.append(name)
            continue
        (target,) = targets
        if current == target:
            continue
        if current != DEFAULT_WORKSPACE:
            plan.placed.append(name)
            continue
        plan.moves.setdefault(target, []).append(name)
    return plan


def _mlflow_rows(mlflow_db: str) -> dict[str, tuple[str, str]]:
    import sqlalchemy as sa

    engine = sa.create_engine(mlflow_db)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT experiment_id, name, workspace FROM experiments"))
            return {str(r[0]): (r[1], r[2] or DEFAULT_WORKSPACE) for r in rows}
    finally:
        engine.dispose()


def _ensure_workspaces(mlflow_db: str, names: list[str]) -> None:
    from mlflow.entities import Workspace
    from mlflow.exceptions import MlflowException
    from mlflow.tracking._workspace.registry import get_workspace_store

    store = get_workspace_store(workspace_uri=mlflow_db)
    for name in names:
        try:
            store.get_workspace(name)
        except MlflowException:
            store.create_workspace(Workspace(name=name, description=f"fedtune project {name}"))


def migrate_experiments(
    session: Any, mlflow_db: str, *, dry_run: bool = False, out: Any = None
) -> MigrationPlan:
    """Move every study's experiment from ``default`` into its project's workspace.

    Args:
        session: A session of fedtune's database (the studies and their projects).
        mlflow_db: SQLAlchemy URL of MLflow's tracking database.
        dry_run: Only print the plan.
        out: Where to print (standard output).

    Returns:
        The plan (carried out unless ``dry_run``).
    """
    from sqlalchemy import select

    from .models import Study

    out = out or sys.stdout
    study_experiments: dict[str, set[str]] = {}
    rows = session.execute(select(Study.mlflow_experiment_id, Study.project))
    for experiment_id, project in rows:
        if experiment_id:
            study_experiments.setdefault(str(experiment_id), set()).add(project)
    plan = plan_migration(study_experiments, _mlflow_rows(mlflow_db))
    for name in plan.shared:
        print(f"left in place: experiment {name!r} holds studies of several projects", file=out)
    for name in plan.placed:
        print(f"left in place: experiment {name!r} is in another workspace already", file=out)
    for workspace, names in sorted(plan.moves.items()):
        print(f"{workspace}: {', '.join(sorted(names))}", file=out)
    if dry_run or not plan.moves:
        return plan
    _ensure_workspaces(mlflow_db, sorted(plan.moves))
    mlflow = Path(sys.executable).with_name("mlflow")
    for workspace, names in sorted(plan.moves.items()):
        argv = [
            str(mlflow) if mlflow.exists() else "mlflow",
            "db",
            "move-resources",
            mlflow_db,
            "--from",
            DEFAULT_WORKSPACE,
            "--to",
            workspace,
            "--resource-type",
            "experiments",
            "--artifact-policy",
            "preserve",
            "--yes",
        ]
        for name in sorted(names):
            argv += ["--name", name]
        subprocess.run(argv, check=True)
    return plan
