"""The light client's wheel, as ``fedtune serve`` hands it out (``GET /client/…``).

Until fedtune is on a public index, a member installs the client from the service they use:
``pip install http://<service>/client/fedtune-<version>-py3-none-any.whl``, or ``pip install
--find-links http://<service>/client/ fedtune``; httpx, pydantic and PyYAML come from their own
index. The wheel is built by ``make dist`` (``tools/client_wheel.py``) and shipped in the image.

Where the service finds it (:func:`wheel_dir`): ``FEDTUNE_CLIENT_WHEEL_DIR``; unset, the image's
``/opt/fedtune/client`` when it exists, else ``dist/`` of the source checkout fedtune runs from.
Only the ``*.whl`` files directly in that folder are served, each by its exact name
(:func:`find_wheel` looks the requested name up among them; a name is never joined to a path),
so no request reaches another file. The wheel is public code: the routes need no token.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from fedtune.errors import NotFoundError

from .settings import Settings

__all__ = ["IMAGE_DIR", "Wheel", "find_wheel", "wheel_dir", "wheels"]

#: where the image keeps the wheel (``Dockerfile``)
IMAGE_DIR = Path("/opt/fedtune/client")
#: a wheel's file name (PEP 427: name-version[-build]-python-abi-platform.whl)
_WHEEL_NAME = re.compile(r"^[A-Za-z0-9_.]+(-[A-Za-z0-9_.!+]+){4,5}\.whl$")
#: what a 404 says when nothing is built (the folder's path is logged, never answered)
NONE_BUILT = (
    "this service has no light client wheel to hand out: its operator builds one with "
    "`make dist` (or points FEDTUNE_CLIENT_WHEEL_DIR at a folder holding it)"
)


@dataclass(frozen=True)
class Wheel:
    """A wheel the service hands out.

    Args:
        name: its file name.
        path: where it is.
        sha256: the hex digest of its bytes (pip checks it: ``#sha256=`` in the index's links).
        size: its size in bytes.
    """

    name: str
    path: Path
    sha256: str
    size: int


def wheel_dir(settings: Settings) -> Path | None:
    """The folder the wheels are served from (see the module docstring).

    Args:
        settings: the service's settings.

    Returns:
        ``FEDTUNE_CLIENT_WHEEL_DIR``, else the image's folder when it exists, else the source
        checkout's ``dist/``; None when fedtune runs from neither.
    """
    if settings.client_wheel_dir is not None:
        return settings.client_wheel_dir
    if IMAGE_DIR.is_dir():
        return IMAGE_DIR
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "fedtune").is_dir():
        return checkout / "dist"
    return None


def wheels(directory: Path | None) -> list[Wheel]:
    """The wheels directly in ``directory``, by name (none when it is missing).

    Args:
        directory: the folder (:func:`wheel_dir`).

    Returns:
        Each regular file whose name is a wheel's, with its digest.
    """
    if directory is None or not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.iterdir()):
        if _WHEEL_NAME.match(path.name) and path.is_file():
            stat = path.stat()
            digest = _sha256(path, stat.st_mtime_ns, stat.st_size)
            found.append(Wheel(path.name, path, digest, stat.st_size))
    return found


def find_wheel(directory: Path | None, name: str) -> Wheel:
    """The wheel named exactly ``name`` among :func:`wheels`.

    Args:
        directory: the folder.
        name: the requested file name.

    Returns:
        The wheel.

    Raises:
        NotFoundError: no wheel of that name (anything else: another file, a path, nothing
            built).
    """
    available = wheels(directory)
    if not available:
        raise NotFoundError(NONE_BUILT)
    for wheel in available:
        if wheel.name == name:
            return wheel
    raise NotFoundError(
        f"no such wheel here; this service hands out {', '.join(w.name for w in available)} "
        "(listed at /client/)"
    )


@functools.lru_cache(maxsize=16)
def _sha256(path: Path, mtime_ns: int, size: int) -> str:
    """The digest of a file, computed once per version of it (its mtime and size)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
