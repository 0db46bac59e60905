"""Build fedtune's image: ``make image`` (``python3 deploy/build_image.py``).

With a Docker engine (``docker info`` answers) or podman, the Dockerfile is built as it is, from
the official ``python:3.11-slim-bookworm`` base and PyTorch's wheel index. Without one — this
repository's CI machines, a laptop without a daemon — Debian's ``buildah`` builds it without a
daemon (``buildah bud --isolation chroot --network host --layers``), and two build arguments
replace what such a machine cannot pull:

* ``BASE_IMAGE``: a Debian bookworm base made from Debian's packages (``debootstrap --variant=
  minbase`` with Python 3.11, its venv module and CA certificates, ``python`` linked as the
  official image has it), imported with buildah as ``localhost/fedtune-base:bookworm-py3.11``
  and kept: it is made once per machine (the root file system is cached under
  ``$FEDTUNE_IMAGE_CACHE``, default ``/var/cache/fedtune-image``);
* ``PIP_CERT``: behind a TLS-intercepting proxy (the host's ``PIP_CERT``, ``REQUESTS_CA_BUNDLE``
  or ``SSL_CERT_FILE`` names a CA bundle), that bundle is mounted read-only into the build's
  RUN steps (``--volume``; never into a layer) and pip is pointed at it;
* ``TORCH_FIND_LINKS``: a directory holding the torch wheel (``--torch-wheels``, default
  ``/opt/wheels`` when it holds ``torch-<pin>+cpu``), mounted read-only into the build's RUN
  steps at a fixed path (a build argument that never changes keeps the layer cache valid); its
  ``+cpu`` wheel wins over PyPI's multi-GB CUDA build. Docker has no build volumes: serve the
  directory over HTTP and pass ``--build-arg TORCH_FIND_LINKS=http://…/`` yourself.

Layers are cached between builds (``--layers``; pip's downloads in a cache mount), so a change
of fedtune's code rebuilds only the last layers. The tag is ``localhost/fedtune:<version>``
(``-cuda`` appended for ``--variant cuda``). One line on stderr says what failed, exit 1;
bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON_VERSION = "3.11"
OFFICIAL_BASE = f"python:{PYTHON_VERSION}-slim-bookworm"
LOCAL_BASE = f"localhost/fedtune-base:bookworm-py{PYTHON_VERSION}"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: what the local base holds: Python, venv, CA certificates (pip over HTTPS)
BASE_PACKAGES = (f"python{PYTHON_VERSION}", "python3-venv", "ca-certificates")


class BuildError(RuntimeError):
    """A step of the build failed (the message is one line)."""


def version() -> str:
    text = (REPO / "pyproject.toml").read_text()
    match = re.search(r'^version\s*=\s*"([^"]+)"', text, flags=re.M)
    if match is None:
        raise BuildError("pyproject.toml has no version")
    return match.group(1)


def torch_pin() -> str:
    match = re.search(r"ARG TORCH_VERSION=(\S+)", (REPO / "Dockerfile").read_text())
    if match is None:
        raise BuildError("Dockerfile has no TORCH_VERSION")
    return match.group(1)


def default_tag(variant: str) -> str:
    return f"localhost/fedtune:{version()}{'-cuda' if variant == 'cuda' else ''}"


def engine(choice: str) -> str:
    """``docker`` when its daemon answers, else ``podman``, else ``buildah`` (or the choice)."""
    if choice != "auto":
        if shutil.which(choice) is None:
            raise BuildError(f"{choice} is not installed")
        return choice
    if shutil.which("docker") is not None:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=30)
        if done.returncode == 0:
            return "docker"
    for name in ("podman", "buildah"):
        if shutil.which(name) is not None:
            return name
    raise BuildError(
        "no image builder: no Docker daemon answers and neither podman nor buildah is installed "
        "(apt-get install -y buildah debootstrap)"
    )


def _run(argv: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, **kwargs)
    if done.returncode != 0:
        raise BuildError(f"{what} failed (exit {done.returncode}): {' '.join(argv[:4])} ...")
    return done


def image_exists(tool: str, ref: str) -> bool:
    argv = [tool, "image", "inspect", ref] if tool != "buildah" else [tool, "inspect", ref]
    return subprocess.run(argv, capture_output=True).returncode == 0


#: debootstrap's tries: a mirror caught mid-sync, or a busy network, fails a first run now and
#: then (twice on a fresh 2-core machine, each time followed by a run that succeeded)
DEBOOTSTRAP_TRIES, DEBOOTSTRAP_WAIT_S = 3, 15.0


def debootstrap(rootfs: Path, tries: int = DEBOOTSTRAP_TRIES, wait_s: float = DEBOOTSTRAP_WAIT_S):
    """Make the base root file system with ``debootstrap``, from scratch at every try.

    Args:
        rootfs: Where (emptied first).
        tries: Runs at most; each failure but the last is said on stderr, then waited on.
        wait_s: Seconds before the second run (doubled for each later one).

    Raises:
        BuildError: Every run failed; the message ends with the last lines of its log.
    """
    argv = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            "bookworm", str(rootfs), DEBIAN_MIRROR]  # fmt: skip
    for attempt in range(1, tries + 1):
        unmount_under(rootfs)  # a failed run leaves the target's /proc mounted
        shutil.rmtree(rootfs, ignore_errors=True)
        rootfs.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode == 0:
            return
        why = _last_lines(rootfs / "debootstrap" / "debootstrap.log", done.stderr)
        if attempt == tries:
            raise BuildError(f"debootstrap failed (exit {done.returncode}) {tries} times: {why}")
        print(f"debootstrap failed (exit {done.returncode}), trying again: {why}",
              file=sys.stderr)  # fmt: skip
        time.sleep(wait_s * 2 ** (attempt - 1))


def unmount_under(root: Path) -> list[str]:
    """Unmount every file system mounted at or below ``root``, the deepest first.

    debootstrap mounts ``/proc`` (and, in some modes, ``/sys``) in its target while it installs;
    a run that fails leaves them, and removing the target then fails on their files.

    Args:
        root: The directory.

    Returns:
        The mount points unmounted.
    """
    prefix = str(root.resolve())
    points = []
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)
    return points


def _last_lines(log: Path, stderr: str, count: int = 3) -> str:
    """The last lines of debootstrap's log (kept in the target when it fails) and of its
    stderr (where it prints its ``E:`` line), joined on one line."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    parts = []
    for source in (text, stderr or ""):
        lines = [line.strip() for line in source.splitlines() if line.strip()]
        if lines:
            parts.append(" | ".join(lines[-count:]))
    return " || ".join(parts) or "no log"


def local_base(cache: Path, *, rebuild: bool = False) -> str:
    """The Debian base image (made once: debootstrap, then ``buildah`` from scratch + commit)."""
    if not rebuild and image_exists("buildah", LOCAL_BASE):
        return LOCAL_BASE
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is not installed (apt-get install -y debootstrap)")
    rootfs = cache / f"rootfs-bookworm-py{PYTHON_VERSION}"
    done_mark = rootfs / ".fedtune-complete"
    if rebuild or not done_mark.is_file():
        print(f"debootstrap: Debian bookworm + {' '.join(BASE_PACKAGES)} -> {rootfs}",
              file=sys.stderr)  # fmt: skip
        debootstrap(rootfs)
        # as the official image: `python` is Python 3.11; no apt lists or caches in the base
        (rootfs / "usr/local/bin").mkdir(parents=True, exist_ok=True)
        for name in ("python", "python3"):
            link = rootfs / "usr/local/bin" / name
            link.unlink(missing_ok=True)
            link.symlink_to(f"/usr/bin/python{PYTHON_VERSION}")
        for junk in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for entry in (rootfs / junk).glob("*"):
                if entry.is_file():
                    entry.unlink()
        done_mark.touch()
    ctr = _run(["buildah", "from", "scratch"], "buildah from scratch", capture_output=True,
               text=True).stdout.strip()  # fmt: skip
    try:
        mount = _run(["buildah", "mount", ctr], "buildah mount", capture_output=True,
                     text=True).stdout.strip()  # fmt: skip
        _run(["cp", "-a", "--", f"{rootfs}/.", mount], "copying the base root file system")
        Path(mount, ".fedtune-complete").unlink(missing_ok=True)
        _run(["buildah", "config", "--env", "LANG=C.UTF-8", "--env",
              "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
              "--cmd", "python3", ctr], "buildah config")  # fmt: skip
        _run(["buildah", "commit", "--rm", ctr, LOCAL_BASE], "buildah commit",
             stdout=subprocess.DEVNULL)  # fmt: skip
    except BaseException:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
        raise
    return LOCAL_BASE


#: where the build's RUN steps see the host's CA bundle and torch wheels (``--volume``)
BUILD_CA = "/run/fedtune-build-ca.pem"
BUILD_WHEELS = "/run/fedtune-torch-wheels"


def host_ca_bundle() -> Path | None:
    """The CA bundle the host's own pip/requests are told to use (a proxy's CA), or None."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(name)
        if value and Path(value).is_file():
            return Path(value).resolve()
    return None


def find_torch_wheels(directory: Path | None) -> Path | None:
    """A directory holding ``torch-<pin>+cpu-…whl`` (the on-disk CPU build), or None."""
    candidates = [directory] if directory else [Path("/opt/wheels")]
    for folder in candidates:
        if folder.is_dir() and any(folder.glob(f"torch-{torch_pin()}+cpu-*.whl")):
            return folder
    if directory is not None:
        raise BuildError(f"--torch-wheels {directory}: no torch-{torch_pin()}+cpu wheel there")
    return None


def build_command(
    tool: str,
    tag: str,
    build_args: dict[str, str],
    *,
    wheels: Path | None,
    ca_bundle: Path | None,
) -> list[str]:
    """The builder's command line (no side effects): buildah ``bud`` with layers and the
    read-only build volumes, or ``docker``/``podman build``."""
    build_args = dict(build_args)
    argv = [tool] + (["bud", "--isolation", "chroot", "--layers"] if tool == "buildah"
                     else ["build"])  # fmt: skip
    argv += ["--network", "host", "-f", str(REPO / "Dockerfile"), "-t", tag]
    if tool != "docker":  # docker has no build volumes (see the module docstring)
        if wheels is not None:
            argv += ["--volume", f"{wheels.resolve()}:{BUILD_WHEELS}:ro"]
            build_args["TORCH_FIND_LINKS"] = BUILD_WHEELS
        if ca_bundle is not None:
            argv += ["--volume", f"{ca_bundle}:{BUILD_CA}:ro"]
            build_args["PIP_CERT"] = BUILD_CA
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    return [*argv, str(REPO)]


@contextlib.contextmanager
def build_lock(cache: Path) -> Iterator[None]:
    """Hold the cache's lock: one build at a time (two at once, e.g. ``make image`` while the
    tests build, would debootstrap into the same directory and break each other).

    Args:
        cache: The base's cache directory (made if missing).
    """
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another build ({cache / 'build.lock'})",
                  file=sys.stderr)  # fmt: skip
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def build(args: argparse.Namespace) -> str:
    tool = engine(args.engine)
    # buildah here: one build at a time per cache (the base and the layers are shared)
    with build_lock(Path(args.cache)) if tool == "buildah" else contextlib.nullcontext():
        return _build(args, tool)


def _build(args: argparse.Namespace, tool: str) -> str:
    tag = args.tag or default_tag(args.variant)
    build_args = {"TORCH_VARIANT": args.variant}
    if args.cuda_tag:
        build_args["CUDA_TAG"] = args.cuda_tag
    base = args.base_image
    if base is None and tool == "buildah":  # no daemon: no registry pulls assumed either
        base = local_base(Path(args.cache), rebuild=args.rebuild_base)
    if base is not None:
        build_args["BASE_IMAGE"] = base
    wheels = find_torch_wheels(Path(args.torch_wheels) if args.torch_wheels else None)
    if args.variant == "cuda":
        wheels = None  # the CUDA build: PyTorch's index of the CUDA tag
    argv = build_command(tool, tag, build_args, wheels=wheels, ca_bundle=host_ca_bundle())
    started = time.monotonic()
    print(f"building {tag} with {tool} (base {base or OFFICIAL_BASE})", file=sys.stderr)
    _run(argv, f"{tool} build", stdout=subprocess.DEVNULL if args.quiet else sys.stderr)
    print(f"built {tag} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="build_image.py", description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--cuda-tag", help="PyTorch CUDA wheel index (cu126, cu128, ...)")
    parser.add_argument("--tag", help="image name (default localhost/fedtune:<version>[-cuda])")
    parser.add_argument("--engine", choices=("auto", "docker", "podman", "buildah"),
                        default="auto")  # fmt: skip
    parser.add_argument("--base-image", help=f"BASE_IMAGE (default: {OFFICIAL_BASE}; with "
                        f"buildah, {LOCAL_BASE} made from Debian's packages)")  # fmt: skip
    parser.add_argument("--torch-wheels", help="directory holding the torch CPU wheel "
                        "(default /opt/wheels when it has it; else PyTorch's index)")  # fmt: skip
    parser.add_argument("--cache", default=os.environ.get("FEDTUNE_IMAGE_CACHE",
                                                          "/var/cache/fedtune-image"))  # fmt: skip
    parser.add_argument("--rebuild-base", action="store_true", help="make the Debian base anew")
    parser.add_argument("--quiet", action="store_true", help="hide the builder's output")
    args = parser.parse_args(argv)
    try:
        tag = build(args)
    except BuildError as exc:
        print(f"build_image: error: {exc}", file=sys.stderr)
        return 1
    print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
