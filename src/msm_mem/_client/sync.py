""":class:`MemoryClient`: the operations of :class:`~msm_mem.MsmMem`, call for call, over HTTP."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .._agent.agent import AgentAnswer
from .._api.care import Retrieved
from .._errors import BackendError, InvalidInput, MissingExtra
from .._governance.audit_chain import VerifyResult
from .._memory.maintenance import MaintenanceReport
from .._memory.msm import WriteResult
from .._principal import Principal
from .._records import EpisodicRecord, SemanticState, VisualRecord
from .._tier_records import Claim, ConsentRecord, StmItem, StmState
from . import decode

if TYPE_CHECKING:
    import httpx

__all__ = ["MemoryClient"]

T = TypeVar("T")
Image = str | os.PathLike[str] | bytes | None

#: statuses worth another try of an idempotent call (the server or a proxy was briefly away)
_RETRY_STATUSES = frozenset({502, 503, 504})
_PAGE = 500
_MAX_PAGES = 100_000


class MemoryClient:
    """A client of ``msm-mem serve`` at ``base_url``, acting as the principal of ``token`` (an
    API key or a JWT): the server takes who is asking from the credential, never from a call.

    Each method mirrors the :class:`~msm_mem.MsmMem` operation of the same name without its
    principal argument, and returns the same frozen records (embeddings are not sent: a
    record's ``z`` is an empty vector). Lists are fetched page by page until the last.
    Refusals and errors raise the library's exceptions (``AccessDenied``, ``ConsentDenied``,
    ``NotFound``, ``InvalidInput``...), from the server's RFC 9457 problem documents.

    Only idempotent calls (the reads, audit verification and export) are retried, up to
    ``retries`` more times on a transport error or a 502/503/504, ``backoff_s`` apart and
    doubling. ``break_glass_reason`` (admins only) is sent with every call to act outside the
    credential's patient scope; the server audits it. ``transport`` replaces the network (an
    ``httpx`` transport, for tests).
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        break_glass_reason: str | None = None,
        transport: httpx.BaseTransport | None = None,
        verify: bool | str = True,
    ) -> None:
        try:
            import httpx
        except ImportError:
            raise MissingExtra("httpx", "client") from None
        if not isinstance(token, str) or not token.strip():
            raise InvalidInput("a MemoryClient needs a bearer token")
        if not 0 <= retries <= 10:
            raise InvalidInput("retries must be between 0 and 10")
        headers = {"Authorization": f"Bearer {token.strip()}", "Accept": "application/json"}
        if break_glass_reason:
            headers["X-Break-Glass-Reason"] = " ".join(break_glass_reason.split())
        self._httpx = httpx
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport, verify=verify
        )
        self._retries = retries
        self._backoff = backoff_s

    # plumbing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> MemoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, *, idempotent: bool, **kwargs: Any) -> httpx.Response:
        attempts = 1 + (self._retries if idempotent else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._http.request(method, path, **kwargs)
            except self._httpx.TransportError as exc:
                if last:
                    raise BackendError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            else:
                if response.status_code not in _RETRY_STATUSES or last:
                    if response.is_success:
                        return response
                    raise decode.error(response.status_code, _json(response))
            time.sleep(self._backoff * 2**attempt)
        raise AssertionError("unreachable")

    def _get(self, path: str, **params: Any) -> Any:
        return self._send("GET", path, idempotent=True, params=_params(params)).json()

    def _post(self, path: str, body: Any = None) -> Any:
        response = self._send("POST", path, idempotent=False, json=body)
        return response.json() if response.content else None

    def _form(self, path: str, image: Image, image_study: str | None, fields: dict[str, Any]) -> Any:
        data = {k: _field(v) for k, v in fields.items() if v is not None}
        files = None
        if image_study is not None:
            data["image_study"] = image_study
        if image is not None:
            content = image if isinstance(image, bytes) else Path(image).read_bytes()
            name = "image" if isinstance(image, bytes) else Path(image).name
            files = {"image": (name, content, "application/octet-stream")}
        return self._send("POST", path, idempotent=False, data=data, files=files).json()

    def _list(self, path: str, parse: Callable[[dict[str, Any]], T], **params: Any) -> list[T]:
        out: list[T] = []
        offset: int | None = 0
        for _ in range(_MAX_PAGES):
            if offset is None:
                break
            doc = self._get(path, offset=offset, limit=_PAGE, **params)
            out.extend(parse(d) for d in doc["items"])
            offset = doc["next_offset"]
        return out

    # what the service is ----------------------------------------------------------------------

    def health(self) -> bool:
        """Whether the service answers and its store is ready."""
        try:
            return bool(self._get("/ready")["status"] == "ready")
        except Exception:
            return False

    def whoami(self) -> tuple[Principal, tuple[str, ...]]:
        """The principal of this client's credential and its patient scope (``("*",)``: all)."""
        d = self._get("/v1/whoami")
        return Principal(d["id"], d["role"], d["purpose"]), tuple(d["patients"])

    # clinical operations ----------------------------------------------------------------------

    def ask(
        self,
        patient_id: str,
        image: Image,
        question: str,
        *,
        image_study: str | None = None,
        timestamp: float | None = None,
        study_id: str = "",
        visual_tag: str = "",
        write_back: bool = True,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
    ) -> AgentAnswer:
        """:meth:`MsmMem.ask`: ``image`` is a file path or its bytes, or None with
        ``image_study`` naming a stored study of the patient whose image the server uses."""
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
        return decode.answer(self._form(f"/v1/patients/{_seg(patient_id)}/ask", image, image_study, fields))

    def retrieve(
        self,
        patient_id: str,
        image: Image,
        *,
        image_study: str | None = None,
        scope: Literal["patient", "population"] = "patient",
        at: float | None = None,
        k: int = 10,
        use_sem: bool = True,
        use_epi: bool = True,
        use_vis: bool = True,
    ) -> Retrieved:
        """:meth:`MsmMem.retrieve` (the first ``k`` ranked items)."""
        fields = {"scope": scope, "at": at, "k": k, "use_sem": use_sem, "use_epi": use_epi, "use_vis": use_vis}
        return decode.retrieved(self._form(f"/v1/patients/{_seg(patient_id)}/retrieve", image, image_study, fields))

    def observe(
        self,
        patient_id: str,
        image: Image,
        question: str,
        *,
        image_study: str | None = None,
        timestamp: float | None = None,
        study_id: str = "",
        visual_tag: str = "",
    ) -> StmItem:
        """:meth:`MsmMem.observe`."""
        fields = {"question": question, "timestamp": timestamp, "study_id": study_id, "visual_tag": visual_tag}
        return decode.stm_item(self._form(f"/v1/patients/{_seg(patient_id)}/observe", image, image_study, fields))

    def consolidate(self, patient_id: str, item_id: str, answer: str, *, decision: str = "") -> WriteResult:
        """:meth:`MsmMem.consolidate`."""
        path = f"/v1/patients/{_seg(patient_id)}/stm/{_seg(item_id)}/consolidate"
        return decode.write_result(self._post(path, {"answer": answer, "decision": decision}))

    def feedback(
        self, patient_id: str, study_id: str, *, accept: bool, correction: str = "", decision: str = ""
    ) -> Claim:
        """:meth:`MsmMem.feedback`."""
        path = f"/v1/patients/{_seg(patient_id)}/studies/{_seg(study_id)}/feedback"
        return decode.claim(self._post(path, {"accept": accept, "correction": correction, "decision": decision}))

    # reads ------------------------------------------------------------------------------------

    def semantic_state(self, patient_id: str, category: str | None = None) -> list[SemanticState]:
        """:meth:`MsmMem.semantic_state`."""
        return self._list(f"/v1/patients/{_seg(patient_id)}/semantic", decode.semantic, category=category)

    def semantic_history(self, patient_id: str, category: str = "impression") -> list[SemanticState]:
        """:meth:`MsmMem.semantic_history`."""
        return self._list(f"/v1/patients/{_seg(patient_id)}/semantic/history", decode.semantic, category=category)

    def episodes(self, patient_id: str) -> list[EpisodicRecord]:
        """:meth:`MsmMem.episodes`."""
        return self._list(f"/v1/patients/{_seg(patient_id)}/episodes", decode.episode)

    def visuals(self, patient_id: str) -> list[VisualRecord]:
        """:meth:`MsmMem.visuals`."""
        return self._list(f"/v1/patients/{_seg(patient_id)}/visuals", decode.visual)

    def claims(self, patient_id: str, key: str | None = None) -> list[Claim]:
        """:meth:`MsmMem.claims`."""
        return self._list(f"/v1/patients/{_seg(patient_id)}/claims", decode.claim, key=key)

    def claim_history(self, patient_id: str, key: str) -> list[Claim]:
        """:meth:`MsmMem.claim_history`."""
        return self._list(f"/v1/patients/{_seg(patient_id)}/claims/history", decode.claim, key=key)

    def stm_items(self, patient_id: str, state: StmState | None = None) -> list[StmItem]:
        """:meth:`MsmMem.stm_items`."""
        value = None if state is None else StmState(state).value
        return self._list(f"/v1/patients/{_seg(patient_id)}/stm", decode.stm_item, state=value)

    # governance -------------------------------------------------------------------------------

    def grant(self, consents: Iterable[ConsentRecord]) -> list[ConsentRecord]:
        """:meth:`MsmMem.grant`; the server gives each consent its id and creation time and
        returns the stored records."""
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
        return [decode.consent(d) for d in self._post("/v1/consents", body)]

    def revoke(self, consent_id: str) -> None:
        """:meth:`MsmMem.revoke`."""
        self._send("DELETE", f"/v1/consents/{_seg(consent_id)}", idempotent=False)

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        """:meth:`MsmMem.consents`."""
        return self._list("/v1/consents", decode.consent, patient_id=patient_id)

    def rotate_keys(self, reason: str = "scheduled rotation") -> int:
        """:meth:`MsmMem.rotate_keys`: the number of data keys rewrapped."""
        return int(self._post("/v1/keys/rotate", {"reason": reason})["count"])

    def shred(self, patient_id: str, reason: str) -> int:
        """:meth:`MsmMem.shred`: the number of records retracted."""
        return int(self._post(f"/v1/patients/{_seg(patient_id)}/shred", {"reason": reason})["count"])

    def verify_audit(self, *, full: bool = True) -> VerifyResult:
        """:meth:`MsmMem.verify_audit`."""
        return decode.verify(self._get("/v1/audit/verify", full=full))

    def checkpoint(self) -> tuple[int, str]:
        """:meth:`MsmMem.checkpoint`: (size, head)."""
        d = self._post("/v1/audit/checkpoint")
        return int(d["size"]), str(d["head"])

    def export_fhir(self, out: str | os.PathLike[str]) -> int:
        """:meth:`MsmMem.export_fhir`: writes the NDJSON to ``out``; the number of resources."""
        response = self._send("GET", "/v1/audit/fhir", idempotent=True)
        Path(out).write_bytes(response.content)
        return int(response.headers.get("X-Resource-Count", "0"))

    def maintain(self) -> MaintenanceReport:
        """:meth:`MsmMem.maintain`."""
        return decode.maintenance(self._post("/v1/maintain"))


def _seg(value: str) -> str:
    """``value`` as one path segment (quoted; "", "." and ".." are refused)."""
    from urllib.parse import quote

    if not isinstance(value, str) or value in ("", ".", ".."):
        raise InvalidInput(f"not an id: {value!r}")
    return quote(value, safe="")


def _field(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _params(params: dict[str, Any]) -> dict[str, str]:
    return {k: _field(v) for k, v in params.items() if v is not None}


def _json(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None
