"""The requests of the client, built once for both clients: each operation of
:class:`~msm_mem.MsmMem` as a :class:`Call` (method, path, what it sends, whether it may be
retried, how its answer is decoded). :mod:`.sync` and :mod:`.asynchronous` only send them."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar
from urllib.parse import quote

from .._agent.agent import AgentAnswer
from .._api.care import Retrieved
from .._api.trail import AuditTrail
from .._errors import BackendError, InvalidInput
from .._governance.audit_chain import VerifyResult
from .._memory.maintenance import MaintenanceReport
from .._memory.msm import WriteResult
from .._principal import Principal
from .._records import EpisodicRecord, SemanticState, VisualRecord
from .._tier_records import Claim, ConsentRecord, StmItem, StmState
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
    "headers",
    "page_size",
    "retryable",
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


def _seg(value: str) -> str:
    """``value`` as one path segment (quoted; "", "." and ".." are refused)."""
    if not isinstance(value, str) or value in ("", ".", ".."):
        raise InvalidInput(f"not an id: {value!r}")
    return quote(value, safe="")


def _field(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _params(**params: Any) -> dict[str, str]:
    return {k: _field(v) for k, v in params.items() if v is not None}


def _patient(patient_id: str, rest: str) -> str:
    return f"/v1/patients/{_seg(patient_id)}/{rest}"


def _form(
    path: str, image: Image, image_study: str | None, fields: dict[str, Any], parse: Callable[[Any], T]
) -> Call[T]:
    data = _params(**fields)
    files = None
    if image_study is not None:
        data["image_study"] = image_study
    if image is not None:
        content = image if isinstance(image, bytes) else Path(image).read_bytes()
        name = "image" if isinstance(image, bytes) else Path(image).name
        files = {"image": (name, content, "application/octet-stream")}
    return Call("POST", path, lambda r: parse(r.json()), data=data, files=files)


def _post(path: str, body: Any, parse: Callable[[Any], T]) -> Call[T]:
    return Call("POST", path, lambda r: parse(_json(r)), json=body)


# what the service is --------------------------------------------------------------------------


def ready() -> Call[bool]:
    return Call("GET", "/ready", lambda r: bool(r.json()["status"] == "ready"), idempotent=True)


def whoami() -> Call[tuple[Principal, tuple[str, ...]]]:
    def parse(r: httpx.Response) -> tuple[Principal, tuple[str, ...]]:
        d = r.json()
        return Principal(d["id"], d["role"], d["purpose"]), tuple(d["patients"])

    return Call("GET", "/v1/whoami", parse, idempotent=True)


# clinical operations ----------------------------------------------------------------------------


def ask(
    patient_id: str,
    image: Image,
    question: str,
    *,
    image_study: str | None,
    timestamp: float | None,
    study_id: str,
    visual_tag: str,
    write_back: bool,
    use_sem: bool,
    use_epi: bool,
    use_vis: bool,
) -> Call[AgentAnswer]:
    fields = {
        "question": question,
        "timestamp": timestamp,
        "study_id": study_id,
        "visual_tag": visual_tag,
        "write_back": write_back,
        "use_sem": use_sem,
        "use_epi": use_epi,
        "use_vis": use_vis,
    }
    return _form(_patient(patient_id, "ask"), image, image_study, fields, decode.answer)


def retrieve(
    patient_id: str,
    image: Image,
    *,
    image_study: str | None,
    scope: Literal["patient", "population"],
    at: float | None,
    k: int,
    use_sem: bool,
    use_epi: bool,
    use_vis: bool,
) -> Call[Retrieved]:
    fields = {"scope": scope, "at": at, "k": k, "use_sem": use_sem, "use_epi": use_epi, "use_vis": use_vis}
    return _form(_patient(patient_id, "retrieve"), image, image_study, fields, decode.retrieved)


def observe(
    patient_id: str,
    image: Image,
    question: str,
    *,
    image_study: str | None,
    timestamp: float | None,
    study_id: str,
    visual_tag: str,
) -> Call[StmItem]:
    fields = {"question": question, "timestamp": timestamp, "study_id": study_id, "visual_tag": visual_tag}
    return _form(_patient(patient_id, "observe"), image, image_study, fields, decode.stm_item)


def consolidate(patient_id: str, item_id: str, answer: str, *, decision: str) -> Call[WriteResult]:
    path = _patient(patient_id, f"stm/{_seg(item_id)}/consolidate")
    return _post(path, {"answer": answer, "decision": decision}, decode.write_result)


def feedback(patient_id: str, study_id: str, *, accept: bool, correction: str, decision: str) -> Call[Claim]:
    path = _patient(patient_id, f"studies/{_seg(study_id)}/feedback")
    return _post(path, {"accept": accept, "correction": correction, "decision": decision}, decode.claim)


# reads ------------------------------------------------------------------------------------------


def semantic_state(patient_id: str, category: str | None) -> Paged[SemanticState]:
    return Paged(_patient(patient_id, "semantic"), decode.semantic, _params(category=category))


def semantic_history(patient_id: str, category: str) -> Paged[SemanticState]:
    return Paged(_patient(patient_id, "semantic/history"), decode.semantic, _params(category=category))


def episodes(patient_id: str) -> Paged[EpisodicRecord]:
    return Paged(_patient(patient_id, "episodes"), decode.episode)


def visuals(patient_id: str) -> Paged[VisualRecord]:
    return Paged(_patient(patient_id, "visuals"), decode.visual)


def claims(patient_id: str, key: str | None) -> Paged[Claim]:
    return Paged(_patient(patient_id, "claims"), decode.claim, _params(key=key))


def claim_history(patient_id: str, key: str) -> Paged[Claim]:
    return Paged(_patient(patient_id, "claims/history"), decode.claim, _params(key=key))


def stm_items(patient_id: str, state: StmState | str | None) -> Paged[StmItem]:
    value = None if state is None else StmState(state).value
    return Paged(_patient(patient_id, "stm"), decode.stm_item, _params(state=value))


# governance -------------------------------------------------------------------------------------


def grant(consents: Iterable[ConsentRecord]) -> Call[list[ConsentRecord]]:
    body = {
        "consents": [
            {
                "patient_id": c.patient_id,
                "grantee": c.grantee,
                "purpose": c.purpose,
                "decision": c.decision,
                "data_classes": list(c.data_classes),
                "start": c.start,
                "end": c.end,
            }
            for c in consents
        ]
    }
    return _post("/v1/consents", body, lambda docs: [decode.consent(d) for d in docs])


def revoke(consent_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/consents/{_seg(consent_id)}", lambda r: None)


def consents(patient_id: str | None) -> Paged[ConsentRecord]:
    return Paged("/v1/consents", decode.consent, _params(patient_id=patient_id))


def rotate_keys(reason: str) -> Call[int]:
    return _post("/v1/keys/rotate", {"reason": reason}, lambda d: int(d["count"]))


def shred(patient_id: str, reason: str) -> Call[int]:
    return _post(_patient(patient_id, "shred"), {"reason": reason}, lambda d: int(d["count"]))


def verify_audit(full: bool) -> Call[VerifyResult]:
    def parse(r: httpx.Response) -> VerifyResult:
        return decode.verify(r.json())

    return Call("GET", "/v1/audit/verify", parse, idempotent=True, params=_params(full=full))


def checkpoint() -> Call[tuple[int, str]]:
    return _post("/v1/audit/checkpoint", None, lambda d: (int(d["size"]), str(d["head"])))


def export_fhir() -> Call[tuple[bytes, int]]:
    """The NDJSON body and the number of resources (the caller writes the file)."""
    return Call(
        "GET", "/v1/audit/fhir", lambda r: (r.content, int(r.headers.get("X-Resource-Count", "0"))), idempotent=True
    )


def audit_trail(patient_id: str | None, after_seq: int, limit: int, tail: bool) -> Call[AuditTrail]:
    params = _params(patient_id=patient_id, after_seq=after_seq, limit=limit, tail=tail)
    return Call("GET", "/v1/audit/events", lambda r: decode.audit_trail(r.json()), idempotent=True, params=params)


def maintain() -> Call[MaintenanceReport]:
    return _post("/v1/maintain", None, decode.maintenance)


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
