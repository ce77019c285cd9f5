"""The service's JSON as the library's records, and its problem documents as the library's
exceptions. Embeddings are not sent: a decoded record's ``z`` is an empty read-only vector."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np

from .._agent.agent import AgentAnswer, Evidence
from .._agent.answer import ModelRef
from .._api.care import Retrieved, RetrievedItem
from .._api.context import FusedContext, RecordedAnswer
from .._api.trail import AuditTrail
from .._errors import AuditChainBroken, ManifestError, MissingExtra, MsmMemError
from .._governance.audit.checkpoint import Checkpoint
from .._governance.audit.event import AuditEvent
from .._governance.audit.verify import VerifyResult
from .._memory.gate import GateDecision
from .._memory.maintenance import MaintenanceReport
from .._memory.msm import WriteResult
from .._problems import problem_of_type
from .._records import EpisodicRecord, Impression, SemanticState, State, VisualRecord
from .._tier_records import Claim, ConsentRecord, StmItem, StmPayload, StmState

__all__ = [
    "answer",
    "claim",
    "consent",
    "context",
    "episode",
    "error",
    "maintenance",
    "model",
    "recorded_answer",
    "retrieved",
    "semantic",
    "stm_item",
    "verify",
    "visual",
    "write_result",
]

_NO_VECTOR = np.zeros(0, dtype=np.float32)
_NO_VECTOR.flags.writeable = False


def evidence(d: dict[str, Any]) -> Evidence:
    return Evidence(
        d["id"],
        d["kind"],
        d["score"],
        d["cosine"],
        d["confidence"],
        d["freshness"],
        d["tier_weight"],
        d.get("evidence_tier", ""),
    )


def gate(d: dict[str, Any] | None) -> GateDecision | None:
    if d is None:
        return None
    return GateDecision(d["written"], tuple(d["reasons"]), d["max_cosine"], tuple(d["keywords"]))


def answer(d: dict[str, Any]) -> AgentAnswer:
    return AgentAnswer(
        answer=d["answer"],
        evidence=tuple(evidence(e) for e in d["evidence"]),
        gate=gate(d["gate"]),
        prompt=d["prompt"],
        backbone=d["backbone"],
        source=d["source"],
        decision=d["decision"],
        cited=tuple(d.get("cited", ())),
        model=None if d.get("model") is None else model(d["model"]),
    )


def model(d: dict[str, Any]) -> ModelRef:
    return ModelRef(d["backbone"], d["model"], d["version"])


_PNG_URL = "data:image/png;base64,"


def context(d: dict[str, Any]) -> FusedContext:
    """A context; its image (when the service sent one) as grayscale values in [0, 1]."""
    image = None
    if isinstance(d.get("image"), str) and d["image"].startswith(_PNG_URL):
        from PIL import Image

        with Image.open(io.BytesIO(base64.b64decode(d["image"][len(_PNG_URL) :]))) as png:
            image = np.asarray(png.convert("L"), dtype=np.float32) / 255.0
    return FusedContext(
        d["context_id"],
        d["patient_id"],
        d["question"],
        d["prompt"],
        tuple(d["included"]),
        tuple(d["dropped"]),
        d["budget_chars"],
        tuple(evidence(e) for e in d["evidence"]),
        d["study_id"],
        d["image_study"],
        d["expires_at"],
        image,
    )


def recorded_answer(d: dict[str, Any]) -> RecordedAnswer:
    g = gate(d["gate"])
    assert g is not None
    return RecordedAnswer(
        d["context_id"], g, d["episode_id"], d["answer"], d["source"], tuple(d["evidence"]), model(d["model"])
    )


def episode(d: dict[str, Any]) -> EpisodicRecord:
    fields = {k: v for k, v in d.items() if k != "kind"}
    return EpisodicRecord(**{**fields, "z": _NO_VECTOR, "state": State(d["state"])})


def visual(d: dict[str, Any]) -> VisualRecord:
    fields = {k: v for k, v in d.items() if k != "kind"}
    return VisualRecord(**{**fields, "z": _NO_VECTOR, "state": State(d["state"])})


def semantic(d: dict[str, Any]) -> SemanticState:
    return SemanticState(
        state_id=d["state_id"],
        patient_id=d["patient_id"],
        category=d["category"],
        impressions=tuple(Impression(i["timestamp"], i["text"], i["decision"]) for i in d["impressions"]),
        version=d["version"],
        state=State(d["state"]),
        created_at=d["created_at"],
        supersedes=d["supersedes"],
        evidence_tier=d["evidence_tier"],
    )


def _record(d: dict[str, Any] | None) -> EpisodicRecord | VisualRecord | SemanticState | None:
    if d is None:
        return None
    if d["kind"] == "episodic":
        return episode(d)
    if d["kind"] == "visual":
        return visual(d)
    return semantic(d)


def retrieved(d: dict[str, Any]) -> Retrieved:
    items = tuple(RetrievedItem(evidence(i["evidence"]), _record(i["record"])) for i in d["items"])
    return Retrieved(d["patient_id"], d["scope"], items)


def claim(d: dict[str, Any]) -> Claim:
    return Claim(**{**d, "state": State(d["state"])})


def stm_item(d: dict[str, Any]) -> StmItem:
    payload = None if d.get("payload") is None else StmPayload(**d["payload"])
    return StmItem(**{**d, "payload": payload, "state": StmState(d["state"])})


def consent(d: dict[str, Any]) -> ConsentRecord:
    return ConsentRecord(**{**d, "data_classes": tuple(d["data_classes"])})


def write_result(d: dict[str, Any]) -> WriteResult:
    g = gate(d["gate"])
    assert g is not None
    return WriteResult(g, d["episode_id"], d["visual_id"], None if d["semantic"] is None else semantic(d["semantic"]))


def verify(d: dict[str, Any]) -> VerifyResult:
    return VerifyResult(d["ok"], d["count"], d["head_hash"], d["first_bad_seq"], d["reason"])


def maintenance(d: dict[str, Any]) -> MaintenanceReport:
    cp = d["checkpoint"]
    return MaintenanceReport(
        expired=d["expired"],
        consolidated=d["consolidated"],
        discarded=d["discarded"],
        anonymized=d["anonymized"],
        retracted=d["retracted"],
        checkpoint=None if cp is None else (cp["size"], cp["head"]),
        notes=tuple(d["notes"]),
    )


def error(status: int, body: object) -> MsmMemError:
    """The library exception a problem document stands for (MsmMemError for one this version
    does not know, or a body that is not a problem)."""
    doc = body if isinstance(body, dict) else {}
    detail = str(doc.get("detail") or doc.get("title") or f"HTTP {status}")
    problem = problem_of_type(str(doc.get("type", "")))
    if problem is None:
        return MsmMemError(f"HTTP {status}: {detail}")
    cls = problem.error
    if cls is AuditChainBroken:
        seq = doc.get("seq")
        return AuditChainBroken(detail, seq if isinstance(seq, int) else None)
    if cls is ManifestError:
        line = doc.get("line")
        return ManifestError(detail, line if isinstance(line, int) else None)
    if cls is MissingExtra:
        return MissingExtra(str(doc.get("package", "?")), str(doc.get("extra", "?")))
    return cls(detail)


def audit_trail(d: dict[str, Any]) -> AuditTrail:
    """The service's audit trail page; each event's fields are checked as it is rebuilt."""
    return AuditTrail(
        events=tuple(AuditEvent(**{**e, "record_ids": tuple(e["record_ids"])}) for e in d["events"]),
        head_seq=int(d["head_seq"]),
        next_after=d["next_after"],
        unreadable_seq=d["unreadable_seq"],
        checkpoints=tuple(Checkpoint(**c) for c in d["checkpoints"]),
    )
