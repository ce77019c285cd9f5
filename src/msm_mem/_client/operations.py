"""The operations of both clients, written once: each :class:`~msm_mem.MsmMem` operation as a
plan, a generator that yields the requests it needs (:class:`~.calls.Call`), is sent each one's
decoded answer (or has its error thrown in) and returns the operation's result. The signature
and docstring of a plan are those of the client method that runs it (:func:`method`):
:class:`~msm_mem.MemoryClient` runs a plan blocking, :class:`~msm_mem.AsyncMemoryClient`
awaiting each request; only what is sent and how it is retried differs."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

from .._agent.agent import AgentAnswer
from .._agent.answer import ModelRef
from .._api.care import Retrieved
from .._api.context import FusedContext, RecordedAnswer
from .._api.reads import RecordPage
from .._api.trail import AuditTrail
from .._governance.audit.verify import VerifyResult
from .._memory.maintenance import MaintenanceReport
from .._memory.msm import WriteResult
from .._principal import Principal
from .._records import EpisodicRecord, SemanticState, VisualRecord
from .._tier_records import Claim, ConsentRecord, StmItem, StmState
from . import calls, decode
from .calls import MAX_PAGES, Call, Image, Paged

if TYPE_CHECKING:
    import httpx

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: an operation's requests in order, each sent its decoded answer, returning a ``T``
Plan: TypeAlias = Generator[Call[Any], Any, T]


def one(call: Call[T]) -> Plan[T]:
    """The plan of one request: its decoded answer."""
    result: T = yield call
    return result


def listing(paged: Paged[T], offset: int = 0, limit: int | None = None) -> Plan[RecordPage[T]]:
    """``limit`` items (None: every one) from ``offset``, a page request at a time (the page is
    checked before the first)."""
    out: list[T] = []
    at: int | None = offset
    total = 0
    for _ in range(MAX_PAGES):
        want = calls.page_size(offset, limit, len(out))
        if at is None or want <= 0:
            break
        page: tuple[list[T], int | None, int] = yield paged.page(at, want)
        items, at, total = page
        out.extend(items)
    return RecordPage(out, offset, total)


def method(run: F, plan: Callable[..., Plan[Any]], owner: str) -> F:
    """``run`` as the method ``owner.<plan's name>``: the plan's name, docstring and signature
    (with ``self`` first, returning what the plan returns)."""
    signature = inspect.signature(plan)
    returns = signature.return_annotation
    if isinstance(returns, str) and returns.startswith("Plan[") and returns.endswith("]"):
        returns = returns[len("Plan[") : -1]
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    target: Any = run  # a function: its name, docstring and signature are writable
    target.__name__, target.__qualname__, target.__doc__ = plan.__name__, f"{owner}.{plan.__name__}", plan.__doc__
    target.__signature__ = signature.replace(
        parameters=[self, *signature.parameters.values()], return_annotation=returns
    )
    return run


# what the service is --------------------------------------------------------------------------


def health() -> Plan[bool]:
    """Whether the service answers and its store is ready."""
    try:
        ready: bool = yield Call("GET", "/ready", lambda r: bool(r.json()["status"] == "ready"), idempotent=True)
    except Exception:
        return False
    return ready


def whoami() -> Plan[tuple[Principal, tuple[str, ...]]]:
    """The principal of this client's credential and its patient scope (``("*",)``: all)."""

    def parse(r: httpx.Response) -> tuple[Principal, tuple[str, ...]]:
        d = r.json()
        return Principal(d["id"], d["role"], d["purpose"]), tuple(d["patients"])

    return one(Call("GET", "/v1/whoami", parse, idempotent=True))


# clinical operations ----------------------------------------------------------------------------


def ask(
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
) -> Plan[AgentAnswer]:
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
    return one(calls.form(calls.patient(patient_id, "ask"), image, image_study, fields, decode.answer))


def retrieve(
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
) -> Plan[Retrieved]:
    """:meth:`MsmMem.retrieve` (the first ``k`` ranked items); with ``image_study`` the stored
    study's embedding is the query."""
    fields = {"scope": scope, "at": at, "k": k, "use_sem": use_sem, "use_epi": use_epi, "use_vis": use_vis}
    return one(calls.form(calls.patient(patient_id, "retrieve"), image, image_study, fields, decode.retrieved))


def observe(
    patient_id: str,
    image: Image,
    question: str,
    *,
    image_study: str | None = None,
    timestamp: float | None = None,
    study_id: str = "",
    visual_tag: str = "",
) -> Plan[StmItem]:
    """:meth:`MsmMem.observe`."""
    fields = {"question": question, "timestamp": timestamp, "study_id": study_id, "visual_tag": visual_tag}
    return one(calls.form(calls.patient(patient_id, "observe"), image, image_study, fields, decode.stm_item))


def context(
    patient_id: str,
    image: Image,
    question: str,
    *,
    image_study: str | None = None,
    timestamp: float | None = None,
    study_id: str = "",
    visual_tag: str = "",
    include_image: bool = True,
    use_sem: bool = True,
    use_epi: bool = True,
    use_vis: bool = True,
) -> Plan[FusedContext]:
    """:meth:`MsmMem.context`; with ``include_image`` the context's ``image`` comes back too."""
    fields = {
        "question": question,
        "timestamp": timestamp,
        "study_id": study_id,
        "visual_tag": visual_tag,
        "include_image": include_image,
        "use_sem": use_sem,
        "use_epi": use_epi,
        "use_vis": use_vis,
    }
    return one(calls.form(calls.patient(patient_id, "context"), image, image_study, fields, decode.context))


def record_answer(
    patient_id: str,
    context_id: str,
    answer: str,
    *,
    model: ModelRef | Mapping[str, str],
    evidence: Sequence[str] = (),
    outcome: str = "",
) -> Plan[RecordedAnswer]:
    """:meth:`MsmMem.record_answer`."""
    ref = model.to_json() if isinstance(model, ModelRef) else dict(model)
    body = {"answer": answer, "evidence": list(evidence), "model": ref, "outcome": outcome}
    path = calls.patient(patient_id, f"context/{calls.segment(context_id)}/answer")
    return one(calls.post(path, body, decode.recorded_answer))


def consolidate(patient_id: str, item_id: str, answer: str, *, decision: str = "") -> Plan[WriteResult]:
    """:meth:`MsmMem.consolidate`."""
    path = calls.patient(patient_id, f"stm/{calls.segment(item_id)}/consolidate")
    return one(calls.post(path, {"answer": answer, "decision": decision}, decode.write_result))


def feedback(
    patient_id: str,
    study_id: str,
    *,
    accept: bool,
    correction: str = "",
    decision: str = "",
    question: str | None = None,
) -> Plan[Claim]:
    """:meth:`MsmMem.feedback`."""
    path = calls.patient(patient_id, f"studies/{calls.segment(study_id)}/feedback")
    body: dict[str, object] = {"accept": accept, "correction": correction, "decision": decision}
    if question is not None:
        body["question"] = question
    return one(calls.post(path, body, decode.claim))


# reads ------------------------------------------------------------------------------------------


def semantic_state(
    patient_id: str, category: str | None = None, *, offset: int = 0, limit: int | None = None
) -> Plan[RecordPage[SemanticState]]:
    """:meth:`MsmMem.semantic_state`."""
    paged = Paged(calls.patient(patient_id, "semantic"), decode.semantic, calls.params(category=category))
    return listing(paged, offset, limit)


def semantic_history(
    patient_id: str, category: str = "impression", *, offset: int = 0, limit: int | None = None
) -> Plan[RecordPage[SemanticState]]:
    """:meth:`MsmMem.semantic_history`."""
    paged = Paged(calls.patient(patient_id, "semantic/history"), decode.semantic, calls.params(category=category))
    return listing(paged, offset, limit)


def episodes(patient_id: str, *, offset: int = 0, limit: int | None = None) -> Plan[RecordPage[EpisodicRecord]]:
    """:meth:`MsmMem.episodes`."""
    return listing(Paged(calls.patient(patient_id, "episodes"), decode.episode), offset, limit)


def visuals(patient_id: str, *, offset: int = 0, limit: int | None = None) -> Plan[RecordPage[VisualRecord]]:
    """:meth:`MsmMem.visuals`."""
    return listing(Paged(calls.patient(patient_id, "visuals"), decode.visual), offset, limit)


def claims(
    patient_id: str, key: str | None = None, *, offset: int = 0, limit: int | None = None
) -> Plan[RecordPage[Claim]]:
    """:meth:`MsmMem.claims`."""
    return listing(Paged(calls.patient(patient_id, "claims"), decode.claim, calls.params(key=key)), offset, limit)


def claim_history(patient_id: str, key: str, *, offset: int = 0, limit: int | None = None) -> Plan[RecordPage[Claim]]:
    """:meth:`MsmMem.claim_history`."""
    paged = Paged(calls.patient(patient_id, "claims/history"), decode.claim, calls.params(key=key))
    return listing(paged, offset, limit)


def stm_items(
    patient_id: str, state: StmState | None = None, *, offset: int = 0, limit: int | None = None
) -> Plan[RecordPage[StmItem]]:
    """:meth:`MsmMem.stm_items`."""
    value = None if state is None else StmState(state).value
    paged = Paged(calls.patient(patient_id, "stm"), decode.stm_item, calls.params(state=value))
    return listing(paged, offset, limit)


# governance -------------------------------------------------------------------------------------


def grant(consents: Iterable[ConsentRecord]) -> Plan[list[ConsentRecord]]:
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
    return one(calls.post("/v1/consents", body, lambda docs: [decode.consent(d) for d in docs]))


def revoke(consent_id: str) -> Plan[None]:
    """:meth:`MsmMem.revoke`."""
    return one(Call("DELETE", f"/v1/consents/{calls.segment(consent_id)}", lambda r: None))


def consents(patient_id: str | None = None) -> Plan[list[ConsentRecord]]:
    """:meth:`MsmMem.consents`."""
    return listing(Paged("/v1/consents", decode.consent, calls.params(patient_id=patient_id)))


def rotate_keys(reason: str = "scheduled rotation") -> Plan[int]:
    """:meth:`MsmMem.rotate_keys`: the number of data keys rewrapped."""
    return one(calls.post("/v1/keys/rotate", {"reason": reason}, lambda d: int(d["count"])))


def shred(patient_id: str, reason: str) -> Plan[int]:
    """:meth:`MsmMem.shred`: the number of rows destroyed (the service's answer also carries the
    signed erasure receipt, ``POST /v1/audit/verify-erasure`` checks it)."""
    return one(calls.post(calls.patient(patient_id, "shred"), {"reason": reason}, lambda d: int(d["count"])))


def verify_audit(*, full: bool = True) -> Plan[VerifyResult]:
    """:meth:`MsmMem.verify_audit`."""
    params = calls.params(full=full)
    return one(Call("GET", "/v1/audit/verify", lambda r: decode.verify(r.json()), idempotent=True, params=params))


def checkpoint() -> Plan[tuple[int, str]]:
    """:meth:`MsmMem.checkpoint`: (size, head)."""
    return one(calls.post("/v1/audit/checkpoint", None, lambda d: (int(d["size"]), str(d["head"]))))


def export_fhir(out: str | os.PathLike[str]) -> Plan[int]:
    """:meth:`MsmMem.export_fhir`: writes the NDJSON to ``out``; the number of resources."""
    answer: tuple[bytes, int] = yield Call(
        "GET", "/v1/audit/fhir", lambda r: (r.content, int(r.headers.get("X-Resource-Count", "0"))), idempotent=True
    )
    content, count = answer
    Path(out).write_bytes(content)
    return count


def audit_trail(
    patient_id: str | None = None, *, after_seq: int = 0, limit: int = 200, tail: bool = False
) -> Plan[AuditTrail]:
    """:meth:`MsmMem.audit_trail` (the service pages at most 1000 events a call)."""
    params = calls.params(patient_id=patient_id, after_seq=after_seq, limit=limit, tail=tail)
    return one(Call("GET", "/v1/audit/events", lambda r: decode.audit_trail(r.json()), idempotent=True, params=params))


def maintain() -> Plan[MaintenanceReport]:
    """:meth:`MsmMem.maintain`."""
    return one(calls.post("/v1/maintain", None, decode.maintenance))
