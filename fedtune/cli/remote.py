"""Remote verbs, through the SDK: ``fedtune submit | status | studies | wait | cancel | trials |
tradeoff``.

    fedtune submit examples/quickstart.yaml [--wait]  # prints the study id
    fedtune submit study.yaml --code ./my_lab        # uploads the user code package first
    fedtune submit study.yaml --project vision --set budget.trials=8
    fedtune status ID        fedtune wait ID [--timeout S]        fedtune cancel ID
    fedtune studies [--state S ...] [--project P] [--limit N] [--page-token T | --all] [--order asc]
    fedtune trials ID [--state completed]             fedtune tradeoff ID
    fedtune whoami                                    # who the token is, its projects
    fedtune mlflow-login [USER]                       # a new MLflow UI password

``--url`` (default ``$FEDTUNE_URL`` or http://127.0.0.1:8000) and ``--token`` (default
``$FEDTUNE_TOKEN``, else ``$FEDTUNE_API_TOKEN``) on every verb, ``--project`` (default
``$FEDTUNE_PROJECT``) on ``submit`` and ``studies``: :data:`fedtune.client_settings.CLIENT_SETTINGS`.
``--json`` prints the service's answer as JSON.
``wait`` (and ``submit --wait``) exits 0 when the study succeeded, 1 when it failed or was
cancelled, 124 when ``--timeout`` passed first.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from fedtune.client_settings import setting
from fedtune.errors import ConfigError
from fedtune.tuning.methods import is_methods_study

from .common import add_set_option, apply_sets, figure, load_yaml, resolve_code

__all__ = ["register"]

EXIT_TIMEOUT = 124


class _Given(argparse.Action):
    """Store the option's value and that it was given (messages name ``--url``, not
    ``FEDTUNE_URL``, for a value from the command line)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def _common(p: argparse.ArgumentParser) -> None:
    url, token = setting("url"), setting("token")
    p.add_argument(url.option, default=url.resolve(None), action=_Given, help=url.describe())
    p.add_argument(token.option, default=None, action=_Given, help=token.describe())
    p.add_argument("--json", action="store_true", help="print JSON")


def _project(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--project", default=None, help=f"{text} (default: $FEDTUNE_PROJECT)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a study file to the service")
    p.add_argument("study_file", metavar="STUDY_FILE", help="the study file (YAML or JSON)")
    _project(
        p,
        "the project to submit to; overrides the file's project: (unset: the service "
        "picks your only project)",
    )
    add_set_option(p)
    p.add_argument("--wait", action="store_true", help="wait for the study to finish")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait at most")
    p.add_argument(
        "--code", metavar="DIR", help="user code to upload (default: the spec's code.path)"
    )
    _common(p)
    p.set_defaults(func=submit)

    p = sub.add_parser("status", help="state and progress of a study")
    p.add_argument("study_id")
    _common(p)
    p.set_defaults(func=status)

    p = sub.add_parser("studies", help="list studies, a page at a time (or --all)")
    p.add_argument(
        "--state",
        action="append",
        metavar="STATE",
        help="only this state (repeat, or comma-separate, for several)",
    )
    _project(p, "only this project")
    p.add_argument("--limit", type=int, default=50, help="studies per page (default 50)")
    p.add_argument("--page-token", help="next page: the token the previous page printed")
    p.add_argument("--all", action="store_true", help="every page, one after the other")
    p.add_argument(
        "--order",
        choices=["desc", "asc"],
        default="desc",
        help="by creation time: desc (newest first, default) or asc",
    )
    _common(p)
    p.set_defaults(func=studies)

    p = sub.add_parser("wait", help="wait for a study to finish (exit 0 if it succeeded)")
    p.add_argument("study_id")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait at most")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    _common(p)
    p.set_defaults(func=wait)

    p = sub.add_parser("cancel", help="cancel a queued or running study")
    p.add_argument("study_id")
    _common(p)
    p.set_defaults(func=cancel)

    p = sub.add_parser("trials", help="a study's trials: state, value, parameters")
    p.add_argument("study_id")
    p.add_argument("--state", help="only trials in this state")
    _common(p)
    p.set_defaults(func=trials)

    p = sub.add_parser("tradeoff", help="a study's Pareto set and lower envelope")
    p.add_argument("study_id")
    _common(p)
    p.set_defaults(func=tradeoff)

    p = sub.add_parser("whoami", help="who the token authenticates, and its projects")
    _common(p)
    p.set_defaults(func=whoami)

    p = sub.add_parser(
        "mlflow-login",
        help="a new password for the MLflow UI, and where to open it",
        description="Make a new password of your MLflow UI login (the old one stops working; an "
        "admin may name another user). It is shown once: fedtune does not store it.",
    )
    p.add_argument("user", nargs="?", help="whose login (default: yours)")
    _common(p)
    p.set_defaults(func=mlflow_login)


def _client(args: argparse.Namespace) -> Any:
    from fedtune.client import Client
    from fedtune.client_settings import SettingNames

    url, token = setting("url"), setting("token")
    names = SettingNames(
        url=url.source(getattr(args, "url_given", False)),
        token=token.source(getattr(args, "token_given", False)),
    )
    return Client(args.url, token=token.resolve(args.token) or None, names=names)


def _json(obj: Any) -> str:
    from fedtune.wire_base import WireModel

    if isinstance(obj, WireModel):
        obj = obj.to_json()  # as the service sent it, fields unknown to this version included
    elif isinstance(obj, list):
        obj = [o.to_json() if isinstance(o, WireModel) else o for o in obj]
    return json.dumps(obj, indent=2, default=str)


def _show_status(s: Any) -> str:
    p = s.progress
    rows = [
        ("study", f"{s.name} [{s.id}]"),
        (
            "state",
            str(s.state)
            + (f" ({s.error})" if s.error else "")
            + (f" — {s.queued_reason}" if str(s.state) == "queued" and s.queued_reason else ""),
        ),
        ("project", f"{s.project or 'default'} (owner {s.owner or '-'}, priority {s.priority})"),
        ("algorithm / task", f"{s.algorithm} / {s.task}"),
        (
            "trials",
            # "stopped", as every other output says: the API's ``pruned`` is Optuna's word
            f"{p.finished}/{p.requested} finished ({p.completed} completed, "
            f"{p.pruned} stopped, {p.failed} failed), {p.running} running",
        ),
        (
            "best",
            "-"
            if s.best is None
            else f"{figure(s.best.value)} (trial {s.best.number}) {_params(s.best.params)}",
        ),
        ("mlflow", _mlflow_line(s.mlflow)),
    ]
    rows += [("event", f"{e.at:%Y-%m-%d %H:%M:%S} {e.message}") for e in s.events]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _submitted(args: argparse.Namespace) -> dict[str, Any]:
    """The study file's document (YAML or JSON) with the ``--set`` overrides applied and a
    relative ``code.path`` made absolute (it is relative to the file's directory)."""
    data = apply_sets(load_yaml(args.study_file), args.set)
    return resolve_code(data, Path(args.study_file).parent)


def submit(args: argparse.Namespace) -> int:
    spec = _submitted(args)
    project = args.project  # --project wins over the file; $FEDTUNE_PROJECT does not
    if project is None and spec.get("project") is None:
        project = setting("project").resolve(None)
    if is_methods_study(spec):  # a study of methods: one study per algorithm
        return _submit_methods(args, spec, project)
    with _client(args) as client:
        study = client.submit(spec, code=args.code, project=project)
        if not args.wait:
            print(_json(study.status()) if args.json else study.id)
            return 0
        print(study.id, file=sys.stderr)
        return _wait(study, args, progress=not args.json)


def _submit_methods(args: argparse.Namespace, spec: dict[str, Any], project: str | None) -> int:
    """Submit a study of methods; with ``--wait``, wait for every study, then for the
    comparison the service records once they have all ended."""
    with _client(args) as client:
        studies = client.submit_methods(spec, project=project)
        ids = [s.id for s in studies]
        if not args.wait:
            print(_json([s.status() for s in studies]) if args.json else "\n".join(ids))
            print(
                f"study of methods {studies.group}: its comparison is recorded once all end "
                f"(fedtune compare {' '.join(ids)})",
                file=sys.stderr,
            )
            return 0
        print("\n".join(ids), file=sys.stderr)
        codes = [_wait(s, args, progress=not args.json) for s in studies]
        group = _recorded(client, studies.group)
    if args.json:
        print(_json(group))
    elif group.comparison is None:
        print(f"study of methods {group.id}: comparison not recorded yet", file=sys.stderr)
    elif group.comparison.error is not None:
        print(f"study of methods {group.id}: no comparison: {group.comparison.error}")
    else:
        print(f"comparison recorded: MLflow run {group.comparison.run_id}")
    return max(codes)


def _recorded(client: Any, group_id: str, timeout_s: float = 120.0) -> Any:
    """The study of methods once the service has recorded its comparison (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    group = client.method_group(group_id)
    while group.comparison is None and time.monotonic() < deadline:
        time.sleep(1.0)
        group = client.method_group(group_id)
    return group


def status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        s = client.study(args.study_id).status()
        print(_json(s) if args.json else _show_status(s))
    return 0


def studies(args: argparse.Namespace) -> int:
    """A page of studies (``--all``: every page); the next page's command on stderr."""
    states = [s for value in args.state or [] for s in value.split(",") if s] or None
    args.project = setting("project").resolve(args.project)
    if args.all and args.page_token:
        raise ConfigError("--page-token", "give --page-token or --all, not both")
    with _client(args) as client:
        if args.all:
            rows = list(
                client.iter_studies(states, args.project, order=args.order, page_size=args.limit)
            )
            token = None
        else:
            page = client.list_studies(
                states, args.project, limit=args.limit, page_token=args.page_token, order=args.order
            )
            rows, token = page.items, page.next_page_token
    if args.json:
        items = [r.to_json() for r in rows]
        print(_json({"items": items, "next_page_token": token}))
    else:
        print(
            f"{'id':<12}  {'state':<9}  {'project':<12}  {'owner':<12}  {'created (UTC)':<19}  name"
        )
        for s in rows:
            created = s.created_at.strftime("%Y-%m-%d %H:%M:%S") if s.created_at else "-"
            print(
                f"{s.id:<12}  {s.state!s:<9}  {s.project or 'default':<12}  "
                f"{s.owner or '-':<12}  {created:<19}  {s.name}"
            )
    if token is not None:
        again = [f"--state {','.join(states)}"] if states else []
        again += [f"--project {args.project}"] if args.project else []
        again += [f"--order {args.order}"] if args.order != "desc" else []
        again += [f"--limit {args.limit}"] if args.limit != 50 else []
        print(
            f"more studies: fedtune studies {' '.join([*again, '--page-token', token])}",
            file=sys.stderr,
        )
    return 0


def wait(args: argparse.Namespace) -> int:
    with _client(args) as client:
        return _wait(client.study(args.study_id), args, progress=not args.quiet)


def _wait(study: Any, args: argparse.Namespace, progress: bool) -> int:
    try:
        final = study.wait(progress=progress, timeout=args.timeout)
    except TimeoutError as exc:
        print(f"fedtune: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    print(_json(final) if args.json else _show_status(final))
    return 0 if final.state == "succeeded" else 1


def cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        s = client.study(args.study_id).cancel()
        print(_json(s) if args.json else f"{s.id} {s.state}")
    return 0


def trials(args: argparse.Namespace) -> int:
    with _client(args) as client:
        rows = client.study(args.study_id).trials(args.state)
    if args.json:
        print(_json(rows))
        return 0
    print(f"{'trial':>5}  {'state':<9}  {'outcome':<11}  {'value':>12}  {'rounds':>6}  params")
    for t in rows:
        value, params = figure(t.value), _params(t.params)
        outcome = t.outcome or "-"  # completed, diverged, stopped, failed, interrupted
        print(
            f"{t.number:>5}  {t.state!s:<9}  {outcome:<11}  {value:>12}  {t.last_round:>6}  "
            f"{params}"
        )
    return 0


def _params(params: dict[str, Any]) -> str:
    """A configuration as ``status`` and ``trials`` show it: ``name=value``, numbers as every
    output shows them (:func:`.common.figure`)."""
    return " ".join(f"{k}={figure(v)}" for k, v in params.items())


def _mlflow_line(m: Any) -> str:
    """Where a member opens the study's runs: the run's page (or the UI, before the run
    starts), in which workspace, and how to log in; or why there is nothing to open."""
    where = m.run_url or m.ui_url or m.tracking_uri
    if where is None:
        return (
            "- (a file on the service's machine: no MLflow UI to open; its operator can set "
            "MLFLOW_TRACKING_URI to an MLflow server)"
        )
    if m.workspace:
        where += f" (workspace {m.workspace}; log in with `fedtune mlflow-login`)"
    return where


def tradeoff(args: argparse.Namespace) -> int:
    with _client(args) as client:
        t = client.study(args.study_id).tradeoff()
    if args.json:
        print(_json(t))
        return 0
    from .common import figure

    # the words and figures of `fedtune tune`'s summary: one vocabulary in every output
    print(
        f"Pareto set (fewer rounds to loss <= {figure(t.pareto_target)} vs lower final loss, "
        f"the mean {t.metric} of the last rounds): trials {t.pareto}"
    )
    print("lower envelope E(R) = lowest loss reachable within R rounds:")
    shown = [p for p in t.envelope if p.loss is not None]
    step = max(1, len(shown) // 20)
    for point in shown[::step]:
        print(f"  R={point.round:>5}  E={figure(point.loss)}  (trial {point.trial_id})")
    return 0


def mlflow_login(args: argparse.Namespace) -> int:
    with _client(args) as client:
        login = client.mlflow_login(args.user)
    if args.json:
        print(_json(login))
        return 0
    print(f"user        {login.user}")
    print(f"workspaces  {', '.join(login.workspaces) or '-'}")
    print(f"password    {login.password}")
    print(
        "(shown once; `fedtune status ID` shows the MLflow UI's address and the study's workspace)"
    )
    return 0


def whoami(args: argparse.Namespace) -> int:
    with _client(args) as client:
        me = client.whoami()
    if args.json:
        print(_json(me))
        return 0
    roles = ", ".join(f"{p} ({r})" for p, r in sorted(me.projects.items())) or "none"
    via = "open: tokens are not checked" if me.via == "open" else me.via
    print(f"{me.name}{' (admin)' if me.admin else ''} via {via}; projects: {roles}")
    return 0
