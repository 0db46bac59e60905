"""LEAF JSON clients read per cohort: an index of each user's bytes in its file.

A LEAF split is a few large JSON objects ``{"users", "num_samples", "user_data": {u: {"x",
"y"}}}``; JSON has no random access, so :func:`index_leaf_dir` walks each file once (one file in
memory at a time, each user's record parsed, checked and dropped) and records where every
user's record starts and ends. :class:`LeafClientData` then keeps only (file, start, end, n_u)
per user — no examples — and a cohort reads just its users' byte ranges (``seek`` + ``read`` +
``json.loads``). The index is rebuilt at each load (one parse of the split, as the in-memory
loader does anyway); it is not written next to the data, which may be read-only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from fedtune.errors import DataError

from .lazy import LazyFederatedData

__all__ = ["LeafClientData", "index_leaf_dir"]

#: one user's raw examples and the file they came from
RawUser = tuple[list, list, Path]
Examples = tuple[torch.Tensor, torch.Tensor]
#: user id -> (file, byte start, byte end, number of examples)
Index = dict[str, tuple[Path, int, int, int]]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_SHAPE = "expected a LEAF JSON object {'users': [...], 'num_samples': [...], 'user_data': {...}}"


def check_user(file: Path, user: str, rec: object) -> int:
    """The number of examples of a well-formed record ``{'x': [...], 'y': [...]}``."""
    if (
        not isinstance(rec, dict)
        or not isinstance(rec.get("x"), list)
        or not isinstance(rec.get("y"), list)
    ):
        raise DataError(
            str(file), f"user {user!r}: expected user_data[{user!r}] = {{'x': [...], 'y': [...]}}"
        )
    if len(rec["x"]) != len(rec["y"]):
        raise DataError(
            str(file),
            f"user {user!r}: {len(rec['x'])} inputs but {len(rec['y'])} labels; "
            "expected equal lengths",
        )
    return len(rec["x"])


class _Walker:
    """A cursor over one JSON text that records byte offsets of values."""

    def __init__(self, file: Path, text: str) -> None:
        self.file, self.text, self.pos = file, text, 0
        self._char, self._byte = 0, 0  # last char offset converted to bytes, and its byte offset

    def skip(self, expected: str | None = None) -> str:
        self.pos = _WS.match(self.text, self.pos).end()  # type: ignore[union-attr]
        char = self.text[self.pos : self.pos + 1]
        if expected is not None and char not in expected:
            raise DataError(
                str(self.file),
                f"cannot read as JSON (expected one of {expected!r} at character {self.pos}); "
                f"{_SHAPE}",
            )
        return char

    def value(self):
        self.skip()
        try:
            obj, self.pos = _DECODER.raw_decode(self.text, self.pos)
        except json.JSONDecodeError as exc:
            raise DataError(str(self.file), f"cannot read as JSON ({exc}); {_SHAPE}") from exc
        return obj

    def members(self):
        """Yield each key of the object at the cursor, leaving the cursor on its value."""
        self.skip("{")
        self.pos += 1
        if self.skip() == "}":
            self.pos += 1
            return
        while True:
            key = self.value()
            self.skip(":")
            self.pos += 1
            yield key
            if self.skip(",}") == "}":
                self.pos += 1
                return
            self.pos += 1

    def byte(self, char: int) -> int:
        """Byte offset of character ``char`` (offsets are asked for in increasing order)."""
        self._byte += len(self.text[self._char : char].encode("utf-8"))
        self._char = char
        return self._byte


def _index_file(file: Path) -> tuple[Index, list | None, list | None]:
    try:
        text = file.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(str(file), f"cannot read as JSON ({exc}); {_SHAPE}") from exc
    walk, index = _Walker(file, text), {}
    users = counts = None
    seen_data = False
    for key in walk.members():
        if key != "user_data":
            value = walk.value()
            if key == "users":
                users = value
            elif key == "num_samples":
                counts = value
            continue
        seen_data = True
        for user in walk.members():
            walk.skip()
            start = walk.byte(walk.pos)
            n = check_user(file, user, walk.value())
            index[user] = (file, start, walk.byte(walk.pos), n)
    if not seen_data:
        raise DataError(str(file), f"missing key 'user_data'; {_SHAPE}")
    return index, users, counts


def _check_lists(file: Path, index: Index, users: list | None, counts: list | None) -> None:
    users = sorted(index) if users is None else users
    if not isinstance(users, list) or (
        counts is not None and (not isinstance(counts, list) or len(counts) != len(users))
    ):
        raise DataError(
            str(file), "'users' and 'num_samples' must be lists of equal length; expected LEAF JSON"
        )
    for k, u in enumerate(users):
        if not isinstance(u, str) or u not in index:
            raise DataError(
                str(file), f"user {u!r}: expected user_data[{u!r}] = {{'x': [...], 'y': [...]}}"
            )
        if counts is not None and counts[k] != index[u][3]:
            raise DataError(
                str(file), f"user {u!r}: num_samples says {counts[k]} but x has {index[u][3]}"
            )


def index_leaf_dir(directory: Path, expected: str) -> Index:
    """Where each user of the ``*.json`` files in ``directory`` lives (one user, one file)."""
    if not directory.is_dir():
        raise DataError(str(directory), f"file not found; {expected}")
    files = sorted(directory.glob("*.json"))
    if not files:
        raise DataError(str(directory), f"no *.json files; {expected}")
    out: Index = {}
    for file in files:
        index, users, counts = _index_file(file)
        _check_lists(file, index, users, counts)
        for u, entry in index.items():
            if u in out:
                raise DataError(
                    str(file),
                    f"user {u!r} also appears in {out[u][0]}; "
                    "expected each user in one file of a split",
                )
            out[u] = entry
    return out


class LeafClientData(LazyFederatedData):
    """The kept users of a LEAF split, each read from its byte range when asked for."""

    def __init__(
        self, index: Index, ids: Sequence[str], convert: Callable[[str, RawUser], Examples]
    ) -> None:
        super().__init__(np.array([index[u][3] for u in ids], dtype=np.int64), ids)
        self.files = sorted({index[u][0] for u in ids})
        where = {f: k for k, f in enumerate(self.files)}
        self._spans = np.array(
            [(where[index[u][0]], index[u][1], index[u][2]) for u in ids], dtype=np.int64
        )
        self.convert = convert

    def read(self, clients: Sequence[int]) -> list[Examples]:
        out = []
        for c in clients:
            k, start, end = (int(v) for v in self._spans[c])
            with open(self.files[k], "rb") as handle:
                handle.seek(start)
                rec = json.loads(handle.read(end - start))
            user = self.client_ids[c]
            out.append(self.convert(user, (rec["x"], rec["y"], self.files[k])))
        return out
