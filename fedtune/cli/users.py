"""Server-side admin commands on the service database: bootstrap and operators.

    fedtune users create NAME --project P [--role member|viewer] [--admin] [--expires-days D]
    fedtune users list                      fedtune users revoke NAME [--token-id ID]
    fedtune users token NAME [--expires-days D]          # another token (rotation)
    fedtune projects create P               fedtune projects list
    fedtune projects quota P [--gpus N] [--trials N] [--studies N] [--gpu-hours H]
                             [--weight W] [--max-priority N] [--unlimited FIELD]

They act on ``FEDTUNE_DATABASE_URL`` (or ``--database-url``) directly — no API, no token — so the
first admin can be made where the database is (``kubectl exec`` into an API pod). ``users
create`` and ``users token`` print the new token as the last line of stdout (shown once: only
its hash is stored). The same through the admin-only ``/v1/users`` and ``/v1/projects`` routes
and the SDK. Bad input is one line and exit 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import Any

from fedtune.errors import ConflictError, NotFoundError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    users = sub.add_parser("users", help="service users and their API tokens (on the database)")
    verbs = users.add_subparsers(dest="users_verb", metavar="VERB")
    p = verbs.add_parser("create", help="a user and its first token (printed last)")
    p.add_argument("name")
    p.add_argument("--project", help="a project to join")
    p.add_argument("--role", default="member", choices=("member", "viewer"))
    p.add_argument("--admin", action="store_true", help="may do everything")
    p.add_argument("--expires-days", type=float, help="token lifetime (default: none)")
    _db(p, _create_user)
    p = verbs.add_parser("token", help="another token for a user (rotation)")
    p.add_argument("name")
    p.add_argument("--expires-days", type=float)
    _db(p, _token)
    p = verbs.add_parser("list", help="users, roles and live token ids")
    p.add_argument("--json", action="store_true")
    _db(p, _list_users)
    p = verbs.add_parser("revoke", help="revoke a user's tokens (or one)")
    p.add_argument("name")
    p.add_argument("--token-id")
    _db(p, _revoke)
    p = verbs.add_parser("role", help="set a user's role in a project")
    p.add_argument("name")
    p.add_argument("project")
    p.add_argument("role", choices=("member", "viewer"))
    _db(p, _role)

    projects = sub.add_parser(
        "projects", help="service projects and their quotas (on the database)"
    )
    verbs = projects.add_subparsers(dest="projects_verb", metavar="VERB")
    p = verbs.add_parser("create", help="a project")
    p.add_argument("name")
    _db(p, _create_project)
    p = verbs.add_parser("list", help="projects with quotas and usage")
    p.add_argument("--json", action="store_true")
    _db(p, _list_projects)
    p = verbs.add_parser("quota", help="set a project's quotas (only those given)")
    p.add_argument("name")
    p.add_argument("--gpus", type=float)
    p.add_argument("--trials", type=int)
    p.add_argument("--studies", type=int)
    p.add_argument(
        "--gpu-hours",
        type=float,
        help="GPU-hours used or held within the fair-share window (GPUs × budget.time per study)",
    )
    p.add_argument("--weight", type=float)
    p.add_argument("--max-priority", type=int)
    p.add_argument(
        "--unlimited",
        action="append",
        default=[],
        metavar="FIELD",
        choices=("gpus", "trials", "studies", "gpu_hours"),
        help="clear a quota",
    )
    _db(p, _quota)


def _db(p: argparse.ArgumentParser, func: Any) -> None:
    p.add_argument("--database-url", help="SQLAlchemy URL (FEDTUNE_DATABASE_URL)")
    p.set_defaults(func=lambda args: _session_run(args, func))


def _session_run(args: argparse.Namespace, func: Any) -> int:
    from fedtune.service.db import Database
    from fedtune.service.migrate import require_current_schema
    from fedtune.service.settings import load_settings

    overrides = {"database_url": args.database_url} if args.database_url else {}
    args.settings = load_settings(**overrides)  # the usage's window and deadline
    db = Database(args.settings.database_url)
    try:
        require_current_schema(db)
        with db.session() as session:
            return int(func(args, session) or 0)
    except (ConflictError, NotFoundError) as exc:  # a taken name, an unknown user: bad input
        print(f"fedtune: error: {exc}", file=sys.stderr)
        return 2
    finally:
        db.dispose()


def _expiry(days: float | None) -> dt.datetime | None:
    return None if days is None else dt.datetime.now(dt.UTC) + dt.timedelta(days=days)


def _print_token(issued: Any) -> None:
    until = issued.expires_at.isoformat() if issued.expires_at else "never"
    print(f"token {issued.id} for {issued.user} (expires {until}); shown once:")
    print(issued.secret)


def _create_user(args: argparse.Namespace, session: Any) -> int:
    from fedtune.service import identity

    identity.create_user(session, args.name, admin=args.admin)
    if args.project:
        identity.add_member(session, args.name, args.project, args.role)
    _print_token(identity.issue_token(session, args.name, expires_at=_expiry(args.expires_days)))
    return 0


def _token(args: argparse.Namespace, session: Any) -> int:
    from fedtune.service import identity

    _print_token(identity.issue_token(session, args.name, expires_at=_expiry(args.expires_days)))
    return 0


def _list_users(args: argparse.Namespace, session: Any) -> int:
    from fedtune.service import identity

    users = identity.list_users(session)
    if args.json:
        print(json.dumps(users, indent=2, default=str))
        return 0
    for u in users:
        roles = ", ".join(f"{p}:{r}" for p, r in sorted(u["projects"].items())) or "-"
        tokens = ", ".join(t["id"] for t in u["tokens"]) or "-"
        print(f"{u['name']:<20} {'admin' if u['admin'] else '':<5}  {roles:<30}  tokens {tokens}")
    return 0


def _revoke(args: argparse.Namespace, session: Any) -> int:
    from fedtune.service import identity

    print(f"revoked {identity.revoke(session, args.name, args.token_id)} token(s) of {args.name}")
    return 0


def _role(args: argparse.Namespace, session: Any) -> int:
    from fedtune.service import identity

    identity.add_member(session, args.name, args.project, args.role)
    print(f"{args.name} is {args.role} of {args.project}")
    return 0


def _create_project(args: argparse.Namespace, session: Any) -> int:
    from fedtune.service import identity

    identity.create_project(session, args.name)
    print(f"project {args.name}")
    return 0


def _list_projects(args: argparse.Namespace, session: Any) -> int:
    from fedtune.service import identity
    from fedtune.service.project_usage import project_usage

    rows = [
        {**identity.describe_project(p), "usage": project_usage(session, p.name, args.settings)}
        for p in identity.projects(session)
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        q, u = r["quota"], r["usage"]
        cap = lambda v: "∞" if v is None else f"{v:g}"  # noqa: E731
        print(
            f"{r['name']:<20} gpus {u['gpus']:g}/{cap(q['gpus'])}  trials {u['trials']}/"
            f"{cap(q['trials'])}  studies {u['studies']['queued'] + u['studies']['running']}/"
            f"{cap(q['studies'])}  gpu-hours {cap(u['gpu_hours'])}/{cap(q['gpu_hours'])}  "
            f"weight {r['weight']:g}  max priority {r['max_priority']}"
        )
    return 0


def _quota(args: argparse.Namespace, session: Any) -> int:
    from fedtune.service import identity

    values: dict[str, Any] = {}
    for column, (flag, _, _) in identity.QUOTA_FIELDS.items():
        if getattr(args, flag) is not None:
            values[column] = getattr(args, flag)
    for flag in args.unlimited:
        values[f"quota_{flag}"] = None
    project = identity.set_quota(session, args.name, **values)
    print(json.dumps(identity.describe_project(project)))
    return 0
