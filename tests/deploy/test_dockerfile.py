"""The Dockerfile, checked without a Docker engine: a small parser for instructions and stages,
then the issue's rules (multi-stage, CPU/CUDA torch by build arg, `service` extra, non-root,
no dev tools or secrets, ENTRYPOINT/CMD/EXPOSE consistent with the Helm chart, .dockerignore).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import CHART_DIR, REPO_ROOT, container_env, one

DOCKERFILE = REPO_ROOT / "Dockerfile"
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
DEV_TOOLS = ("pytest", "ruff", "gcc", "g++", "build-essential", "make", "git", "mypy")
SECRET_NAME = re.compile(r"(PASSWORD|PASSWD|TOKEN|SECRET|API_?KEY|ACCESS_KEY|CREDENTIAL)", re.I)


# ---- a minimal Dockerfile parser -----------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    """One instruction: upper-case keyword, leading ``--flag=value`` options, the rest, line number."""

    keyword: str
    args: str
    line: int
    flags: dict[str, str] = field(default_factory=dict)

    def exec_form(self) -> list[str]:
        """The JSON (exec) form of CMD/ENTRYPOINT/...; raises if the shell form was used."""
        value = json.loads(self.args)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self.args
        return value


@dataclass(frozen=True)
class Stage:
    base: str
    name: str | None
    instructions: tuple[Instruction, ...]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base} has no {keyword}"
        return found[-1]


@dataclass(frozen=True)
class Dockerfile:
    global_args: tuple[Instruction, ...]
    stages: tuple[Stage, ...]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join continuation lines (trailing backslash); drop comment and blank lines, as BuildKit does."""
    lines: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not current:
            start = number
        continued = stripped.endswith("\\")
        current.append(stripped[:-1].strip() if continued else stripped)
        if not continued:
            lines.append((start, " ".join(part for part in current if part)))
            current = []
    assert not current, "Dockerfile ends inside a line continuation"
    return lines


def _split_flags(args: str) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while args.startswith("--"):
        token, _, args = args.partition(" ")
        name, _, value = token[2:].partition("=")
        flags[name] = value
        args = args.strip()
    return flags, args


def parse_dockerfile(text: str) -> Dockerfile:
    assert not re.search(r"^#\s*escape\s*=", text, flags=re.M), "escape directive not supported"
    global_args: list[Instruction] = []
    stages: list[Stage] = []
    for line, logical in _logical_lines(text):
        keyword, _, rest = logical.partition(" ")
        flags, rest = _split_flags(rest.strip())
        instruction = Instruction(keyword.upper(), rest, line, flags)
        if instruction.keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name, ()))
        elif not stages:
            assert instruction.keyword == "ARG", f"line {line}: {keyword} before the first FROM"
            global_args.append(instruction)
        else:
            last = stages[-1]
            stages[-1] = Stage(last.base, last.name, (*last.instructions, instruction))
    return Dockerfile(tuple(global_args), tuple(stages))


def arg_defaults(instructions: tuple[Instruction, ...] | list[Instruction]) -> dict[str, str]:
    """``ARG NAME=default`` values (quotes removed); ARGs without a default map to ''."""
    defaults = {}
    for instruction in instructions:
        if instruction.keyword == "ARG":
            name, _, value = instruction.args.partition("=")
            defaults[name.strip()] = shlex.split(value)[0] if value.strip() else ""
    return defaults


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


def test_parser_handles_continuations_comments_flags_and_stages() -> None:
    parsed = parse_dockerfile(
        "# syntax=docker/dockerfile:1\nARG V=1\nFROM img:${V} AS one\n"
        "RUN a \\\n    # a comment inside the continuation\n    && b\n\n"
        'FROM scratch\nCOPY --from=one --chown=1:1 /x /y\nCMD ["run", "it"]\n'
    )
    assert arg_defaults(parsed.global_args) == {"V": "1"}
    assert [(s.base, s.name) for s in parsed.stages] == [("img:${V}", "one"), ("scratch", None)]
    assert parsed.stage("one").last("RUN").args == "a && b"
    copy = parsed.final.last("COPY")
    assert copy.flags == {"from": "one", "chown": "1:1"} and copy.args == "/x /y"
    assert parsed.final.last("CMD").exec_form() == ["run", "it"]
    with pytest.raises(AssertionError):
        parse_dockerfile("RUN x\nFROM y")


# ---- stages and the torch variant -----------------------------------------------------------------


def test_multi_stage_build_ships_only_the_virtualenv(dockerfile: Dockerfile) -> None:
    assert len(dockerfile.stages) >= 2
    final = dockerfile.final
    copies = final.all("COPY")
    assert copies and all(c.flags.get("from") in ("deps", "build") for c in copies), (
        "final stage copies the context"
    )
    # the final stage starts from `deps`, which never sees fedtune's code: its venv's layers
    # (about 2 GB) are the image's own, never copied, and a code-only change leaves them cached
    # (rebuild in under 60 s); nothing copies the venv again
    assert final.base == "deps"
    assert not [c for c in copies if c.args.split()[0] == "/opt/venv"]
    # what `deps` copies from the context is in the image too: the lock, nothing else
    deps_copies = dockerfile.stage("deps").all("COPY")
    assert [c.args.split()[:-1] for c in deps_copies] == [["constraints/image.txt"]]
    assert not any("from" in c.flags for c in deps_copies)
    deps = " ".join(i.args for i in dockerfile.stage("deps").instructions)
    assert "fedtune" not in deps.replace("fedtune[", "")
    # fedtune itself: its wheel from `build`, no resolution, no download in the final stage
    [install] = [r for r in final.all("RUN") if "pip install" in r.args]
    assert "--no-deps" in install.args and "--no-index" in install.args
    assert "from=build" in install.flags["mount"]


def _torch_install_script(dockerfile: Dockerfile) -> str:
    runs = [r.args for r in dockerfile.stage("deps").all("RUN") if "--index-url" in r.args]
    assert len(runs) == 1
    return runs[0]


@pytest.mark.parametrize(
    ("variant", "cuda_tag", "index"),
    [
        (None, None, "cpu"),
        ("cpu", "cu128", "cpu"),
        ("cuda", None, "cu128"),
        ("cuda", "cu126", "cu126"),
    ],
)
def test_torch_variant_selects_the_wheel_index(
    dockerfile: Dockerfile, variant: str | None, cuda_tag: str | None, index: str
) -> None:
    """Run the RUN line's shell logic with `pip` stubbed out (sh, as `RUN` does)."""
    sh = shutil.which("sh")
    if sh is None:
        pytest.skip("no POSIX sh to run the RUN script")
    args = arg_defaults(dockerfile.stage("deps").instructions)
    env = {"PATH": "/usr/bin:/bin", **args}
    env |= {k: v for k, v in {"TORCH_VARIANT": variant, "CUDA_TAG": cuda_tag}.items() if v}
    script = 'pip() { echo "pip $*"; }\n' + _torch_install_script(dockerfile)
    done = subprocess.run([sh, "-c", script], env=env, capture_output=True, text=True, check=True)
    version = args["TORCH_VERSION"]
    expected = f"pip install torch=={version} --index-url https://download.pytorch.org/whl/{index}"
    assert done.stdout.strip() == expected


def test_torch_find_links_replaces_the_index(dockerfile: Dockerfile) -> None:
    """``TORCH_FIND_LINKS`` (a mirror holding the wheel; ``make image`` serves the one on disk)
    instead of PyTorch's index, whatever the variant."""
    sh = shutil.which("sh") or pytest.skip("no POSIX sh")
    args = arg_defaults(dockerfile.stage("deps").instructions)
    assert args["TORCH_FIND_LINKS"] == ""  # the default build uses PyTorch's index
    env = {"PATH": "/usr/bin:/bin", **args, "TORCH_FIND_LINKS": "http://127.0.0.1:8111/"}
    script = 'pip() { echo "pip $*"; }\n' + _torch_install_script(dockerfile)
    done = subprocess.run([sh, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == (
        f"pip install torch=={args['TORCH_VERSION']} --find-links http://127.0.0.1:8111/"
    )


def test_the_base_image_is_an_argument_defaulting_to_the_official_one(
    dockerfile: Dockerfile,
) -> None:
    args = arg_defaults(dockerfile.global_args)
    assert args["BASE_IMAGE"] == "python:${PYTHON_VERSION}-slim-bookworm"
    assert args["PYTHON_VERSION"] == "3.11"
    assert [stage.base for stage in dockerfile.stages] == ["${BASE_IMAGE}", "deps", "deps"]


def test_unknown_torch_variant_stops_the_build(dockerfile: Dockerfile) -> None:
    sh = shutil.which("sh") or pytest.skip("no POSIX sh")
    script = 'pip() { echo "pip $*"; }\n' + _torch_install_script(dockerfile)
    env = {
        "PATH": "/usr/bin:/bin",
        "TORCH_VARIANT": "rocm",
        "CUDA_TAG": "cu128",
        "TORCH_VERSION": "0",
    }
    done = subprocess.run([sh, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "TORCH_VARIANT must be cpu or cuda" in done.stderr
    assert "pip install" not in done.stdout


def test_torch_version_is_the_pyproject_pin(dockerfile: Dockerfile) -> None:
    engine = PYPROJECT["project"]["optional-dependencies"]["engine"]
    pins = [d for d in engine if re.match(r"torch\s*==", d)]
    assert len(pins) == 1
    assert (
        arg_defaults(dockerfile.stage("deps").instructions)["TORCH_VERSION"]
        == pins[0].split("==")[1].strip()
    )


# ---- extras, dev tools, secrets -------------------------------------------------------------------


def _extras_closure(extra: str) -> set[str]:
    """The extra plus every `fedtune[...]` extra it pulls in, recursively."""
    seen: set[str] = set()
    todo = [extra]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in PYPROJECT["project"]["optional-dependencies"][name]:
            match = re.fullmatch(r"fedtune\[([^\]]+)\]", requirement.replace(" ", ""))
            if match:
                todo.extend(match.group(1).split(","))
    return seen


def _installed_extras(dockerfile: Dockerfile) -> set[str]:
    extras: set[str] = set()
    for stage in dockerfile.stages:
        for run in stage.all("RUN"):
            for match in re.finditer(r"\"?(?:\.|fedtune)\[([^\]]+)\]\"?", run.args):
                extras.update(name.strip() for name in match.group(1).split(","))
    return extras


def test_installed_extras_exist_and_bring_service_and_tune(dockerfile: Dockerfile) -> None:
    extras = _installed_extras(dockerfile)
    assert extras == {"service"}
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"])
    assert {"service", "tune"} <= _extras_closure("service")
    assert "dev" not in set().union(*(_extras_closure(e) for e in extras))


def test_no_dev_tools_in_the_image(dockerfile: Dockerfile) -> None:
    optional = PYPROJECT["project"]["optional-dependencies"]
    shipped = [r for extra in _extras_closure("service") for r in optional[extra]]
    shipped += PYPROJECT["project"]["dependencies"]
    names = {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in shipped}
    assert not names & set(DEV_TOOLS)
    # the final stage and `deps`, which it starts from: both make the image's layers
    for run in [*dockerfile.stage("deps").all("RUN"), *dockerfile.final.all("RUN")]:
        words = set(re.split(r"[\s;&|]+", run.args))
        assert not words & set(DEV_TOOLS), f"line {run.line} installs a dev tool"


def test_no_secrets_in_args_or_env(dockerfile: Dockerfile) -> None:
    instructions = [
        *dockerfile.global_args,
        *(i for s in dockerfile.stages for i in s.instructions),
    ]
    for instruction in instructions:
        if instruction.keyword in {"ARG", "ENV"}:
            names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", " " + instruction.args)
            names = names or [instruction.args.split()[0]]
            assert not [n for n in names if SECRET_NAME.search(n)], f"line {instruction.line}"
        assert "--mount=type=secret" not in instruction.args or instruction.keyword == "RUN"


# ---- user, entrypoint, port: consistent with the chart --------------------------------------------


def test_final_stage_runs_as_a_numeric_non_root_user(dockerfile: Dockerfile) -> None:
    user = dockerfile.final.last("USER").args
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or gid.isdigit()), user
    setup = " ".join(r.args for r in dockerfile.final.all("RUN"))
    assert f"--uid {uid}" in setup
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["api"]["podSecurityContext"]["runAsUser"] == int(uid)
    assert values["api"]["podSecurityContext"]["runAsGroup"] == int(gid or uid)


def test_entrypoint_cmd_and_port_match_the_chart(dockerfile: Dockerfile, render: Any) -> None:
    final = dockerfile.final
    assert final.last("ENTRYPOINT").exec_form() == ["fedtune"]
    assert "fedtune" in PYPROJECT["project"]["scripts"]
    cmd = final.last("CMD").exec_form()
    assert cmd == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    exposed = [int(p.split("/")[0]) for e in final.all("EXPOSE") for p in e.args.split()]
    container = one(render({}), "Deployment", "demo-fedtune")["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "command" not in container, "the chart must keep the image's ENTRYPOINT"
    assert container["args"] == cmd
    assert exposed == [p["containerPort"] for p in container["ports"]] == [int(cmd[-1])]
    assert container_env(container)["FEDTUNE_WORKDIR"]["value"] == "/data"


# ---- build context ---------------------------------------------------------------------------------


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """Translate one .dockerignore pattern (Go filepath.Match plus `**`) into a regex."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] in "*?":
            out.append("[^/]*" if pattern[i] == "*" else "[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out.append(pattern[i : end + 1])
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def excluded(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for raw in patterns:
        negate = raw.startswith("!")
        regex = _dockerignore_regex(raw[1:] if negate else raw)
        if any(regex.fullmatch(c) for c in candidates):
            verdict = not negate
    return verdict


def dockerignore() -> list[str]:
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip().rstrip("/") for line in lines if line.strip() and not line.startswith("#")]


def test_dockerignore_matcher_follows_docker_semantics() -> None:
    patterns = ["*", "!src", "**/__pycache__"]
    assert excluded(".env", patterns) and excluded("docs/x.md", patterns)
    assert not excluded("src/a/b.py", patterns)
    assert excluded("src/a/__pycache__/b.pyc", patterns)


def test_build_context_holds_what_copy_needs_and_nothing_secret(dockerfile: Dockerfile) -> None:
    patterns = dockerignore()
    sources = [
        source
        for stage in dockerfile.stages
        for copy in stage.all("COPY")
        if "from" not in copy.flags
        for source in copy.args.split()[:-1]
    ]
    assert sources
    for source in sources:
        assert not excluded(source.rstrip("/"), patterns), f"{source} is excluded by .dockerignore"
        assert (REPO_ROOT / source).exists(), f"COPY source {source} does not exist"
    for path in (
        ".git/config",
        ".venv/bin/python",
        ".env",
        "kubeconfig",
        "tests/deploy/conftest.py",
        "helm/fedtune/values.yaml",
        "fedtune/__pycache__/cli.cpython-311.pyc",
        "fedtune.egg-info/PKG-INFO",
        "fedtune.db",
    ):
        assert excluded(path, patterns), f"{path} would be sent to the daemon"
