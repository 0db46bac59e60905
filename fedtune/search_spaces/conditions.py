"""A tiny, safe condition language for conditional search-space parameters (no ``eval``).

Grammar (``when:`` in a space file)::

    expr   := conj ("or" conj)*
    conj   := atom ("and" atom)*
    atom   := "(" expr ")" | "not" atom | NAME ("==" | "!=") VALUE | NAME ["not"] "in" "[" VALUE ("," VALUE)* "]"
    VALUE  := 'text' | "text" | number | true | false | null

``NAME`` is a parameter of the same space (short name such as ``server_opt`` or a dotted path
such as ``hparams.server_opt``). A comparison whose parameter is *inactive* (its own condition is
false) is false, whatever the operator, so a chain of conditions switches off as a whole.

``not`` is pushed down to the comparisons (De Morgan) before evaluating, so it never turns an
inactive comparison true: ``not x == 1`` is ``x != 1``, ``not x in [..]`` is ``x not in [..]``,
``not (A and B)`` is ``not A or not B``; all of them are false while ``x`` is inactive.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Condition", "ConditionSyntaxError", "parse_condition"]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<str>'[^']*'|"[^"]*")
      | (?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
      | (?P<op>==|!=|\(|\)|\[|\]|,)
      | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
_CONSTS = {"true": True, "false": False, "null": None}


class ConditionSyntaxError(ValueError):
    """The condition text does not follow the grammar (message says where)."""


@dataclass(frozen=True)
class Condition:
    """A parsed condition: ``text`` as written, ``names`` it references, and an evaluator."""

    text: str
    names: frozenset[str]
    _fn: Callable[[Mapping[str, Any]], bool]

    def __call__(self, values: Mapping[str, Any]) -> bool:
        """Evaluate against ``values`` (name -> value; an absent name is an inactive parameter)."""
        return self._fn(values)

    def rename(self, mapping: Mapping[str, str]) -> Condition:
        """Same condition with referenced names translated (e.g. short names -> paths)."""
        return parse_condition(self.text, mapping)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Condition) and (self.text, self.names) == (other.text, other.names)

    def __hash__(self) -> int:
        return hash((self.text, self.names))


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ConditionSyntaxError(f"unexpected character at {pos}: {text[pos : pos + 10]!r}")
        pos = m.end()
        kind = m.lastgroup
        raw = m.group(kind)
        if kind == "str":
            out.append(("value", raw[1:-1]))
        elif kind == "num":
            out.append(("value", float(raw) if any(c in raw for c in ".eE") else int(raw)))
        elif kind == "word" and raw in _CONSTS:
            out.append(("value", _CONSTS[raw]))
        elif kind == "word" and raw in _KEYWORDS:
            out.append(("kw", raw))
        elif kind == "word":
            out.append(("name", raw))
        else:
            out.append(("op", raw))
    return out


_Eval = Callable[[Mapping[str, Any], bool], bool]


def _junction(parts: list[_Eval], *, disjunction: bool) -> _Eval:
    """``or`` (``disjunction``) / ``and`` of ``parts``; negated, it is the dual over negated parts."""

    def evaluate(v: Mapping[str, Any], positive: bool) -> bool:
        combine = any if disjunction == positive else all
        return combine(p(v, positive) for p in parts)

    return evaluate


class _Parser:
    def __init__(self, text: str, rename: Mapping[str, str]) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.rename = rename
        self.names: set[str] = set()

    def peek(self) -> tuple[str, Any] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self, kind: str, value: Any = None) -> Any:
        tok = self.peek()
        if tok is None or tok[0] != kind or (value is not None and tok[1] != value):
            want = repr(value) if value is not None else kind
            got = "end of text" if tok is None else repr(tok[1])
            raise ConditionSyntaxError(f"expected {want}, got {got}")
        self.i += 1
        return tok[1]

    def accept(self, kind: str, value: Any) -> bool:
        if self.peek() == (kind, value):
            self.i += 1
            return True
        return False

    # Each builder returns ``f(values, positive)``: ``positive=False`` evaluates the negation with
    # ``not`` pushed down to the comparisons, each of which is false on an inactive parameter.
    def expr(self) -> _Eval:
        parts = [self.conj()]
        while self.accept("kw", "or"):
            parts.append(self.conj())
        return parts[0] if len(parts) == 1 else _junction(parts, disjunction=True)

    def conj(self) -> _Eval:
        parts = [self.atom()]
        while self.accept("kw", "and"):
            parts.append(self.atom())
        return parts[0] if len(parts) == 1 else _junction(parts, disjunction=False)

    def atom(self) -> _Eval:
        if self.accept("op", "("):
            inner = self.expr()
            self.take("op", ")")
            return inner
        if self.accept("kw", "not"):
            inner = self.atom()
            return lambda v, positive: inner(v, not positive)
        name = self.take("name")
        name = self.rename.get(name, name)
        self.names.add(name)
        if self.accept("op", "=="):
            value = self.take("value")
            return lambda v, positive: name in v and ((v[name] == value) == positive)
        if self.accept("op", "!="):
            value = self.take("value")
            return lambda v, positive: name in v and ((v[name] != value) == positive)
        negate = self.accept("kw", "not")
        self.take("kw", "in")
        choices = self.value_list()
        return lambda v, positive: name in v and ((v[name] in choices) != negate) == positive

    def value_list(self) -> tuple[Any, ...]:
        self.take("op", "[")
        values = [self.take("value")]
        while self.accept("op", ","):
            values.append(self.take("value"))
        self.take("op", "]")
        return tuple(values)


def parse_condition(text: str, rename: Mapping[str, str] | None = None) -> Condition:
    """Parse ``text``; ``rename`` maps names as written to canonical names (default: identity)."""
    if not isinstance(text, str) or not text.strip():
        raise ConditionSyntaxError("a condition must be a non-empty string")
    parser = _Parser(text, rename or {})
    evaluate = parser.expr()
    if parser.peek() is not None:
        raise ConditionSyntaxError(f"unexpected {parser.peek()[1]!r} after a complete condition")
    return Condition(
        text=text.strip(), names=frozenset(parser.names), _fn=lambda v: evaluate(v, True)
    )
