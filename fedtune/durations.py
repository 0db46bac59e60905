"""Durations as people write them (``90``, ``"45s"``, ``"30m"``, ``"1h30m"``, ``"2d"``) and
as the progress line shows them (``1:15``, ``1:02:05``).

Pure functions, no third-party import: the spec, the CLI and the service share them.
"""

from __future__ import annotations

import math
import re

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")


def parse_duration(value: object) -> float:
    """Seconds of a duration: a number of seconds, or a string of ``<number><unit>`` parts.

    Args:
        value: ``90``, ``90.5``, ``"90"``, ``"45s"``, ``"30m"``, ``"1h30m"``, ``"1.5h"``,
            ``"2d"`` (units d, h, m, s, each at most once, largest first).

    Returns:
        The seconds, finite and > 0.

    Raises:
        ValueError: Not a duration (a bool, a negative or zero length, an unknown unit): the
            reason (the caller names the value).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("expected seconds or a duration such as '30m'")
    seconds = _parse_text(value.strip().lower()) if isinstance(value, str) else float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("a duration must be finite and > 0")
    return seconds


def _parse_text(text: str) -> float:
    """Seconds of ``"90"`` or ``"1h30m"`` (see :func:`parse_duration`)."""
    try:
        return float(text)
    except ValueError:
        pass
    parts = _PART.findall(text)
    units = [unit for _, unit in parts]
    order = [u for u in _UNITS if u in units]
    if not parts or "".join(n + u for n, u in parts) != text or units != order:
        raise ValueError("expected seconds or a duration such as '45s', '30m', '1h30m' or '2d'")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def format_duration(seconds: float) -> str:
    """``75`` -> ``1:15``; ``3725`` -> ``1:02:05``.

    Args:
        seconds: A length of time (negative shows as 0).

    Returns:
        ``m:ss``, or ``h:mm:ss`` from an hour on.
    """
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
