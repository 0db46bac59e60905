"""A ``helm`` command for the pages of ``docs_env: operator`` where no helm binary is installed.

It runs Helm's own Go SDK through ``helm-python-sdk`` (the dev extra), offline, for the verbs
a page that renders and checks the chart uses::

    helm version
    helm template NAME CHART [-n NS] [-f VALUES]... [--set K=V]... [--set-string K=V]...
    helm lint CHART [-f VALUES]... [--set K=V]... [--strict]
    helm show values CHART

Anything else exits 2 with a message naming what is supported (a page that needs a cluster
marks its block ``Needs a Kubernetes cluster``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _values(helm: Any, args: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in args.values or []:
        values = _merge(values, helm.values_from_yaml(Path(path).read_text()) or {})
    for expression in args.set or []:
        values = _merge(values, helm.parse_set_string(expression))
    for expression in args.set_string or []:
        values = _merge(values, helm.parse_set_literal(expression))
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="helm", description="offline helm (helm-python-sdk)")
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("version")
    for name in ("template", "lint"):
        p = verbs.add_parser(name)
        if name == "template":
            p.add_argument("name")
        p.add_argument("chart")
        p.add_argument("-n", "--namespace", default="default")
        p.add_argument("-f", "--values", action="append")
        p.add_argument("--set", action="append")
        p.add_argument("--set-string", action="append")
        p.add_argument("--strict", action="store_true")
    show = verbs.add_parser("show")
    show.add_argument("what", choices=["values", "chart", "readme", "all"])
    show.add_argument("chart")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one helm verb offline.

    Args:
        argv: the arguments after ``helm`` (default: the command line).

    Returns:
        The exit code: 0, 1 when linting found errors, 2 for an unsupported use.
    """
    import helm_python as helm

    helm.disable_logging()
    args = _parser().parse_args(argv)
    if args.verb == "version":
        print(f'version.BuildInfo{{Version:"v{helm.helm_sdk_version()}"}}')
        return 0
    if args.verb == "show":
        print(helm.show(args.chart, output_format=args.what))
        return 0
    values = _values(helm, args)
    if args.verb == "lint":
        report = helm.lint(args.chart, values, strict=args.strict, namespace=args.namespace)
        for message in report.get("messages", []):
            print(f"[{message.get('severity')}] {message.get('path')}: {message.get('error')}")
        errors = report.get("errors") or []
        for error in errors:
            print(f"Error: {error}", file=sys.stderr)
        print(f"{report.get('total_charts_linted', 0)} chart(s) linted, {len(errors)} failed")
        return 1 if errors else 0
    with helm.Chart.load(args.chart) as chart:
        rendered = chart.render(values, name=args.name, namespace=args.namespace, is_install=True)
    for source in sorted(rendered):
        text = rendered[source].strip()
        if text and not source.endswith("NOTES.txt"):
            print(f"---\n# Source: {source}\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
