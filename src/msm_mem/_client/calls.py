"""The requests of the clients: a :class:`Call` (method, path, what it sends, whether it may be
retried, how its answer is decoded), a :class:`Paged` list, the pieces a request is built of,
and how an answer becomes a result or the library's exception. :mod:`.operations` builds each
operation's requests from them; :mod:`.sync` and :mod:`.asynchronous` only send them."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote

from .._errors import BackendError, InvalidInput
from . import decode

if TYPE_CHECKING:
    import httpx

__all__ = [
    "MAX_PAGES",
    "PAGE",
    "RETRY_STATUSES",
    "Call",
    "Image",
    "Paged",
    "answer",
    "form",
    "headers",
    "page_size",
    "params",
    "patient",
    "post",
    "retryable",
    "segment",
    "unreachable",
]

T = TypeVar("T")
Image = str | os.PathLike[str] | bytes | None

#: statuses worth another try of an idempotent call (the server or a proxy was briefly away)
RETRY_STATUSES = frozenset({502, 503, 504})
#: the page size a list is fetched in, and a bound on the pages of one list
PAGE = 500
MAX_PAGES = 100_000


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the decoding of its answer. Only ``idempotent`` calls are retried."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    idempotent: bool = False
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None
    data: dict[str, str] | None = None
    files: dict[str, tuple[str, bytes, str]] | None = None

    def send_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.params:
            kwargs["params"] = self.params
        if self.json is not None:
            kwargs["json"] = self.json
        if self.data is not None:
            kwargs["data"] = self.data
        if self.files is not None:
            kwargs["files"] = self.files
        return kwargs


@dataclass(frozen=True)
class Paged(Generic[T]):
    """A list endpoint, fetched at most ``PAGE`` items a request until ``next_offset`` is None."""

    path: str
    parse: Callable[[dict[str, Any]], T]
    params: dict[str, str] = field(default_factory=dict)

    def page(self, offset: int, limit: int = PAGE) -> Call[tuple[list[T], int | None, int]]:
        """One page: its items, where the next starts (None: the last) and the list's total."""

        def parse(response: httpx.Response) -> tuple[list[T], int | None, int]:
            doc = response.json()
            return [self.parse(d) for d in doc["items"]], doc["next_offset"], int(doc["total"])

        params = {**self.params, "offset": str(offset), "limit": str(limit)}
        return Call("GET", self.path, parse, idempotent=True, params=params)


def page_size(offset: object, limit: object, got: int) -> int:
    """How many items the next request of a read from ``offset`` asks for (0: done); the page
    is checked here as the library checks it (InvalidInput)."""
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise InvalidInput(f"offset must be an integer >= 0, got {offset!r}")
    if limit is None:
        return PAGE
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidInput(f"limit must be an integer >= 1 or None (every record), got {limit!r}")
    return min(PAGE, limit - got)


def _json(response: httpx.Response) -> Any:
    return response.json() if response.content else None


def segment(value: str) -> str:
    """``value`` as one path segment (quoted; "", "." and ".." are refused)."""
    if not isinstance(value, str) or value in ("", ".", ".."):
        raise InvalidInput(f"not an id: {value!r}")
    return quote(value, safe="")


def _field(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def params(**params: Any) -> dict[str, str]:
    return {k: _field(v) for k, v in params.items() if v is not None}


def patient(patient_id: str, rest: str) -> str:
    return f"/v1/patients/{segment(patient_id)}/{rest}"


def form(
    path: str, image: Image, image_study: str | None, fields: dict[str, Any], parse: Callable[[Any], T]
) -> Call[T]:
    data = params(**fields)
    files = None
    if image_study is not None:
        data["image_study"] = image_study
    if image is not None:
        content = image if isinstance(image, bytes) else Path(image).read_bytes()
        name = "image" if isinstance(image, bytes) else Path(image).name
        files = {"image": (name, content, "application/octet-stream")}
    return Call("POST", path, lambda r: parse(r.json()), data=data, files=files)


def post(path: str, body: Any, parse: Callable[[Any], T]) -> Call[T]:
    return Call("POST", path, lambda r: parse(_json(r)), json=body)


def retryable(response: httpx.Response) -> bool:
    """Whether an answer is worth another try (of an idempotent call)."""
    return response.status_code in RETRY_STATUSES


def answer(call: Call[T], response: httpx.Response) -> T:
    """The decoded answer of ``call``, or the library's exception for its problem document."""
    if response.is_success:
        return call.parse(response)
    try:
        body: object = response.json()
    except ValueError:
        body = None
    raise decode.error(response.status_code, body)


def unreachable(call: Call[Any], exc: Exception) -> BackendError:
    """The error of a call whose last try found no server."""
    return BackendError(f"{call.method} {call.path}: {type(exc).__name__}: {exc}")


def tls(verify: bool | str | ssl.SSLContext) -> bool | ssl.SSLContext:
    """What httpx takes for ``verify``: a CA bundle path (a self-signed certificate, the
    hospital's CA) becomes a context trusting it, since httpx deprecates a path."""
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return verify


def headers(token: str, retries: int, break_glass_reason: str | None) -> dict[str, str]:
    """The headers every request of a client carries (both clients check their settings here)."""
    if not isinstance(token, str) or not token.strip():
        raise InvalidInput("a MemoryClient needs a bearer token")
    if not 0 <= retries <= 10:
        raise InvalidInput("retries must be between 0 and 10")
    out = {"Authorization": f"Bearer {token.strip()}", "Accept": "application/json"}
    if break_glass_reason:
        out["X-Break-Glass-Reason"] = " ".join(break_glass_reason.split())
    return out
