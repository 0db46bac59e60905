"""User code packages written by the tests: a good one and the bad ones."""

from __future__ import annotations

import io
import stat
import textwrap
import zipfile
from pathlib import Path

GOOD_TASKS = '''
"""A user task: the built-in quadratic under another name (registered at import)."""
from fedtune.trainers.tasks import build_task, register_task


@register_task("user_quadratic", "the quadratic task, registered by user code")
def build(params, seed):
    return build_task("quadratic", params, seed)
'''

BAD = {
    "syntax": "def broken(:\n    pass\n",
    "import": "import not_a_module_anywhere_xyz\n",
    "raises": "x = 1\nraise RuntimeError('the lab module refuses to load')\n",
}


def write_package(root: Path, body: str = GOOD_TASKS, module: str = "tasks") -> Path:
    """``root/user_lab/{__init__,<module>}.py`` and a pyproject.toml, like a user project."""
    pkg = root / "user_lab"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / f"{module}.py").write_text(textwrap.dedent(body))
    (root / "pyproject.toml").write_text('[project]\nname = "user-lab"\nversion = "0.1"\n')
    return root


def zip_with(entries: dict[str, bytes], link: str | None = None) -> bytes:
    """A hand-made zip (entries as given, no checks), optionally with a symlink entry."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
        if link is not None:
            info = zipfile.ZipInfo(link)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()
