"""Regenerate the Values table of helm/fedtune/README.md from the `# --` comments of values.yaml.

    .venv/bin/python -m tests.deploy.values_table      # rewrites the table in place

``test_every_value_is_documented_in_values_yaml_and_readme`` checks that the table lists exactly
the documented keys.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import yaml

from tests.deploy.conftest import CHART_DIR, documented_values


def _default(values: dict[str, Any], path: tuple[str, ...]) -> str:
    value: Any = values
    for key in path:
        value = value[key]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    if any(isinstance(item, dict | list) for item in items):
        return "(see values.yaml)"
    return f"`{json.dumps(value)}`"


def table() -> str:
    text = (CHART_DIR / "values.yaml").read_text()
    values = yaml.safe_load(text)
    rows = ["| Key | Default | Description |", "|---|---|---|"]
    for path, description in documented_values(text).items():
        cell = description.replace("|", "\\|")
        rows.append(f"| `{'.'.join(path)}` | {_default(values, path)} | {cell} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    readme = CHART_DIR / "README.md"
    text = readme.read_text()
    new, count = re.subn(
        r"^\| Key \| Default \| Description \|\n(?:\|.*\|\n)+", table(), text, flags=re.M
    )
    if count != 1:
        print("README.md has no single values table", file=sys.stderr)
        return 1
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
