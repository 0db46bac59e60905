"""The study's trade-off, computed once with the study's settings (one function for everyone).

:func:`tradeoff_of` analyses a study's curves with the settings its spec document gives —
``objective.last_rounds``, ``train.rounds`` (a trial that ended earlier was stopped),
``tradeoff.targets`` / ``tradeoff.pareto_target`` (default with several objectives:
``objective.target_loss``) — and :func:`tradeoff_text` is the exact JSON text of
``tradeoff.json``. The study driver writes that file and logs it to MLflow
(``fedtune.tuning.driver.study``); the service returns MLflow's file byte for byte once the study has
ended, and while it runs the same function on the trials finished so far, marked provisional
(Charles & Konečný 2021 (arXiv:2103.05032) §4 for the trade-off itself).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..keys import SMOOTH_WINDOW
from .tradeoff import TradeOff, TrialCurve, analyze_tradeoff, write_tradeoff

if TYPE_CHECKING:
    from ..spec import StoredSpec, StudySpec

__all__ = [
    "PROVISIONAL_NOTE",
    "STAMP_KEY",
    "StudyReport",
    "png_text",
    "study_report",
    "tradeoff_of",
]

#: the PNG text key of a report's figures: the digest of what they were drawn from
STAMP_KEY = "fedtune:inputs"
#: the PNG text key (on ``curves.png``) that lists the report's files by kind
FILES_KEY = "fedtune:files"
_PNG = b"\x89PNG\r\n\x1a\n"

PROVISIONAL_NOTE = (
    "computed from the trials finished so far; once the study has ended this is MLflow's "
    "tradeoff/tradeoff.json of the study's parent run"
)


def tradeoff_of(
    spec: StudySpec | StoredSpec, curves: Sequence[TrialCurve], provisional: bool = False
) -> TradeOff:
    """The trade-off of ``curves`` with the settings of the study ``spec`` (the driver's
    :class:`~fedtune.tuning.spec.StudySpec`, or the service's typed stored copy)."""
    objective, given = spec.objective, spec.tradeoff
    target = given.pareto_target
    if target is None and objective.is_multi:
        target = objective.target_loss
    rounds = spec.train.rounds
    t = analyze_tradeoff(
        curves,
        targets=given.targets,
        pareto_target=target,
        last_rounds=objective.last_rounds,
        smooth_window=SMOOTH_WINDOW,
        rounds_total=int(rounds) if rounds else None,
        metric="client_loss",
    )
    if provisional:
        from dataclasses import replace

        t = replace(t, notes={**t.notes, "provisional": PROVISIONAL_NOTE})
    return t


@dataclass
class StudyReport:
    """A finished study's trade-off: its files, Pareto rows and lower envelope E(R)."""

    tradeoff: dict[str, Any] | None = None  # tradeoff.json's content (its listed trials)
    pareto: list[dict[str, Any]] = field(default_factory=list)
    envelope: list[tuple[int, float]] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)
    directory: Path | None = None
    analysis: TradeOff | None = None  # every trial's summary
    inputs: str = ""  # the digest of what the files were made from (empty without curves)


def study_report(spec: StudySpec, curves: list, directory: Path) -> StudyReport:
    """Analyse a finished study's trials and write its trade-off files.

    Each figure carries, as PNG text, the digest of what it was drawn from (fedtune's version,
    the spec, the curves): figures drawn from the same inputs already are not drawn again
    (matplotlib is not even imported), only ``tradeoff.json``/``.csv`` are written.

    Args:
        spec: The study's spec (its objective's last rounds, its rounds, its targets).
        curves: The finished trials' curves.
        directory: Where the files go (``tradeoff/``).

    Returns:
        The report: ``tradeoff.json``'s content, Pareto rows, E(R), the files, every trial's
        summary (``analysis``) and the inputs' digest; empty without curves.
    """
    if not curves:
        return StudyReport()
    t = tradeoff_of(spec, curves)
    color_by = next(iter(curves[0].params), None)
    inputs = _inputs_digest(spec, curves, color_by)
    files = _drawn(directory, inputs)
    if files is not None:  # drawn from these very inputs: only the text files are written
        files.update(write_tradeoff(t, directory))
    else:
        files = _draw(spec, t, curves, directory, color_by, inputs)
    k = t.targets.index(t.pareto_target) if t.pareto_target is not None else 0
    pareto = [
        {
            "number": s.trial_id,
            "rounds_to_target": s.rounds_to_target[k],
            "final_loss": s.final_loss,
            "params": dict(s.params),
        }
        for s in map(t.summary_of, t.pareto)
    ]
    envelope = [(p.round, p.loss) for p in t.envelope if math.isfinite(p.loss)]
    return StudyReport(t.to_dict(), pareto, envelope, files, directory, t, inputs)


def _draw(
    spec: StudySpec,
    t: TradeOff,
    curves: list,
    directory: Path,
    color_by: str | None,
    inputs: str,
) -> dict[str, Path]:
    """Write the report's files and figures, each figure stamped with ``inputs``.

    ``curves.png`` is stamped last, with the list of the files: a report cut short leaves it
    unstamped (or stamped for other inputs), so the next report draws everything again.

    Args:
        spec: The study's spec.
        t: The trade-off of ``curves``.
        curves: The finished trials' curves.
        directory: Where the files go.
        color_by: The parameter that colours the curves.
        inputs: The digest of what the figures are drawn from (:func:`_inputs_digest`).

    Returns:
        The files, by kind.
    """
    from .plots import write_artifacts
    from .theory_link import theory_report

    files = write_artifacts(t, curves, directory, color_by=color_by)
    named = set(t.shown())  # a large study: its best trials, Pareto set and envelope
    files.update(theory_report(spec, [c for c in curves if c.trial_id in named], directory))
    names = {kind: path.name for kind, path in files.items()}
    for kind, path in sorted(files.items(), key=lambda item: item[0] == "curves"):
        if path.suffix == ".png":
            text = {STAMP_KEY: inputs}
            if kind == "curves":
                text[FILES_KEY] = json.dumps(names, sort_keys=True)
            _stamp(path, text)
    return files


def _inputs_digest(spec: StudySpec, curves: list, color_by: str | None) -> str:
    """The digest of everything a report's figures are drawn from: fedtune's version, the
    spec, the curves (trial, parameters, rounds, losses, outcome) and the colouring
    parameter."""
    from fedtune import __version__

    doc = {
        "fedtune": __version__,
        "spec": spec.model_dump(mode="json"),
        "color_by": color_by,
        "curves": [
            [c.trial_id, dict(c.params), list(c.rounds), list(c.losses), str(c.outcome)]
            for c in curves
        ],
    }
    text = json.dumps(doc, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _drawn(directory: Path, inputs: str) -> dict[str, Path] | None:
    """The report's files when its figures were drawn from ``inputs`` and are all there.

    Args:
        directory: The report's directory.
        inputs: The digest of what the figures would be drawn from now.

    Returns:
        The files, by kind; None when anything must be drawn again.
    """
    text = png_text(directory / "curves.png")
    if text.get(STAMP_KEY) != inputs or FILES_KEY not in text:
        return None
    try:
        names = json.loads(text[FILES_KEY])
    except ValueError:
        return None
    files = {kind: directory / name for kind, name in names.items()}
    for path in files.values():
        if not path.is_file():
            return None
        if path.suffix == ".png" and png_text(path).get(STAMP_KEY) != inputs:
            return None
    return files


def png_text(path: Path) -> dict[str, str]:
    """The ``tEXt`` entries of a PNG file (none when it is missing or not a PNG).

    Args:
        path: The file.

    Returns:
        ``{key: text}``.
    """
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    if not data.startswith(_PNG):
        return {}
    out, at = {}, len(_PNG)
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at : at + 8])
        body = data[at + 8 : at + 8 + length]
        if kind == b"tEXt" and b"\0" in body:
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        if kind == b"IEND":
            break
        at += 12 + length
    return out


def _stamp(path: Path, text: dict[str, str]) -> None:
    """Add ``tEXt`` entries to a PNG file, before its ``IEND`` chunk.

    Args:
        path: The PNG file.
        text: ``{key: text}`` (Latin-1).
    """
    data = path.read_bytes()
    end = data.rindex(b"IEND") - 4
    chunks = b""
    for key, value in text.items():
        body = key.encode("latin-1") + b"\0" + value.encode("latin-1")
        crc = zlib.crc32(b"tEXt" + body)
        chunks += struct.pack(">I", len(body)) + b"tEXt" + body + struct.pack(">I", crc)
    path.write_bytes(data[:end] + chunks + data[end:])
