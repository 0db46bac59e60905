"""Image build times and size: ``python benchmarks/image_build.py``.

Measures ``deploy/build_image.py`` (what ``make image`` runs) as whole processes:

* ``rebuild_unchanged_s``: a build of the current tree when its layers are cached;
* ``rebuild_code_change_s``: a build after a code-only change — a copy of the build context
  with one comment added to ``fedtune/__init__.py``, tagged apart (``localhost/fedtune-bench``),
  so the real tag is untouched; the goal is < 60 s;
* ``image_size_bytes``: the size buildah reports for ``localhost/fedtune:<version>``;
* ``cold_build_s`` (``--cold``: removes the tag, the bench tag and buildah's dangling layers
  first, keeps the Debian base) and ``base_build_s`` (``--cold-base``: the Debian base anew).

Medians of ``--repeats`` runs go to ``benchmarks/results/image_build.json`` with the machine,
versions and load averages. Needs buildah and root, like the build itself.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "image_build.json"
CONTEXT = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "README.md",
    "constraints",
    "deploy",
    "fedtune",
)
BENCH_TAG = "localhost/fedtune-bench:code-change"


def _build(repo: Path, *extra: str) -> float:
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            str(repo / "deploy" / "build_image.py"),
            "--engine",
            "buildah",
            "--quiet",
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"build failed: {done.stderr.strip()[-1000:]}")
    return time.monotonic() - started


def _size(ref: str) -> int:
    out = subprocess.run(
        ["buildah", "images", "--format", "{{.Size}}", "--noheading", ref],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    number, unit = out.split()[0], out.split()[1] if len(out.split()) > 1 else "B"
    scale = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "kB": 1e3}
    return int(float(number) * scale.get(unit, 1))


def _changed_copy(root: Path, n: int) -> Path:
    copy = root / f"ctx-{n}"
    copy.mkdir(parents=True)
    for name in CONTEXT:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, copy / name)
    init = copy / "fedtune" / "__init__.py"
    init.write_text(init.read_text() + f"\n# benchmark change {n} {time.time()}\n")
    return copy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also time a build without layers")
    parser.add_argument("--cold-base", action="store_true", help="also make the Debian base anew")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "deploy"))
    import build_image

    tag = build_image.default_tag("cpu")
    result: dict = {
        "benchmark": "image_build",
        "tag": tag,
        "environment": environment(),
        "buildah": subprocess.run(
            ["buildah", "--version"], capture_output=True, text=True
        ).stdout.strip(),
    }
    if args.cold_base:
        result["base_build_s"] = _build(REPO, "--rebuild-base")
    if args.cold:
        subprocess.run(["buildah", "rmi", "-f", tag, BENCH_TAG], capture_output=True)
        subprocess.run(["buildah", "rmi", "--prune"], capture_output=True)
        result["cold_build_s"] = _build(REPO)
    _build(REPO)  # warm the cache for this tree
    unchanged = [_build(REPO) for _ in range(args.repeats)]
    with tempfile.TemporaryDirectory() as tmp:
        changed = [
            _build(_changed_copy(Path(tmp), n), "--tag", BENCH_TAG) for n in range(args.repeats)
        ]
    subprocess.run(["buildah", "rmi", "-f", BENCH_TAG], capture_output=True)
    result |= {
        "repeats": args.repeats,
        "rebuild_unchanged_s": {"median": statistics.median(unchanged), "all": unchanged},
        "rebuild_code_change_s": {"median": statistics.median(changed), "all": changed},
        "image_size_bytes": _size(tag),
        "load_average_after": [round(x, 2) for x in __import__("os").getloadavg()],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.output.exists():  # keep the cold figures of an earlier --cold run
        earlier = json.loads(args.output.read_text())
        for key in ("cold_build_s", "base_build_s"):
            if key not in result and key in earlier:
                result[f"{key}_earlier"] = earlier.get(key) or earlier.get(f"{key}_earlier")
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "environment"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
