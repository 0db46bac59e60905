"""Ray's dashboard agent as a node of a minimal Ray install runs it: with none of its modules.

A lean head without a dashboard (:mod:`.ray_lean`) has its raylet start the agent as
``python -u <this file> <Ray's dashboard/agent.py> <its arguments>``: this file is put where Ray
puts a memory profiler's command, before the agent's script. It runs that script as
``python -u agent.py <its arguments> --minimal`` would run it on a node of ``pip install ray``
(no ``ray[default]``), where Ray passes ``--minimal`` itself: the agent's dependency check
(``ray.dashboard.optional_deps``) fails, so it loads none of its modules (no reporter or
metrics agent, event, log, health-check or job agent) and starts no gRPC or HTTP server. Nor
does it import every module of Ray's dashboard to find that none is minimal, as Ray's own search
does (about 0.8 CPU-s). What the node's workers need of an agent, the runtime-env agent, is a
process of its own and is unchanged.

Only the standard library and Ray: this runs in the agent's own process, before Ray's script.
"""

from __future__ import annotations

import os
import sys

#: the flag of Ray's agent script for a minimal node (no modules, no gRPC or HTTP server)
MINIMAL = "--minimal"
#: the module whose import is Ray's check for its dashboard's dependencies
OPTIONAL_DEPS = "ray.dashboard.optional_deps"


def _minimal_modules(module_type: type) -> list[type]:
    """The modules of ``module_type`` that a minimal agent loads, without importing every
    module of Ray's dashboard to find them (Ray's ``get_all_modules`` imports them all, to
    keep only those whose ``is_minimal_module()`` is true: none of the agent's, in Ray 2.60).

    Args:
        module_type: the modules' base class (``DashboardAgentModule``).

    Returns:
        The minimal ones of its subclasses imported so far: none.
    """
    return [
        module
        for module in module_type.__subclasses__()
        if getattr(module, "__ray_dashboard_module_enable__", True) and module.is_minimal_module()
    ]


def main(argv: list[str]) -> None:
    """Run Ray's agent script ``argv[0]`` with arguments ``argv[1:]`` as a minimal agent.

    Args:
        argv: the agent script's path and its arguments (as the raylet passes them).
    """
    script, args = argv[0], argv[1:]
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        # as ``python agent.py`` has it: the script's folder, not this one (whose modules are
        # not Ray's); with ``PYTHONSAFEPATH`` neither is on the path
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.modules[OPTIONAL_DEPS] = None  # type: ignore[assignment]  # its import: ImportError
    sys.argv = [script, *args, *([] if MINIMAL in args else [MINIMAL])]
    import runpy

    import ray.dashboard.utils

    ray.dashboard.utils.get_all_modules = _minimal_modules

    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
