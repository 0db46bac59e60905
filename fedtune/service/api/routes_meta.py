"""Discovery: algorithms, tasks and shipped search spaces."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from .. import meta_services as services
from ..schemas import AlgorithmOut, SearchSpaceOut, TaskOut
from .auth import current_principal

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["discovery"], dependencies=[Depends(current_principal)])


@router.get("/algorithms", response_model=list[AlgorithmOut])
def list_algorithms() -> list[AlgorithmOut]:
    return services.list_algorithms()


@router.get("/tasks", response_model=list[TaskOut])
def list_tasks() -> list[TaskOut]:
    return services.list_tasks()


@router.get("/search-spaces", response_model=list[SearchSpaceOut])
def list_search_spaces() -> list[SearchSpaceOut]:
    return services.list_search_spaces()
