"""The memory explorer: a web page at ``/ui`` over the governed API (timeline, evidence trail,
tier walkthroughs, audit view), its files served by the package, and the few endpoints it needs
beyond the service's own (:mod:`.endpoints`: audit events, thumbnails, walkthroughs)."""

from __future__ import annotations

from fastapi import FastAPI

from . import endpoints, pages

__all__ = ["mount"]


def mount(app: FastAPI) -> None:
    """Add the explorer's page, files and endpoints to ``app``."""
    app.include_router(endpoints.router)
    app.include_router(pages.router)
