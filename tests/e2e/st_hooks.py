"""Schemathesis hooks for the OpenAPI fuzz run (loaded through ``SCHEMATHESIS_HOOKS``).

``POST /v1/code`` takes ``application/zip``, which schemathesis cannot generate by itself: this
registers a strategy that yields real zip archives (one top-level package of small Python
files, as ``fedtune submit --code`` uploads) mixed with arbitrary bytes, so the fuzz run covers
both the accepted and the rejected path.
"""

from __future__ import annotations

import io
import zipfile

import schemathesis
from hypothesis import strategies as st

_NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)


@st.composite
def _zips(draw: st.DrawFn) -> bytes:
    package = draw(_NAMES)
    files = draw(st.dictionaries(_NAMES, st.text(max_size=64), max_size=3))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr(f"{package}/__init__.py", "")
        for name, text in files.items():
            zf.writestr(f"{package}/{name}.py", f"# {text!r}\n")
    return buf.getvalue()


schemathesis.openapi.media_type("application/zip", st.one_of(_zips(), st.binary(max_size=256)))
