"""The reference pages are what the code generates (``tools/docs_gen.py --check``), and the
check can fail: a page generated from a changed parser or a changed file differs."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pydantic
import pytest

from .pages import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def docs_gen():
    spec = importlib.util.spec_from_file_location("docs_gen", REPO / "tools" / "docs_gen.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_gen"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("docs_gen", None)


@pytest.fixture(scope="module")
def generated(docs_gen) -> dict[str, str]:
    return docs_gen.generate()


def test_committed_reference_pages_are_current(docs_gen, generated) -> None:
    problems = docs_gen.stale(generated)
    assert not problems, "\n".join(problems)


def test_the_generated_pages_are_the_reference_pages_of_the_nav(generated) -> None:
    import yaml

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    reference = next(item["Reference"] for item in nav if "Reference" in item)
    listed = {f"docs/{page}" for entry in reference for page in entry.values()}
    markdown = {name for name in generated if name.endswith(".md")}
    assert markdown <= listed, f"generated but not in the nav: {sorted(markdown - listed)}"


def test_an_extra_cli_option_makes_the_check_fail(docs_gen, tmp_path: Path) -> None:
    from fedtune.cli import build_parser

    parser = build_parser()
    root = tmp_path / "repo"
    page = root / "docs" / "reference" / "cli.md"
    page.parent.mkdir(parents=True)
    page.write_text(docs_gen.cli_page(parser))
    assert docs_gen.stale({"docs/reference/cli.md": docs_gen.cli_page(parser)}, root) == []
    verb = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    verb.choices["tune"].add_argument("--not-documented", help="an option the page lacks")
    problems = docs_gen.stale({"docs/reference/cli.md": docs_gen.cli_page(parser)}, root)
    assert len(problems) == 1 and problems[0].startswith("docs/reference/cli.md: stale")
    assert "--not-documented" in problems[0]


def test_check_exits_1_with_one_line_per_stale_page(
    docs_gen, generated, monkeypatch, tmp_path: Path, capsys
) -> None:
    root = tmp_path / "repo"
    for name, text in generated.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "docs/reference/spec.md").write_text("# edited by hand\n")
    (root / "docs/reference/environment.md").unlink()
    monkeypatch.setattr(docs_gen, "REPO", root)
    monkeypatch.setattr(docs_gen, "generate", lambda: generated)
    assert docs_gen.main(["--check"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("docs/reference/environment.md: missing")
    assert lines[1].startswith("docs/reference/spec.md: stale")
    assert docs_gen.main(["--write"]) == 0
    assert docs_gen.main(["--check"]) == 0


def test_generation_ignores_the_environment(docs_gen, generated, monkeypatch) -> None:
    """A variable the code reads (a client URL, a service limit) does not leak into a page."""
    monkeypatch.setenv("FEDTUNE_URL", "http://elsewhere.example:1")
    monkeypatch.setenv("FEDTUNE_MAX_TRIALS", "7")
    pages = docs_gen.generate()
    assert pages == generated
    assert "elsewhere.example" not in "".join(pages.values())


def test_every_strategy_has_a_description(docs_gen) -> None:
    """The strategies reference lists every strategy of the table, each with its description."""
    from fedtune.tuning.strategies import STRATEGIES, Strategy

    assert sorted(STRATEGIES) == sorted(Strategy)
    page = docs_gen.strategies_page()
    for strategy, d in STRATEGIES.items():
        assert d.description.strip() and d.summary.strip()
        assert f"| `{strategy.value}` |" in page


def _undescribed(docs_gen, model) -> list[str]:
    """Fields of ``model`` with neither a ``Field(description=…)`` nor a ``#:``/trailing comment
    (what ``environment_page`` reads before falling back to a Helm value's text)."""
    comments = docs_gen.field_comments(model)
    return [
        name
        for name, info in model.model_fields.items()
        if not (info.description or comments.get(name, "")).strip()
    ]


def test_every_service_setting_has_a_description(docs_gen) -> None:
    """``reference/environment.md`` describes each setting from ``settings.py`` itself; a new
    setting without a ``#:`` comment (or a Field description) fails here."""
    from fedtune.service.settings import Settings

    missing = [
        docs_gen._env_name(name, Settings.model_fields[name])
        for name in _undescribed(docs_gen, Settings)
    ]
    assert not missing, f"settings without a #: comment in fedtune/service/settings.py: {missing}"


class _Described(pydantic.BaseModel):
    #: above
    above: int = 1
    trailing: int = 2  # at the end of the line
    field: int = pydantic.Field(3, description="in the Field")
    bare: int = 4


def test_the_description_check_finds_an_undescribed_field(docs_gen) -> None:
    assert _undescribed(docs_gen, _Described) == ["bare"]


@pytest.fixture(scope="module")
def docs_includes():
    spec = importlib.util.spec_from_file_location(
        "docs_includes", REPO / "tools" / "docs_includes.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_file_the_docs_show_is_the_file(docs_includes) -> None:
    assert not docs_includes.stale(), "\n".join(docs_includes.stale())


def test_a_shown_file_that_changed_is_stale_until_written(docs_includes, tmp_path) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "s.yaml").write_text("name: new\ntrials: 2\n")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "p.md"
    page.write_text('# P\n\n  ```yaml title="examples/s.yaml"\n  name: old\n  ```\n\nafter\n')
    assert docs_includes.stale(tmp_path) == [
        "docs/p.md: a block titled with a file differs from the file (run `make docs-gen`)"
    ]
    page.write_text(docs_includes.expanded(page.read_text(), tmp_path))
    assert page.read_text() == (
        '# P\n\n  ```yaml title="examples/s.yaml"\n  name: new\n  trials: 2\n  ```\n\nafter\n'
    )
    assert docs_includes.stale(tmp_path) == []
