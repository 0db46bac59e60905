"""Several ``st run`` commands from one interpreter: the OpenAPI fuzz run's callers, one after
the other.

``python st_runs.py REQUEST.json`` reads ``{"argv": [...], "runs": {name: [dir, token]}}``,
imports schemathesis's command line and the hooks ``SCHEMATHESIS_HOOKS`` names once, then for
each run forks a child that runs ``st`` with ``argv`` (``{token}`` replaced by the run's token)
in ``dir``, its output in ``dir/st.out``: the same command, arguments, environment and hooks as
``st`` itself, one run at a time. It prints ``{name: exit status}`` as JSON.

Three ``st`` processes at once cost ~30 CPU-s on 2 cores, these three ~21: each run starts
from an interpreter that has imported schemathesis, and one run at a time does not contend with
the others for the service (which answers three callers at once with more CPU, too).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path


def _run(argv: list[str], workdir: str) -> int:
    """In a forked child: ``st`` with ``argv`` in ``workdir``, its output in ``st.out``."""
    from schemathesis.cli import schemathesis

    os.chdir(workdir)
    out = os.open("st.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    try:
        schemathesis.main(args=argv, prog_name="st")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def main(request_path: str) -> int:
    """Run each run of the request in turn (module docstring); print their exit statuses."""
    request = json.loads(Path(request_path).read_text())
    import schemathesis.cli.commands.run  # noqa: F401  (what every run imports, once)

    if os.environ.get("SCHEMATHESIS_HOOKS"):
        importlib.import_module(os.environ["SCHEMATHESIS_HOOKS"])
    codes = {}
    for name, (workdir, token) in request["runs"].items():
        argv = [a.replace("{token}", token) for a in request["argv"]]
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 70  # an error of this script, not of the run
            try:
                code = _run(argv, workdir)
            finally:
                os._exit(code)
        codes[name] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(json.dumps(codes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
