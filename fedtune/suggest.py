"""Did you mean …? The closest known name to a misspelt one, for error messages.

Every "unknown key" and "unknown name" error of a study spec says the closest known one
(``difflib.get_close_matches``, the standard library's ratio of matching characters, at least
:data:`CUTOFF`) before listing them all:
``train.rouds: unknown key; did you mean rounds? (known: batch_size, ..., rounds, ...)``.
Pure Python: the SDK may use it too.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["CUTOFF", "closest", "did_you_mean", "unknown_key"]

#: how alike a known name must be to be suggested (difflib's ratio: 0.6 is its default; ``rouds``
#: → ``rounds`` is 0.91, ``clinet_lr`` → ``client_lr`` 0.78, ``speed`` → ``seed`` 0.89)
CUTOFF = 0.6


def closest(name: object, known: Iterable[str]) -> str | None:
    """The known name most like ``name``.

    Args:
        name: The name given (anything: a key of a user's mapping may be a number).
        known: The names that exist.

    Returns:
        The closest one at least :data:`CUTOFF` alike, else None.
    """
    matches = difflib.get_close_matches(str(name), list(known), n=1, cutoff=CUTOFF)
    return matches[0] if matches else None


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """``"; did you mean rounds?"`` for the closest known name, or ``""``.

    Args:
        name: The name given.
        known: The names that exist.

    Returns:
        The words to put after the reason.
    """
    guess = closest(name, known)
    return "" if guess is None else f"; did you mean {guess}?"


def unknown_key(key: object, known: Iterable[str]) -> str:
    """The reason of an unknown key: ``unknown key; did you mean rounds? (known: a, b)``.

    Args:
        key: The key given.
        known: The keys the mapping takes, in the order to list them.

    Returns:
        The reason (no list when ``known`` is empty).
    """
    known = list(known)
    listed = f" (known: {', '.join(known)})" if known else ""
    return f"unknown key{did_you_mean(key, known)}{listed}"
