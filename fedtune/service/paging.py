"""Keyset paging of the study list (``GET /v1/studies``): the opaque ``page_token``.

The list is ordered by ``(created_at, id)`` — newest first, or oldest first with ``order=asc`` —
and every filter combination has an index in that order (revision 0005), so a page is one index
range read of ``limit + 1`` rows, however deep: page *n* starts right after the last study of
page *n − 1*, ``(created_at, id) < (last.created_at, last.id)``, instead of skipping
``offset`` rows (which costs the rows skipped). A study created while a client pages is never
shown twice nor shifts later pages, unlike ``offset``.

The token is what MLflow's ``page_token``/``next_page_token`` is to a client: opaque. Inside it
is URL-safe base64 of ``{"v": 1, "t": created_at, "i": id, "q": digest}``, where ``digest``
binds it to the query's filters and order; a token that does not decode, or that comes from a
query with other filters, is refused with 422 naming ``query.page_token``.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import enum
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import InvalidRequestError
from .states import StudyState

__all__ = ["TOKEN_FIELD", "Cursor", "ListQuery", "Order", "decode_token", "encode_token"]

TOKEN_FIELD = "query.page_token"
_VERSION = 1


class Order(enum.StrEnum):
    """Creation-time order of a study list."""

    DESC = "desc"  # newest first (the default)
    ASC = "asc"


@dataclass(frozen=True)
class ListQuery:
    """What a caller asked to list: states (empty: all), one project (None: all it may read),
    order."""

    states: tuple[StudyState, ...] = ()
    project: str | None = None
    order: Order = Order.DESC

    @classmethod
    def of(
        cls,
        states: StudyState | Sequence[StudyState] | None,
        project: str | None,
        order: Order | str = Order.DESC,
    ) -> ListQuery:
        if states is None:
            chosen: tuple[StudyState, ...] = ()
        elif isinstance(states, StudyState):
            chosen = (states,)
        else:
            chosen = tuple(sorted({StudyState(s) for s in states}))
        return cls(chosen, project, Order(order))

    @property
    def ascending(self) -> bool:
        return self.order == Order.ASC

    def digest(self) -> str:
        text = json.dumps([list(self.states), self.project, str(self.order)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Cursor:
    """The last study of a page: the next page starts strictly after it."""

    created_at: dt.datetime
    study_id: str


def encode_token(query: ListQuery, cursor: Cursor) -> str:
    body = {
        "v": _VERSION,
        "t": cursor.created_at.isoformat(),
        "i": cursor.study_id,
        "q": query.digest(),
    }
    raw = json.dumps(body, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, query: ListQuery) -> Cursor:
    """The cursor inside ``token``; ``InvalidRequestError`` (422, ``query.page_token``) when it
    is not one of ours or belongs to a query with other filters or another order."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        body = json.loads(raw)
        created = dt.datetime.fromisoformat(body["t"])
        study_id, digest, version = str(body["i"]), str(body["q"]), body["v"]
    except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
        raise InvalidRequestError(
            TOKEN_FIELD,
            "not a page token of this service; pass the next_page_token of a previous page",
        ) from None
    if version != _VERSION or created.tzinfo is None:
        raise InvalidRequestError(TOKEN_FIELD, "not a page token of this service")
    if digest != query.digest():
        raise InvalidRequestError(
            TOKEN_FIELD,
            "this token belongs to a list with other filters "
            "or another order: repeat the same state, project and order",
        )
    return Cursor(created.astimezone(dt.UTC), study_id)
