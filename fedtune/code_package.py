"""A study's user code as data: one deterministic zip, named by its SHA-256
(docs/explanation/architecture.md §9).

The *package* of a ``code: {path, modules}`` section is a zip whose root is what
``fedtune.trainers.code.load_code`` puts on ``sys.path`` (the *import root*):

* ``path`` is a directory (e.g. a project with its ``pyproject.toml`` and its package inside):
  the zip holds its contents, so ``modules`` import from the zip's root;
* ``path`` is a ``.whl`` (or ``.zip``): the file itself (a pure-Python wheel's root is importable).

Packing is deterministic — entries sorted, timestamps fixed, modes normalised, caches
(``__pycache__``, ``.git`` …) left out — so identical code gives identical bytes and one digest:
the service stores it once. Symbolic links are refused (a link may point anywhere on the
packer's disk). The SDK, the CLI, the service and the driver all use this one module; it depends
on the standard library and :mod:`fedtune.errors` only (the SDK installs without the rest).

:func:`check_package` is what a receiver runs on bytes it did not pack: a valid zip, under the
size limits, with only regular files and directories whose names stay inside the root.
:func:`extract` writes a checked package into ``<dest>`` atomically (a temporary directory
renamed into place; a digest already extracted is reused).
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fedtune.errors import CodePackageTooLargeError as PackageTooLargeError
from fedtune.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "EXCLUDED_NAMES",
    "CodePackage",
    "PackageTooLargeError",
    "check_package",
    "extract",
    "pack",
    "sha256_of",
    "wrap_single_top_level",
]

DEFAULT_MAX_BYTES = 16 * 1024**2
#: an archive may unpack to at most this many times its limit (zip bombs)
UNPACKED_FACTOR = 8
MAX_ENTRIES = 10_000
#: directory/file names never packed: caches, VCS and environments
EXCLUDED_NAMES = frozenset(
    {
        "__pycache__",
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        ".DS_Store",
        "mlruns",
        "runs",
    }
)
_EXCLUDED_SUFFIXES = (".pyc", ".pyo", ".egg-info")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
_WRAPPER = "fedtune-code"


@dataclass(frozen=True)
class CodePackage:
    """The bytes of a packed ``code:`` section and their SHA-256 (hex)."""

    data: bytes
    sha256: str

    @property
    def size(self) -> int:
        return len(self.data)


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _excluded(name: str) -> bool:
    return name in EXCLUDED_NAMES or name.endswith(_EXCLUDED_SUFFIXES)


def _files(root: Path, field: str) -> list[tuple[str, Path]]:
    """``(archive name, file)`` of every regular file under ``root``, sorted; links refused."""
    out: list[tuple[str, Path]] = []
    for current, dirs, files in os.walk(root, followlinks=False):
        here = Path(current)
        for name in list(dirs):
            if (here / name).is_symlink():
                rel = (here / name).relative_to(root).as_posix()
                raise ConfigError(
                    field, f"{rel} is a symbolic link; the code package refuses links"
                )
        dirs[:] = sorted(d for d in dirs if not _excluded(d))
        for name in sorted(files):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                raise ConfigError(
                    field, f"{rel} is a symbolic link; the code package refuses links"
                )
            if _excluded(name) or not path.is_file():
                continue
            out.append((rel, path))
    return sorted(out)


def pack(
    path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, field: str = "code.path"
) -> CodePackage:
    """Pack ``path`` (see the module docstring); ``ConfigError(field, …)`` when it cannot be."""
    path = Path(path)
    if path.is_symlink():
        raise ConfigError(field, f"{path} is a symbolic link; name the directory itself")
    if path.is_file() and path.suffix in (".whl", ".zip"):
        data = path.read_bytes()
    elif path.is_dir():
        data = _zip_directory(path, field)
    else:
        raise ConfigError(field, f"{path} is not a directory, a .whl or a .zip")
    check_package(data, max_bytes=max_bytes, field=field)
    return CodePackage(data, sha256_of(data))


def _zip_directory(root: Path, field: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel, path in _files(root, field):
            info = zipfile.ZipInfo(rel, date_time=_FIXED_TIME)
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    return buffer.getvalue()


def _unsafe_name(name: str) -> str | None:
    """Why archive member ``name`` could land outside the root (None: it cannot)."""
    if not name or "\\" in name or "\x00" in name:
        return "has a backslash or NUL byte"
    pure = PurePosixPath(name)
    if pure.is_absolute() or (len(name) > 1 and name[1] == ":"):
        return "is an absolute path"
    if any(part == ".." for part in pure.parts):
        return "escapes the package root (..)"
    return None


def _refuse_collisions(names: list[str], field: str) -> None:
    """Refuse entries that name one path twice once normalized (``pkg/./x.py`` and ``pkg/x.py``,
    ``pkg/a`` and ``pkg/a/``, ``a//b`` and ``a/b``), and a path that is a file and a directory
    (``pkg/a`` beside ``pkg/a/x.py``): unpacking either would fail or keep one at random."""
    seen: dict[tuple[str, ...], str] = {}
    files: dict[tuple[str, ...], str] = {}
    for name in names:
        parts = PurePosixPath(name).parts  # drops "." parts, repeated and trailing slashes
        if parts in seen:
            first = seen[parts]
            detail = "the same entry twice" if first == name else f"the same path as {first!r}"
            raise ConfigError(field, f"entry {name!r} names {detail}")
        seen[parts] = name
        if not name.endswith("/"):
            files[parts] = name
    for parts, name in seen.items():
        for cut in range(1, len(parts)):
            if parts[:cut] in files:
                raise ConfigError(
                    field, f"entry {files[parts[:cut]]!r} is a file, but {name!r} lies inside it"
                )


def check_package(
    data: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, field: str = "code"
) -> list[str]:
    """The member names of a safe package; else ``ConfigError(field, reason)`` (422) or
    ``PackageTooLargeError`` (413)."""
    if len(data) > max_bytes:
        raise PackageTooLargeError(
            field, f"the code package is {len(data)} bytes; the limit is {max_bytes}"
        )
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise ConfigError(field, "is not a zip archive") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise ConfigError(field, f"has {len(infos)} entries; at most {MAX_ENTRIES}")
        unpacked, names = 0, []
        for info in infos:
            why = _unsafe_name(info.filename)
            if why:
                raise ConfigError(field, f"entry {info.filename!r} {why}")
            kind = stat.S_IFMT(info.external_attr >> 16)
            if kind == stat.S_IFLNK:
                raise ConfigError(field, f"entry {info.filename!r} is a symbolic link")
            if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise ConfigError(field, f"entry {info.filename!r} is not a regular file")
            unpacked += info.file_size
            names.append(info.filename)
        if unpacked > max_bytes * UNPACKED_FACTOR:
            raise PackageTooLargeError(
                field, f"unpacks to {unpacked} bytes; the limit is {max_bytes * UNPACKED_FACTOR}"
            )
        _refuse_collisions(names, field)
        if archive.testzip() is not None:
            raise ConfigError(field, "is a corrupt zip archive (CRC mismatch)")
    return names


def extract(data: bytes, dest: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Path:
    """Unpack a package into ``dest`` (the import root); reuse ``dest`` if it exists already.

    The caller names ``dest`` after the digest, so an existing directory holds the same code.
    """
    dest = Path(dest)
    if dest.is_dir():
        return dest
    names = check_package(data, max_bytes=max_bytes)
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in names:
            target = scratch.joinpath(*PurePosixPath(name).parts)
            if name.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(name))
            mode = (archive.getinfo(name).external_attr >> 16) & 0o777
            target.chmod(0o755 if mode & 0o111 else 0o644)
    try:
        scratch.rename(dest)
    except OSError:  # another process extracted the same digest meanwhile
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
        if not dest.is_dir():
            raise
    return dest


def wrap_single_top_level(data: bytes, top: str = _WRAPPER) -> bytes:
    """The package with every entry under ``top/``: Ray unpacks a *remote* zip URI by removing
    a single top-level directory, so this is the form served as a RayJob's ``working_dir``."""
    check_package(data, max_bytes=max(len(data), 1))
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(io.BytesIO(data)) as src,
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out,
    ):
        for info in sorted(src.infolist(), key=lambda i: i.filename):
            copy = zipfile.ZipInfo(f"{top}/{info.filename}", date_time=_FIXED_TIME)
            copy.external_attr = info.external_attr
            copy.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(copy, src.read(info.filename))
    return buffer.getvalue()
