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
The memory is the process's (bounded, least recently used first out): a restarted or upgraded
service, or another replica, checks again.
"""

from __future__ import annotations

import copy
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


class PassedChecks:
    """A bounded, thread-safe memory of passed code checks (see the module docstring)."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        """Args:
        size: the most checks remembered (the least recently used goes first).
        """
        self._size = size
        self._documents: OrderedDict[str, dict[str, Any]] = OrderedDict()
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
            document = self._documents.get(key)
            if document is None:
                return None
            self._documents.move_to_end(key)
        return copy.deepcopy(document)

    def put(self, key: str, document: Mapping[str, Any]) -> None:
        """Remember the document of a check that passed (call it for nothing else).

        Args:
            key: from :meth:`key`.
            document: the child's document, accepted by the service.
        """
        with self._lock:
            self._documents[key] = copy.deepcopy(dict(document))
            self._documents.move_to_end(key)
            while len(self._documents) > self._size:
                self._documents.popitem(last=False)
