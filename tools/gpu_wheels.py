"""The wheels a GPU host needs for ``benchmarks/gpu_study.sh``, in parts that travel in calls.

A lent GPU machine reaches no registry, and each call carries at most 64 MiB of ignored files.
``download`` resolves what a study needs beyond the host's image (Ray Tune, Optuna, MLflow, the
light install's pydantic …) for the host's Python (CPython 3.12, manylinux x86_64), leaves out
the projects the image already has (:data:`ON_THE_IMAGE`, or ``--have`` with the host's
``pip list --format freeze``), and lays the rest out as carry groups ``<dest>/g1``, ``g2`` …,
each under ``--group-mib``: a wheel larger than that (Ray's, 77 MB) is cut into numbered parts
that go in consecutive groups. Carry ``g1`` in one call and ``g2`` in the next on the same warm
machine (ignored paths written there stay). ``assemble`` (stdlib only, run on the host by
``gpu_study.sh``) puts every wheel back together and checks each one's SHA-256 against the
manifest ``download`` wrote.

Usage::

    python tools/gpu_wheels.py download [--dest .whl]
    python3 tools/gpu_wheels.py assemble .whl /tmp/wheels
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: what a study needs, with the pins of pyproject.toml (torch comes with the host's image)
NEEDED = (
    "ray[tune]>=2.40",
    "optuna>=4.0",
    "cmaes>=0.10",
    "mlflow==3.17.2",
    "pydantic>=2.6",
    "pyyaml>=6",
    "httpx>=0.27",
)
#: projects the lent GPU machines' image holds (its package list as sessions read it in 2026-11);
#: a wheel of one of them is left out (``--have`` replaces this list)
ON_THE_IMAGE = frozenset(
    [
        "absl-py",
        "aiohappyeyeballs",
        "aiohttp",
        "aiosignal",
        "annotated-doc",
        "anyio",
        "attrs",
        "certifi",
        "charset-normalizer",
        "click",
        "cloudpickle",
        "colorama",
        "contourpy",
        "cycler",
        "filelock",
        "fonttools",
        "frozenlist",
        "fsspec",
        "grpcio",
        "h11",
        "h5py",
        "httpcore",
        "httpx",
        "idna",
        "jinja2",
        "joblib",
        "kiwisolver",
        "markdown",
        "markdown-it-py",
        "markupsafe",
        "matplotlib",
        "mdurl",
        "msgpack",
        "multidict",
        "narwhals",
        "networkx",
        "numpy",
        "packaging",
        "pandas",
        "pillow",
        "pluggy",
        "prometheus-client",
        "propcache",
        "protobuf",
        "psutil",
        "pyarrow",
        "pygments",
        "pyparsing",
        "python-dateutil",
        "pyyaml",
        "requests",
        "rich",
        "scikit-learn",
        "scipy",
        "setuptools",
        "six",
        "sympy",
        "tabulate",
        "threadpoolctl",
        "tqdm",
        "typing-extensions",
        "urllib3",
        "werkzeug",
        "wheel",
        "wrapt",
        "yarl",
        "zipp",
    ]
)
MANIFEST = "manifest.json"
_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
)


def project(wheel: str) -> str:
    """The normalised project name of a wheel file (``scikit_learn-1.9-…`` → ``scikit-learn``)."""
    return re.sub(r"[-_.]+", "-", wheel.split("-")[0]).lower()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def lay_out(wheels: list[Path], dest: Path, group_bytes: int) -> dict:
    """Copy ``wheels`` into carry groups under ``dest`` (see the module docstring).

    Largest first; a whole wheel goes in the first group with room for it (first fit), a wheel
    larger than a group fills the last group and as many new ones as it needs.

    Args:
        wheels: The wheel files.
        dest: The folder that gets ``g1``, ``g2`` … and the manifest.
        group_bytes: The most bytes of one group.

    Returns:
        The manifest: each wheel's SHA-256 and its parts (``group/file`` in order).
    """
    groups: list[list[tuple[str, bytes | Path]]] = []
    rooms: list[int] = []
    manifest: dict = {"wheels": {}}

    def put(index: int, name: str, item: bytes | Path, size: int) -> str:
        if index == len(groups):
            groups.append([])
            rooms.append(group_bytes)
        groups[index].append((name, item))
        rooms[index] -= size
        return f"g{index + 1}/{name}"

    for wheel in sorted(wheels, key=lambda w: (-w.stat().st_size, w.name)):
        size = wheel.stat().st_size
        if size <= group_bytes:
            index = next((i for i, room in enumerate(rooms) if room >= size), len(groups))
            parts = [put(index, wheel.name, wheel, size)]
        else:
            data, parts, offset = wheel.read_bytes(), [], 0
            index = len(groups) - 1 if rooms and rooms[-1] > 0 else len(groups)
            while offset < size:
                room = rooms[index] if index < len(groups) else group_bytes
                chunk = data[offset : offset + room]
                parts.append(put(index, f"{wheel.name}.part-{len(parts):02d}", chunk, len(chunk)))
                offset, index = offset + len(chunk), index + 1
        manifest["wheels"][wheel.name] = {"sha256": sha256(wheel), "parts": parts}
    for i, group in enumerate(groups, start=1):
        folder = dest / f"g{i}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, item in group:
            if isinstance(item, Path):
                shutil.copyfile(item, folder / name)
            else:
                (folder / name).write_bytes(item)
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def assemble(source: Path, dest: Path) -> list[Path]:
    """Put the wheels of ``source``'s groups back together in ``dest``, each checked.

    Args:
        source: The folder ``download`` laid out (its manifest and groups).
        dest: Where the whole wheels go.

    Returns:
        The wheels.

    Raises:
        SystemExit: A part is missing or a wheel's SHA-256 differs (one line).
    """
    manifest = json.loads((source / MANIFEST).read_text())
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, entry in manifest["wheels"].items():
        missing = [p for p in entry["parts"] if not (source / p).is_file()]
        if missing:
            raise SystemExit(f"gpu_wheels: {name}: missing {missing[0]} (carry its group)")
        target = dest / name
        with target.open("wb") as fh:
            for part in entry["parts"]:
                fh.write((source / part).read_bytes())
        if sha256(target) != entry["sha256"]:
            raise SystemExit(f"gpu_wheels: {name}: SHA-256 differs from the manifest's")
        out.append(target)
    return out


def download(dest: Path, have: frozenset[str], group_mib: int) -> dict:
    """Download the wheels (pip, for CPython 3.12 manylinux x86_64) and lay them out."""
    raw = dest / "downloaded"
    command = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", "-d", str(raw)]
    for platform in _PLATFORMS:
        command += ["--platform", platform]
    subprocess.run([*command, *NEEDED], check=True)
    wheels = [w for w in raw.glob("*.whl") if project(w.name) not in have]
    manifest = lay_out(wheels, dest, group_mib << 20)
    shutil.rmtree(raw)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    down = verbs.add_parser("download")
    down.add_argument("--dest", type=Path, default=Path(".whl"))
    down.add_argument("--have", type=Path, help="the host's `pip list --format freeze`")
    down.add_argument("--group-mib", type=int, default=48)  # + the working tree: < 64 MiB
    build = verbs.add_parser("assemble")
    build.add_argument("source", type=Path)
    build.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "assemble":
        wheels = assemble(args.source, args.dest)
        print(f"{len(wheels)} wheels in {args.dest}")
        return 0
    have = ON_THE_IMAGE
    if args.have is not None:
        lines = args.have.read_text().splitlines()
        have = frozenset(project(line.split("==")[0]) for line in lines if "==" in line)
    manifest = download(args.dest, have, args.group_mib)
    groups = sorted({p.split("/")[0] for w in manifest["wheels"].values() for p in w["parts"]})
    print(f"{len(manifest['wheels'])} wheels in {len(groups)} carry groups: {', '.join(groups)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
