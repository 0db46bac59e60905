"""The SDK reference reads on GitHub: ``docs/reference/sdk.md`` is generated Markdown (no
mkdocstrings ``:::`` directive, which only the built site renders), and it names every public
method of ``Client`` and ``Study`` with its summary line, every answer class and every error."""

from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest

from fedtune import errors
from fedtune.client import Client, Study

from .pages import REPO

PAGE = REPO / "docs" / "reference" / "sdk.md"


@pytest.fixture(scope="module")
def docs_sdk():
    spec = importlib.util.spec_from_file_location("docs_sdk", REPO / "tools" / "docs_sdk.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_sdk"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("docs_sdk", None)


def test_the_page_has_no_directive_only_the_site_renders() -> None:
    assert not [line for line in PAGE.read_text().splitlines() if line.startswith(":::")]


@pytest.mark.parametrize("cls", [Client, Study])
def test_every_public_method_is_there_with_its_summary(docs_sdk, cls: type) -> None:
    text = PAGE.read_text()
    assert f"### `{cls.__name__}`" in text
    methods = [n for n, m in vars(cls).items() if inspect.isfunction(m) and not n.startswith("_")]
    assert len(methods) >= 6
    for name in methods:
        row = next((ln for ln in text.splitlines() if ln.startswith(f"| `{name}(")), None)
        assert row is not None, f"{cls.__name__}.{name} is not on the page"
        assert docs_sdk.summary(getattr(cls, name)).split()[0] in row


def test_every_answer_and_error_class_is_there(docs_sdk) -> None:
    text = PAGE.read_text()
    for _, name in docs_sdk.ANSWERS:
        assert f"### `{name}`" in text
    for name in errors.__all__:
        if isinstance(getattr(errors, name), type):
            assert f"| `{name}` |" in text, name


def test_signatures_read_as_the_source_writes_them(docs_sdk) -> None:
    shown = docs_sdk.signature("Client", Client.__init__, returns=False)
    assert shown.startswith(
        "Client(url: str = 'http://127.0.0.1:8000', token: str | None = None, *,"
    )
    assert "sleep: Callable[[float], None] = time.sleep," in shown  # a default as written
    assert shown.endswith("names: SettingNames | None = None)")
