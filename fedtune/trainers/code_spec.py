"""The ``code:`` section of a study or training configuration, as data: which directory or
wheel to mount and which modules to import (:mod:`.code` imports them; this module imports
nothing of the engine, so a configuration type can name it without pulling the registries in).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .typed import config_error

__all__ = ["MODULE_PATTERN", "CodeSpec", "parse_code_spec"]

MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


class CodeSpec(BaseModel):
    """The ``code:`` section of a study or training configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = None
    modules: Annotated[list[Annotated[str, Field(pattern=MODULE_PATTERN)]], Field(min_length=1)]

    def resolved(self, base_dir: str | Path | None) -> CodeSpec:
        """Make ``path`` absolute.

        Args:
            base_dir: The directory ``path`` is relative to, the study's (None: unchanged).

        Returns:
            The same spec with an absolute ``path`` (unchanged without a path).
        """
        if self.path is None or Path(self.path).is_absolute() or base_dir is None:
            return self
        return self.model_copy(update={"path": str((Path(base_dir) / self.path).resolve())})


def parse_code_spec(data: Any, field_name: str = "code") -> CodeSpec:
    if isinstance(data, CodeSpec):
        return data
    try:
        return CodeSpec.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, field_name) from None
