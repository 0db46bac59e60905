"""``fedtune manifest STUDY_FILE``: the KubeRay ``RayJob`` that the ``kubernetes`` backend would
create for a study, printed as YAML (or JSON) for review or GitOps — no cluster, no service.

The study is validated as ``fedtune tune`` validates it (bad input: one line, exit 2); the
manifest is the service's own (:func:`fedtune.service.backends.k8s_manifest.rayjob_manifest`),
sized for the study's trial processes at once, each holding its ``resources``
(:func:`fedtune.tuning.packing.plan.reserved_processes`: ``budget.max_concurrent``, or
``ceil(max_concurrent / P)`` with ``resources.pack`` = P), and configured by the same
``FEDTUNE_K8S_*`` variables as the service (image, namespace, service account, Secret, ...).

A study with ``code:`` needs ``--code-uri``: where Ray downloads the packed code from (a zip you
host, e.g. ``https://…/lab.zip`` or ``s3://…/lab.zip``). The service serves its uploads itself,
with a per-study credential that a manifest meant for review must not carry.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "manifest",
        help="print the KubeRay RayJob a study would run as (no cluster needed)",
        description="Print the KubeRay RayJob that the kubernetes backend would create for a "
        "study, configured by the FEDTUNE_K8S_* variables (for review or GitOps).",
    )
    p.add_argument("study_file", metavar="STUDY_FILE", help="the study file (YAML or JSON)")
    p.add_argument(
        "--study-id",
        dest="study_id",
        metavar="ID",
        help="12 hex digits (default: a new id, as the service assigns)",
    )
    p.add_argument("--attempt", type=int, default=1, help="dispatch attempt (default: 1)")
    p.add_argument(
        "--code-uri",
        dest="code_uri",
        metavar="URI",
        help="where Ray fetches the study's packed code (studies with code: only)",
    )
    p.add_argument("--format", choices=("yaml", "json"), default="yaml")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import yaml

    from fedtune.errors import BackendError, ConfigError
    from fedtune.service.backends.base import LaunchRequest, check_study_id
    from fedtune.service.backends.k8s_manifest import rayjob_manifest
    from fedtune.service.services import new_study_id
    from fedtune.service.settings import load_settings
    from fedtune.tuning.packing.plan import reserved_processes
    from fedtune.tuning.spec import StudySpec

    spec = StudySpec.from_file(args.study_file)
    if spec.code is not None and not args.code_uri:
        raise ConfigError(
            "--code-uri",
            "the study has code: say where Ray fetches the packed "
            "code from (a zip you host; `fedtune submit` uploads it instead)",
        )
    if spec.code is None and args.code_uri:
        raise ConfigError("--code-uri", "the study has no code: section")
    if args.attempt < 1:
        raise ConfigError("--attempt", f"must be at least 1, got {args.attempt}")
    study_id = args.study_id or new_study_id()
    try:
        check_study_id(study_id)
    except BackendError:
        raise ConfigError("--study-id", f"{study_id!r} is not 12 hex digits") from None
    request = LaunchRequest(
        study_id,
        args.attempt,
        cpu=spec.resources.cpu,
        gpu=spec.resources.gpu,
        max_concurrent=spec.budget.max_concurrent,
        processes=reserved_processes(spec.resources.pack, spec.budget.max_concurrent),
    )
    manifest = rayjob_manifest(request, load_settings(backend="kubernetes"), code_uri=args.code_uri)
    text = (
        json.dumps(manifest, indent=2) + "\n"
        if args.format == "json"
        else yaml.safe_dump(manifest, sort_keys=False)
    )
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output} (RayJob {manifest['metadata']['name']})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
