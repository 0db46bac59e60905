"""Build the light client's wheel, the one ``fedtune serve`` hands out at ``/client/``.

    python tools/client_wheel.py [--out dist]    # make dist

The wheel is fedtune itself, ``fedtune-<version>-py3-none-any.whl``: installed without extras
it is the light client (the SDK and the service's client verbs; httpx, pydantic and PyYAML from
the member's own index), and its extras still name the rest. It is built as the image's is
(``Dockerfile``, stage ``build``): ``pip wheel --no-deps --no-build-isolation`` of
``pyproject.toml``, ``README.md`` and ``fedtune/``, copied first into a fresh directory, so
nothing is written into the checkout and no stale ``build/lib`` of an earlier build (a module
since deleted) can slip into it. Any earlier ``fedtune-*.whl`` in the output folder is removed:
the service hands out what is there. It builds with the running Python's setuptools when it has
them (the development venv does: no download), else in pip's isolated build environment, which
fetches the build requirements of ``pyproject.toml`` from pip's index.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: what the wheel is built from (the Dockerfile's ``COPY`` lines of the same stage)
SOURCES = ("pyproject.toml", "README.md", "fedtune")


def build(out: Path, repo: Path = REPO, python: str = sys.executable) -> Path:
    """Build the wheel into ``out``.

    Args:
        out: the output folder (created if missing); earlier ``fedtune-*.whl`` there are removed.
        repo: the checkout to build.
        python: the interpreter whose pip builds it.

    Returns:
        The wheel's path.

    Raises:
        RuntimeError: pip failed (its output attached), or it did not make exactly one wheel.
    """
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("fedtune-*.whl"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="fedtune-wheel-") as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for name in SOURCES:
            path = repo / name
            if path.is_dir():
                shutil.copytree(path, source / name, ignore=ignore)
            else:
                shutil.copy2(path, source / name)
        built = Path(tmp) / "wheels"
        argv = [python, "-m", "pip", "wheel", "--no-deps"]
        if python == sys.executable and importlib.util.find_spec("setuptools") is not None:
            argv.append("--no-build-isolation")  # this Python's setuptools: nothing to fetch
        done = subprocess.run(
            [*argv, "--disable-pip-version-check", "--wheel-dir", str(built), str(source)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pip wheel failed:\n{done.stdout}{done.stderr}")
        wheels = sorted(built.glob("fedtune-*-py3-none-any.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one fedtune wheel, pip made {[w.name for w in wheels]}")
        return Path(shutil.copy2(wheels[0], out / wheels[0].name))


def main(argv: list[str] | None = None) -> int:
    """Build the wheel and print its path.

    Args:
        argv: ``[--out DIR]`` (default: the command line).

    Returns:
        0, or 1 when the build failed (the reason on stderr).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "dist"), help="output folder (dist/)")
    args = parser.parse_args(argv)
    try:
        wheel = build(Path(args.out))
    except (RuntimeError, OSError) as exc:
        print(f"client_wheel: {exc}", file=sys.stderr)
        return 1
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
