"""How many configurations one process may pack: the bounds the spec checks and the plan uses.

Constants only, importing nothing: the spec (``resources.pack``) and the plan
(:mod:`.plan`) both read them, and neither imports the other for it.
"""

from __future__ import annotations

__all__ = ["AUTO", "AUTO_MAX", "MAX_PACK"]

AUTO = "auto"
#: the most configurations ``auto`` puts in one CPU process (the largest P the benchmark
#: measured)
AUTO_MAX = 64
#: the largest ``resources.pack`` (``auto`` on a GPU: at most this and what fits its memory)
MAX_PACK = 1024
