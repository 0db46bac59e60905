"""The fedtune service: REST API, persistence, scheduler and execution backends.

Light on purpose: importing ``fedtune.service`` (or ``fedtune.service.errors`` /
``fedtune.service.states``, which the SDK uses) pulls in neither FastAPI nor SQLAlchemy.
The app is ``fedtune.service.api.create_app``; settings are ``fedtune.service.settings``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .api import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
