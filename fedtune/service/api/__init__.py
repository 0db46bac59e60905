"""The HTTP API of the service (FastAPI): ``create_app``."""

from .app import Runtime, create_app

__all__ = ["Runtime", "create_app"]
