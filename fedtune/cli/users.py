"""Admin commands: the service's users and projects, on its database or through its API.

    fedtune users create NAME --project P [--role member|viewer] [--admin] [--expires-days D]
    fedtune users list                      fedtune users revoke NAME [--token-id ID]
    fedtune users token NAME [--expires-days D]          # another token (rotation)
    fedtune projects create P               fedtune projects list
    fedtune projects quota P [--gpus N] [--trials N] [--studies N] [--gpu-hours H]
                             [--weight W] [--max-priority N] [--unlimited FIELD]

On the database (``--config FILE`` or ``FEDTUNE_CONFIG``: the service's settings file;
``--database-url`` or ``FEDTUNE_DATABASE_URL``; else ``./fedtune.db``) they need no token, so
the first admin can be made where the database is (``kubectl exec`` into an API pod); a SQLite
file that does not exist is not made. With ``--url`` and ``--token`` (or ``FEDTUNE_URL`` and
``FEDTUNE_TOKEN``) they go through the admin-only ``/v1/users`` and ``/v1/projects`` routes with
the SDK, and print the same (``admin_target``). ``users create`` and ``users token`` print the
new token as the last line of stdout (shown once: only its hash is stored). Bad input (a taken
name, an unknown user) is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fedtune.errors import ConflictError, NotFoundError

from .admin_target import add_target_options, admin_for, over_api

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    users = sub.add_parser(
        "users", help="service users and their API tokens (on its database, or through its API)"
    )
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
        "projects", help="service projects and their quotas (on its database, or through its API)"
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
    add_target_options(p)
    p.set_defaults(func=lambda args: _admin_run(args, func), needs_extra=_on_database)


def _on_database(args: argparse.Namespace) -> bool:
    """Whether the verb needs the service extra: on the database, not over the API."""
    return not over_api(args)


def _admin_run(args: argparse.Namespace, func: Any) -> int:
    try:
        with admin_for(args) as admin:
            return int(func(args, admin) or 0)
    except (ConflictError, NotFoundError) as exc:  # a taken name, an unknown user: bad input
        print(f"fedtune: error: {exc}", file=sys.stderr)
        return 2


def _print_token(issued: Any) -> None:
    until = issued.expires_at.isoformat() if issued.expires_at else "never"
    print(f"token {issued.token_id} for {issued.user} (expires {until}); shown once:")
    print(issued.token)


def _create_user(args: argparse.Namespace, admin: Any) -> int:
    _print_token(
        admin.create_user(
            args.name,
            args.project,
            args.role,
            admin=args.admin,
            expires_in_days=args.expires_days,
        )
    )
    return 0


def _token(args: argparse.Namespace, admin: Any) -> int:
    _print_token(admin.new_token(args.name, args.expires_days))
    return 0


def _list_users(args: argparse.Namespace, admin: Any) -> int:
    users = admin.users()
    if args.json:
        print(json.dumps([u.to_json() for u in users], indent=2))
        return 0
    for u in users:
        roles = ", ".join(f"{p}:{r}" for p, r in sorted(u.projects.items())) or "-"
        tokens = ", ".join(t.id for t in u.tokens) or "-"
        print(f"{u.name:<20} {'admin' if u.admin else '':<5}  {roles:<30}  tokens {tokens}")
    return 0


def _revoke(args: argparse.Namespace, admin: Any) -> int:
    print(f"revoked {admin.revoke(args.name, args.token_id)} token(s) of {args.name}")
    return 0


def _role(args: argparse.Namespace, admin: Any) -> int:
    admin.set_role(args.name, args.project, args.role)
    print(f"{args.name} is {args.role} of {args.project}")
    return 0


def _create_project(args: argparse.Namespace, admin: Any) -> int:
    admin.create_project(args.name)
    print(f"project {args.name}")
    return 0


def _list_projects(args: argparse.Namespace, admin: Any) -> int:
    rows = [admin.project(p.name) for p in admin.projects()]
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
        return 0
    cap = lambda v: "∞" if v is None else f"{v:g}"  # noqa: E731
    for r in rows:
        q, u = r.quota, r.usage
        print(
            f"{r.name:<20} gpus {u.gpus:g}/{cap(q.gpus)}  trials {u.trials}/{cap(q.trials)}  "
            f"studies {u.studies.queued + u.studies.running}/{cap(q.studies)}  "
            f"gpu-hours {cap(u.gpu_hours)}/{cap(q.gpu_hours)}  "
            f"weight {r.weight:g}  max priority {r.max_priority}"
        )
    return 0


#: ``projects quota``'s options, by the SDK's (and the API's) names
QUOTA_OPTIONS = ("gpus", "trials", "studies", "gpu_hours", "weight", "max_priority")


def _quota(args: argparse.Namespace, admin: Any) -> int:
    values: dict[str, Any] = {k: getattr(args, k) for k in QUOTA_OPTIONS}
    values = {k: v for k, v in values.items() if v is not None}
    values.update({flag: None for flag in args.unlimited})
    print(json.dumps(admin.set_quota(args.name, **values).to_json()))
    return 0
