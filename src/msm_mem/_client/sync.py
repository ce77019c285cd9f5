""":class:`MemoryClient`: the operations of :class:`~msm_mem.MsmMem`, call for call, over HTTP."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from .._agent.agent import AgentAnswer
from .._api.care import Retrieved
from .._api.reads import RecordPage
from .._api.trail import AuditTrail
from .._errors import MissingExtra
from .._governance.audit_chain import VerifyResult
from .._memory.maintenance import MaintenanceReport
from .._memory.msm import WriteResult
from .._principal import Principal
from .._records import EpisodicRecord, SemanticState, VisualRecord
from .._tier_records import Claim, ConsentRecord, StmItem, StmState
from . import calls
from .calls import MAX_PAGES, Call, Image, Paged

if TYPE_CHECKING:
    import httpx

__all__ = ["MemoryClient"]

T = TypeVar("T")


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
        headers = calls.headers(token, retries, break_glass_reason)
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

    def _run(self, call: Call[T]) -> T:
        attempts = 1 + (self._retries if call.idempotent else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._http.request(call.method, call.path, **call.send_kwargs())
            except self._httpx.TransportError as exc:
                if last:
                    raise calls.unreachable(call, exc) from exc
            else:
                if last or not calls.retryable(response):
                    return calls.answer(call, response)
            time.sleep(self._backoff * 2**attempt)
        raise AssertionError("unreachable")

    def _list(self, paged: Paged[T], offset: int = 0, limit: int | None = None) -> RecordPage[T]:
        """``limit`` items (None: every one) from ``offset``, a page request at a time."""
        out: list[T] = []
        at: int | None = offset
        total = 0
        for _ in range(MAX_PAGES):
            want = calls.page_size(offset, limit, len(out))
            if at is None or want <= 0:
                break
            items, at, total = self._run(paged.page(at, want))
            out.extend(items)
        return RecordPage(out, offset, total)

    # what the service is ----------------------------------------------------------------------

    def health(self) -> bool:
        """Whether the service answers and its store is ready."""
        try:
            return self._run(calls.ready())
        except Exception:
            return False

    def whoami(self) -> tuple[Principal, tuple[str, ...]]:
        """The principal of this client's credential and its patient scope (``("*",)``: all)."""
        return self._run(calls.whoami())

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
        call = calls.ask(
            patient_id,
            image,
            question,
            image_study=image_study,
            timestamp=timestamp,
            study_id=study_id,
            visual_tag=visual_tag,
            write_back=write_back,
            use_sem=use_sem,
            use_epi=use_epi,
            use_vis=use_vis,
        )
        return self._run(call)

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
        call = calls.retrieve(
            patient_id,
            image,
            image_study=image_study,
            scope=scope,
            at=at,
            k=k,
            use_sem=use_sem,
            use_epi=use_epi,
            use_vis=use_vis,
        )
        return self._run(call)

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
        call = calls.observe(
            patient_id,
            image,
            question,
            image_study=image_study,
            timestamp=timestamp,
            study_id=study_id,
            visual_tag=visual_tag,
        )
        return self._run(call)

    def consolidate(self, patient_id: str, item_id: str, answer: str, *, decision: str = "") -> WriteResult:
        """:meth:`MsmMem.consolidate`."""
        return self._run(calls.consolidate(patient_id, item_id, answer, decision=decision))

    def feedback(
        self, patient_id: str, study_id: str, *, accept: bool, correction: str = "", decision: str = ""
    ) -> Claim:
        """:meth:`MsmMem.feedback`."""
        return self._run(calls.feedback(patient_id, study_id, accept=accept, correction=correction, decision=decision))

    # reads ------------------------------------------------------------------------------------

    def semantic_state(
        self, patient_id: str, category: str | None = None, *, offset: int = 0, limit: int | None = None
    ) -> RecordPage[SemanticState]:
        """:meth:`MsmMem.semantic_state`."""
        return self._list(calls.semantic_state(patient_id, category), offset, limit)

    def semantic_history(
        self, patient_id: str, category: str = "impression", *, offset: int = 0, limit: int | None = None
    ) -> RecordPage[SemanticState]:
        """:meth:`MsmMem.semantic_history`."""
        return self._list(calls.semantic_history(patient_id, category), offset, limit)

    def episodes(self, patient_id: str, *, offset: int = 0, limit: int | None = None) -> RecordPage[EpisodicRecord]:
        """:meth:`MsmMem.episodes`."""
        return self._list(calls.episodes(patient_id), offset, limit)

    def visuals(self, patient_id: str, *, offset: int = 0, limit: int | None = None) -> RecordPage[VisualRecord]:
        """:meth:`MsmMem.visuals`."""
        return self._list(calls.visuals(patient_id), offset, limit)

    def claims(
        self, patient_id: str, key: str | None = None, *, offset: int = 0, limit: int | None = None
    ) -> RecordPage[Claim]:
        """:meth:`MsmMem.claims`."""
        return self._list(calls.claims(patient_id, key), offset, limit)

    def claim_history(
        self, patient_id: str, key: str, *, offset: int = 0, limit: int | None = None
    ) -> RecordPage[Claim]:
        """:meth:`MsmMem.claim_history`."""
        return self._list(calls.claim_history(patient_id, key), offset, limit)

    def stm_items(
        self, patient_id: str, state: StmState | None = None, *, offset: int = 0, limit: int | None = None
    ) -> RecordPage[StmItem]:
        """:meth:`MsmMem.stm_items`."""
        return self._list(calls.stm_items(patient_id, state), offset, limit)

    # governance -------------------------------------------------------------------------------

    def grant(self, consents: Iterable[ConsentRecord]) -> list[ConsentRecord]:
        """:meth:`MsmMem.grant`; the server gives each consent its id and creation time and
        returns the stored records."""
        return self._run(calls.grant(consents))

    def revoke(self, consent_id: str) -> None:
        """:meth:`MsmMem.revoke`."""
        self._run(calls.revoke(consent_id))

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        """:meth:`MsmMem.consents`."""
        return self._list(calls.consents(patient_id))

    def rotate_keys(self, reason: str = "scheduled rotation") -> int:
        """:meth:`MsmMem.rotate_keys`: the number of data keys rewrapped."""
        return self._run(calls.rotate_keys(reason))

    def shred(self, patient_id: str, reason: str) -> int:
        """:meth:`MsmMem.shred`: the number of records retracted."""
        return self._run(calls.shred(patient_id, reason))

    def verify_audit(self, *, full: bool = True) -> VerifyResult:
        """:meth:`MsmMem.verify_audit`."""
        return self._run(calls.verify_audit(full))

    def checkpoint(self) -> tuple[int, str]:
        """:meth:`MsmMem.checkpoint`: (size, head)."""
        return self._run(calls.checkpoint())

    def export_fhir(self, out: str | os.PathLike[str]) -> int:
        """:meth:`MsmMem.export_fhir`: writes the NDJSON to ``out``; the number of resources."""
        content, count = self._run(calls.export_fhir())
        Path(out).write_bytes(content)
        return count

    def audit_trail(
        self, patient_id: str | None = None, *, after_seq: int = 0, limit: int = 200, tail: bool = False
    ) -> AuditTrail:
        """:meth:`MsmMem.audit_trail` (the service pages at most 1000 events a call)."""
        return self._run(calls.audit_trail(patient_id, after_seq, limit, tail))

    def maintain(self) -> MaintenanceReport:
        """:meth:`MsmMem.maintain`."""
        return self._run(calls.maintain())
