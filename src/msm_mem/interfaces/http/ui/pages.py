"""The explorer's files: ``/ui`` (the page) and ``/ui/static/NAME`` (its scripts, styles and
icon), read from the package, never from a CDN. No credential is needed for these files (they
hold no data); every data fetch the page makes carries the bearer token the user signed in
with. The page's Content-Security-Policy allows only the server's own scripts, styles and
fetches (no inline script, no framing, no form posts elsewhere)."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Response
from fastapi.responses import RedirectResponse

from ..problems import HttpProblem

__all__ = ["SECURITY_HEADERS", "router"]

router = APIRouter(include_in_schema=False)

#: the files the page is made of, with their media types
FILES = {
    "app.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "views.js": "text/javascript; charset=utf-8",
    "walkthrough.js": "text/javascript; charset=utf-8",
    "icon.svg": "image/svg+xml",
}

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


@router.get("/ui")
def page() -> Response:
    """The explorer page."""
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@router.get("/ui/")
def page_slash() -> Response:
    return RedirectResponse("/ui", status_code=308)


@router.get("/ui/static/{name}")
def static(name: str) -> Response:
    """One of the page's files (a fixed list: nothing else of the package is reachable)."""
    if name not in FILES:
        raise HttpProblem("not-found", "no such file of the explorer")
    return Response(_read(name), media_type=FILES[name], headers=SECURITY_HEADERS)
