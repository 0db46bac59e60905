"""``Annotated`` dependencies of the handlers (full-stack-fastapi-template's ``deps.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from ..services import ServiceContext
from ..settings import Settings

__all__ = ["Ctx", "SettingsDep", "get_context", "get_settings"]


def get_context(request: Request) -> ServiceContext:
    return request.app.state.runtime.ctx


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


Ctx = Annotated[ServiceContext, Depends(get_context)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
