"""``python -m tests.lean_script SCRIPT [ARG ...]``: run a script as ``__main__`` with every
in-process ``ray.init`` of it starting a lean head (``tests/ray_start.py``: no log or autoscaler
monitor, dashboard agents sampling every 60 s), for tests that run a script which starts its
own Ray and reads no node metrics or worker logs."""

from __future__ import annotations

import runpy
import sys

from tests.ray_start import lean_head


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` with ``argv`` as its ``sys.argv``, its Ray lean.

    Args:
        argv: The script's path and its arguments.
    """
    sys.argv = list(argv)
    with lean_head():
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
