"""Passed code checks, remembered per service process: the same code and spec are checked once.

A code check (:mod:`.code_check`) imports the package and builds its task and model in a fresh
sandboxed Python: about 1.5 CPU-seconds, nearly all of them ``import torch``. A submission of
the very same study again (a re-run, a retry after the client gave up waiting) would redo it
for an answer already known. :class:`PassedChecks` keeps the child's answer of a check that
*passed*, keyed by

* the project the study is submitted to (one project's check never answers another's),
* the package's SHA-256 (computed by the service from the bytes it stores, never taken from
  the child), and the submitted spec, whole (every field the check reads: ``code.modules``,
  task, model, algorithm, search space, …), as canonical JSON,
* the settings the check ran under (sandbox mode, time, memory and process limits): a check
  passed under looser limits does not answer for tighter ones.

What is kept is only the document of a check that passed, after the service checked that
answer itself; a refusal, a crash, a timeout or a killed sandbox is never kept, so bad code is
checked again each time. A hit is checked again too: the service's rules and the submission's
summary are applied to the kept document as to a fresh answer (``code_check.accepted_answer``).
The memory is the process's, bounded in entries and in bytes (each document kept as its JSON
text; the least recently used goes first): a restarted or upgraded service, or another replica,
checks again.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["PassedChecks"]

#: how many passed checks one service process remembers
DEFAULT_SIZE = 256
#: how many bytes of their documents' JSON, at most (a spec is at most a request body, 1 MiB)
DEFAULT_BYTES = 16 << 20


class PassedChecks:
    """A bounded, thread-safe memory of passed code checks (see the module docstring)."""

    def __init__(self, size: int = DEFAULT_SIZE, max_bytes: int = DEFAULT_BYTES) -> None:
        """Args:
        size: the most checks remembered (the least recently used goes first).
        max_bytes: the most bytes of document JSON remembered, all together.
        """
        self._size, self._max_bytes, self._bytes = size, max_bytes, 0
        self._documents: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(project: str, sha256: str, spec: Mapping[str, Any], settings: Settings) -> str:
        """The key of one check.

        Args:
            project: the project the study is submitted to.
            sha256: the package's digest, as the service computed it.
            spec: the submitted spec, its ``code`` as ``{modules}``.
            settings: the service's settings (the check's sandbox and limits).

        Returns:
            A SHA-256 of all of them (canonical JSON).
        """
        limits = (
            str(settings.code_sandbox),
            settings.code_check_timeout_s,
            settings.code_sandbox_memory_mib,
            settings.code_sandbox_processes,
        )
        what = {"project": project, "sha256": sha256, "spec": spec, "limits": limits}
        text = json.dumps(what, sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(text.encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        """The document a passed check answered for ``key`` (a copy), or None.

        Args:
            key: from :meth:`key`.

        Returns:
            The document, or None when no check of ``key`` passed here.
        """
        with self._lock:
            text = self._documents.get(key)
            if text is None:
                return None
            self._documents.move_to_end(key)
        return json.loads(text)

    def put(self, key: str, document: Mapping[str, Any]) -> None:
        """Remember the document of a check that passed (call it for nothing else).

        Args:
            key: from :meth:`key`.
            document: the child's document, accepted by the service.
        """
        text = json.dumps(dict(document), separators=(",", ":"))
        if len(text) > self._max_bytes:
            return
        with self._lock:
            old = self._documents.pop(key, None)
            self._bytes += len(text) - (len(old) if old is not None else 0)
            self._documents[key] = text
            while len(self._documents) > self._size or self._bytes > self._max_bytes:
                self._bytes -= len(self._documents.popitem(last=False)[1])
