"""Each layer reads its environment in one place: a read of ``os.environ`` elsewhere fails here.

The readers: ``fedtune/service/settings.py`` (the service), ``fedtune/client_settings.py`` (the
service client of the command line), ``fedtune/tuning/env.py`` (``fedtune tune``, study drivers,
trials). A read is ``os.environ[...]``, ``os.environ.get``, ``os.getenv`` and any other use of
``os.environ`` that is not a write (assigning, deleting, ``update``, ``clear``, a ``pop`` or
``setdefault`` whose value is dropped): iterating it, copying it, passing it on.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: the modules that read the environment, one per layer
READERS = frozenset(
    {
        "fedtune/service/settings.py",
        "fedtune/client_settings.py",
        "fedtune/tuning/env.py",
    }
)
#: (module, function) reads that are no settings, each with its reason
ALLOWED: dict[tuple[str, str], str] = {
    ("fedtune/service/child_env.py", "child_env"): (
        "copies the allowlisted variables of the environment into a child's"
    ),
    ("fedtune/service/child_env.py", "mlflow_server_env"): (
        "copies the allowlisted variables of the environment into the MLflow server's"
    ),
    ("fedtune/service/study_code.py", "_shipped_by_the_job"): (
        "Ray's job supervisor's description of the running job, not a setting"
    ),
    ("fedtune/service/backends/kubernetes.py", "load_api_client"): (
        "the kubernetes client's own KUBECONFIG, passed at call time (the client reads it once)"
    ),
    ("fedtune/tuning/driver/fit.py", "_tune_environment"): (
        "saves the Ray Tune variables it sets for fit, to restore them"
    ),
    ("fedtune/tuning/mlflow/client.py", "mlflow_variable"): (
        "sets one of MLflow's own switches for a block and restores it"
    ),
    ("fedtune/service/mlflow_run.py", "start"): (
        "the MLflow server process's inputs from the command that exec'd it: MLflow's own"
        " MLFLOW_BACKEND_STORE_URI (which `mlflow server` read itself; never on a command line:"
        " it may hold a password) and the banner, removed as it is read"
    ),
    ("fedtune/trainers/allocator.py", "keep_freed_memory"): (
        "glibc's own malloc variables, read to leave a process's own thresholds alone"
    ),
}
_WRITES = {"update", "clear"}
_WRITES_WHEN_DROPPED = {"pop", "setdefault"}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _where(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    """The qualified name of the function or class around ``node`` (``""``: the module)."""
    names = []
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
    return ".".join(reversed(names))


def _is_write(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``node`` (``os.environ``) is only written to where it stands."""
    parent = parents.get(node)
    if isinstance(parent, ast.Subscript):
        return isinstance(parent.ctx, ast.Store | ast.Del)
    if isinstance(parent, ast.Attribute) and isinstance(parents.get(parent), ast.Call):
        if parent.attr in _WRITES:
            return True
        return parent.attr in _WRITES_WHEN_DROPPED and isinstance(
            parents.get(parents[parent]), ast.Expr
        )
    return False


def environment_reads(source: str) -> list[tuple[int, str]]:
    """The environment reads of a module.

    Args:
        source: the module's source.

    Returns:
        ``(line, function)`` of each read, the function qualified (``Class.method``; ``""``:
        module level).
    """
    if "environ" not in source and "getenv" not in source:
        return []  # every form read below spells one of them: most modules are not parsed
    tree = ast.parse(source)
    parents = _parents(tree)
    environ_names, getenv_names = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if alias.name == "environ":
                    environ_names.add(alias.asname or alias.name)
                elif alias.name == "getenv":
                    getenv_names.add(alias.asname or alias.name)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            is_os = node.value.id == "os"
            environ = is_os and node.attr in ("environ", "environb")
            getenv = is_os and node.attr in ("getenv", "getenvb")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            environ, getenv = node.id in environ_names, node.id in getenv_names
        else:
            continue
        if getenv or (environ and not _is_write(node, parents)):
            found.append((node.lineno, _where(node, parents)))
    return sorted(found)


def test_environment_is_read_in_one_place_per_layer() -> None:
    """No module outside :data:`READERS` reads the environment, but :data:`ALLOWED`."""
    unexpected, used = [], set()
    for path in sorted((REPO / "fedtune").rglob("*.py")):
        module = path.relative_to(REPO).as_posix()
        if module in READERS:
            continue
        for line, where in environment_reads(path.read_text()):
            if (module, where) in ALLOWED:
                used.add((module, where))
            else:
                unexpected.append(f"{module}:{line} ({where or 'module level'})")
    assert not unexpected, (
        "environment read outside the settings modules (read it through "
        "fedtune/service/settings.py, fedtune/client_settings.py or fedtune/tuning/env.py): "
        + ", ".join(unexpected)
    )
    assert not set(ALLOWED) - used, f"allowed reads that are gone: {sorted(set(ALLOWED) - used)}"


def test_scanner_finds_reads_and_ignores_writes() -> None:
    """The scanner sees each form of read, by module, function and method, and no write."""
    source = (
        "import os\n"
        "from os import environ as env, getenv\n"
        "A = os.environ['A']\n"
        "def f():\n"
        "    return os.environ.get('B')\n"
        "class C:\n"
        "    def m(self, environ=os.environ):\n"
        "        return os.getenv('D') or getenv('E') or env.get('F')\n"
        "def g():\n"
        "    saved = os.environ.pop('G', None)\n"
        "    return dict(os.environ), saved\n"
        "def writes():\n"
        "    os.environ['H'] = '1'\n"
        "    del os.environ['H']\n"
        "    os.environ.update(I='1')\n"
        "    os.environ.pop('J', None)\n"
        "    os.environ.setdefault('K', '1')\n"
    )
    assert environment_reads(source) == [
        (3, ""),
        (5, "f"),
        (7, "C.m"),
        (8, "C.m"),
        (8, "C.m"),
        (8, "C.m"),
        (10, "g"),
        (11, "g"),
    ]
