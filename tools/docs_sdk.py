"""The Python SDK's reference page, ``docs/reference/sdk.md``, as plain Markdown.

``tools/docs_gen.py`` calls :func:`sdk_page`. The page is written out rather than left to
mkdocstrings' ``:::`` directives, which GitHub shows as bare lines: the signatures and summary
lines of ``Client``'s and ``Study``'s methods, the fields of every answer class with their
types and descriptions, the states, and the error classes with their HTTP status and code —
the same on GitHub, in an editor and on the site.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Any

#: (module, class) of the answers, in the page's order
ANSWERS = (
    ("fedtune.wire_base", "WireModel"),
    ("fedtune.wire_models", "StudyDetail"),
    ("fedtune.wire_models", "StudyOut"),
    ("fedtune.wire_models", "Progress"),
    ("fedtune.wire_models", "BestTrial"),
    ("fedtune.wire_models", "MlflowLinks"),
    ("fedtune.wire_models", "TrialOut"),
    ("fedtune.wire_models", "CurvePoint"),
    ("fedtune.results", "TradeOff"),
    ("fedtune.results", "TrialSummary"),
    ("fedtune.results", "EnvelopePoint"),
    ("fedtune.results", "RegimeChange"),
    ("fedtune.results", "Comparison"),
    ("fedtune.results", "StudyLine"),
    ("fedtune.results", "MatchedRow"),
    ("fedtune.wire_models", "RecordedRun"),
    ("fedtune.wire_models", "MethodGroupOut"),
    ("fedtune.wire_models", "MethodStudy"),
    ("fedtune.wire_models", "AlgorithmOut"),
    ("fedtune.wire_models", "TaskOut"),
    ("fedtune.wire_models", "SearchSpaceOut"),
    ("fedtune.wire_models", "StudyPage"),
)
_SECTION = re.compile(
    r"^(Args|Arguments|Returns|Raises|Yields|Example|Examples|Attributes|Note):\s*$"
)

_INTRO = """\
# Python SDK

`fedtune.Client` talks to a fedtune service over HTTP; it needs only the light install
(httpx, pydantic and PyYAML, no PyTorch; until fedtune is on a public index, from the wheel the
service hands out at `/client/`: [Distributions](../explanation/distributions.md#where-to-get-it)).
The same calls back the service-client verbs of the [command line](cli.md) (`fedtune submit`,
`status`, `studies`, …), and every method maps to a route of the [HTTP API](http-api.md).

```python title="Needs a running service"
from fedtune import Client

with Client("http://127.0.0.1:8000", token="...") as client:
    study = client.submit("examples/quickstart.yaml")
    print(study.wait().state, study.best())
```

## Client and study handles

"""

_ANSWERS_INTRO = """\
## What the service answers

The answers are the classes the service itself answers with (`fedtune.wire_models`), so they
carry exactly the fields of the [HTTP API](http-api.md)'s schemas; fields a newer service adds
are kept in `.extra`, and `.to_json()` gives the object back as JSON. The SDK
names two of them after what they are to a caller: `StudyStatus` is `StudyDetail`, `TrialInfo`
is `TrialOut`. A list of studies (`studies`, `list_studies`,
`iter_studies`) gives summaries (`StudyOut`); `study.status()` has the details.

A study's trade-off (`study.tradeoff()`) and a comparison (`client.compare(...)`) are the very
classes the engine computes (`fedtune.results`): `TradeOff` is what `fedtune tune` writes to
`tradeoff/tradeoff.json`, `Comparison` what `fedtune compare` writes to `comparison.json`.
A loss never reached is `inf` in the engine and `null` on the wire; `fedtune.results.loss`
reads it back as `inf`.

"""

_ERRORS_INTRO = """\
## Errors

Every error the SDK raises on purpose is a `FedtuneError`; the service's error answers
(`code`, `field`, `reason`) come back as the matching subclass, by the answer's `code`.

"""


def _paragraphs(doc: str | None) -> list[str]:
    """The docstring's description: its paragraphs before the first section (``Args:``, …)."""
    lines = inspect.cleandoc(doc or "").splitlines()
    kept: list[str] = []
    for line in lines:
        if _SECTION.match(line.strip()):
            break
        kept.append(line)
    text = "\n".join(kept).strip()
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring, on one line ("" without one)."""
    found = _paragraphs(getattr(obj, "__doc__", None))
    return found[0] if found else ""


def args_section(doc: str | None) -> list[tuple[str, str]]:
    """``(name, description)`` of a Google-style docstring's ``Args:`` section."""
    lines = inspect.cleandoc(doc or "").splitlines()
    out: list[tuple[str, str]] = []
    inside = False
    for line in lines:
        if _SECTION.match(line.strip()):
            inside = line.strip().startswith(("Args", "Arguments"))
            continue
        if not inside or not line.strip():
            continue
        match = re.match(r"^    (\*{0,2}\w+)(?: \([^)]*\))?: (.*)$", line)
        if match:
            out.append((match.group(1), match.group(2).strip()))
        elif out and line.startswith("     "):
            out[-1] = (out[-1][0], f"{out[-1][1]} {line.strip()}")
        else:
            inside = False
    return out


def _annotation(value: Any) -> str:
    """An annotation as the source spells it (they are strings: postponed annotations)."""
    return value if isinstance(value, str) else inspect.formatannotation(value)


def _default(value: Any) -> str:
    """A default value as code: a function by its name, anything else by its repr."""
    if callable(value) and hasattr(value, "__name__"):
        module = getattr(value, "__module__", None) or ""
        return f"{module.split('.')[0]}.{value.__name__}" if module else value.__name__
    return repr(value)


def signature(name: str, func: Callable[..., Any], returns: bool = True) -> str:
    """``name(params) -> return`` as written in the source (``self`` left out).

    Args:
        name: what to call it.
        func: the function.
        returns: show the return annotation (a constructor's ``None`` is not worth it).

    Returns:
        The signature.
    """
    sig = inspect.signature(func)
    parts: list[str] = []
    star = False
    for p in sig.parameters.values():
        if p.name == "self":
            continue
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
        star = star or p.kind in (p.VAR_POSITIONAL, p.KEYWORD_ONLY)
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {_default(p.default)}"
        parts.append(text)
    shown = f"{name}({', '.join(parts)})"
    if returns and sig.return_annotation is not sig.empty:
        shown += f" -> {_annotation(sig.return_annotation)}"
    return shown


def _methods(cls: type) -> list[tuple[str, Any]]:
    """The public methods and properties ``cls`` defines, in source order."""
    return [
        (name, member)
        for name, member in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    ]


def handle_section(cls: type, md: Callable[[str], str], table: Callable[..., str]) -> str:
    """A class of the SDK: what it is, how it is made, and each method's signature and summary."""
    out = [f"### `{cls.__name__}`\n\n"]
    out += [md(p) + "\n\n" for p in _paragraphs(cls.__doc__)]
    # ``py``, not ``python``: a signature is no statement, and the docs' tests run python blocks
    out.append(f"```py\n{signature(cls.__name__, cls.__init__, returns=False)}\n```\n\n")
    made = args_section(cls.__doc__)
    if made:
        out.append(table(["Argument", "Meaning"], [[f"`{a}`", md(t)] for a, t in made]))
        out.append("\n")
    rows = []
    for name, member in _methods(cls):
        if isinstance(member, property):
            rows.append([f"`{name}` (property)", md(summary(member.fget))])
        else:
            rows.append([f"`{signature(name, member)}`", md(summary(member))])
    out.append(table(["Method", "What it does"], rows))
    return "".join(out) + "\n"


def answer_section(cls: type, md: Callable[[str], str], table: Callable[..., str]) -> str:
    """An answer class: what it is and its fields (type, description)."""
    out = [f"### `{cls.__name__}`\n\n"]
    bases = [
        b.__name__ for b in cls.__bases__ if b is not object and not b.__name__.startswith("_")
    ]
    where = f"`{cls.__module__}.{cls.__name__}`" + (f", a `{bases[0]}`" if bases else "")
    out.append(f"{where}. " + " ".join(md(p) for p in _paragraphs(cls.__doc__)) + "\n\n")
    if dataclasses.is_dataclass(cls):
        rows = [
            [f"`{f.name}`", f"`{f.type}`", md(f.metadata.get("description", ""))]
            for f in dataclasses.fields(cls)
        ]
        out.append(table(["Field", "Type", "Description"], rows))
    else:
        rows = [
            [f"`{n}`", md(summary(m.fget if isinstance(m, property) else m))]
            for n, m in _methods(cls)
        ]
        if rows:
            out.append(table(["Member", "What it does"], rows))
    return "".join(out) + "\n"


def states_section(md: Callable[[str], str]) -> str:
    """The study and trial states, by value."""
    from fedtune import states

    out = ["## States\n\n"]
    for cls in (states.StudyState, states.TrialState):
        values = ", ".join(f"`{m.value}`" for m in cls)
        out.append(
            f"* `fedtune.states.{cls.__name__}` ({md(summary(cls)) or 'a string enum'}): {values}\n"
        )
    terminal = ", ".join(f"`{s.value}`" for s in states.StudyState if s.terminal)
    out.append(f"\nA study has ended when its state is one of {terminal} (`state.terminal`).\n\n")
    return "".join(out)


def errors_section(md: Callable[[str], str], table: Callable[..., str]) -> str:
    """Every error class of ``fedtune.errors`` with its base, HTTP status and code."""
    from fedtune import errors
    from fedtune.wire import ERROR_TABLE

    rows = []
    for name in errors.__all__:
        cls = getattr(errors, name)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            continue
        status, code = next(ERROR_TABLE[c] for c in cls.__mro__ if c in ERROR_TABLE)
        base = next((b.__name__ for b in cls.__bases__ if issubclass(b, errors.FedtuneError)), "")
        rows.append(
            [f"`{name}`", f"`{base}`" if base else "", str(status), f"`{code}`", md(summary(cls))]
        )
    return _ERRORS_INTRO + table(["Error", "Base", "HTTP", "Code", "Meaning"], rows)


def sdk_page(md: Callable[[str], str], table: Callable[..., str], header: str) -> str:
    """The page.

    Args:
        md: Turns a docstring's reStructuredText into Markdown (``docs_gen.rst_to_md``).
        table: Renders ``(header, rows)`` as a Markdown table (``docs_gen.table``).
        header: The "generated, do not edit" line.

    Returns:
        The Markdown of ``docs/reference/sdk.md``.
    """
    import importlib

    from fedtune.client import Client, Study

    out = [header, _INTRO, handle_section(Client, md, table), handle_section(Study, md, table)]
    out.append(_ANSWERS_INTRO)
    for module, name in ANSWERS:
        out.append(answer_section(getattr(importlib.import_module(module), name), md, table))
    out.append(states_section(md))
    out.append(errors_section(md, table))
    return "".join(out)
