"""Row <-> record conversion of the three memories, shared by the SQL stores (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import InvalidInput, InvalidVector
from .._records import EpisodicRecord, Impression, SemanticState, State, Vector, VisualRecord
from .batch import StateChange
from .codec import PII_FIELDS, FieldCodec

__all__ = [
    "EPISODIC_COLUMNS",
    "SEMANTIC_COLUMNS",
    "VISUAL_COLUMNS",
    "change_sets",
    "check_vector",
    "episode_from_row",
    "episode_to_row",
    "semantic_from_row",
    "semantic_to_row",
    "visual_from_row",
    "visual_to_row",
]

EPISODIC_COLUMNS = (
    "pos",
    "id",
    "patient_id",
    "study_id",
    "timestamp",
    "z",
    "question",
    "answer",
    "decision",
    "media_path",
    "media_description",
    "state",
    "confidence",
    "evidence_tier",
    "source",
    "created_at",
    "decay_at",
    "supersedes",
)
VISUAL_COLUMNS = (
    "pos",
    "id",
    "patient_id",
    "timestamp",
    "z",
    "media_path",
    "visual_tag",
    "source_episode_id",
    "state",
    "confidence",
    "evidence_tier",
    "source",
    "created_at",
    "decay_at",
    "supersedes",
)
SEMANTIC_COLUMNS = (
    "id",
    "patient_id",
    "category",
    "version",
    "state",
    "created_at",
    "supersedes",
    "evidence_tier",
    "impressions",
)


def check_vector(z: Vector, dim: int, what: str) -> None:
    """Refuse anything but a finite, L2-normalised (|1 - z.z| <= 1e-3) float32 vector of ``dim``."""
    if not isinstance(z, np.ndarray) or z.dtype != np.float32 or z.shape != (dim,):
        raise InvalidVector(f"{what}: expected a float32 vector of dimension {dim}")
    norm2 = float(z.dot(z))  # NaN or Inf anywhere makes this non-finite
    if not abs(norm2 - 1.0) <= 1e-3:
        raise InvalidVector(f"{what}: vector must be finite and L2-normalised")


#: non-PHI fields a state change may rewrite in place (anonymisation blanks identifiers and links
#: to the identified past, and coarsens times to the year)
PLAIN_REWRITABLE: dict[str, tuple[str, ...]] = {
    "episodic": ("source", "study_id", "supersedes", "timestamp", "created_at", "decay_at"),
    "visual": ("source", "source_episode_id", "supersedes", "timestamp", "created_at", "decay_at"),
    "claims": ("key", "supersedes", "created_at", "decay_at"),
    "semantic": ("supersedes", "created_at"),
}
_NUMERIC = frozenset({"timestamp", "created_at", "decay_at"})
_NULLABLE = frozenset({"supersedes", "decay_at"})


def change_sets(c: StateChange, old_patient_id: str, codec: FieldCodec) -> dict[str, object]:
    """Column -> new value of the UPDATE that applies ``c`` to a row of ``old_patient_id``.

    Re-keying (a new id or patient id) must rewrite every PHI field, because their ciphertexts
    are bound to the old id; PHI values go through ``codec``; other fields are refused unless
    listed in :data:`PLAIN_REWRITABLE`. Raises :class:`InvalidInput`.
    """
    table = c.table
    new_pid = old_patient_id if c.new_patient_id is None else c.new_patient_id
    new_id = c.new_id or c.record_id
    sets: dict[str, object] = {"state": c.to.value, "patient_id": new_pid, "id": new_id}
    pii = PII_FIELDS.get(table, ())
    given = dict(c.fields)
    if (new_id != c.record_id or new_pid != old_patient_id) and not set(pii) <= set(given):
        raise InvalidInput(f"re-keying a {table} record must rewrite every PHI field {pii}")
    for name, value in given.items():
        if name in pii:
            sets[name] = codec.encode(table, new_id, name, new_pid, value)
        elif name in PLAIN_REWRITABLE.get(table, ()):
            if value == "" and name in _NULLABLE:
                sets[name] = None
            elif name in _NUMERIC:
                try:
                    sets[name] = float(value)
                except ValueError as exc:
                    raise InvalidInput(f"field {name!r} of {table} must be a number, got {value!r}") from exc
            else:
                sets[name] = value
        else:
            raise InvalidInput(f"field {name!r} of {table} cannot be changed in place")
    return sets


def _enc(codec: FieldCodec, table: str, rid: str, pid: str, name: str, value: str) -> str:
    return codec.encode(table, rid, name, pid, value) if name in PII_FIELDS[table] else value


def episode_to_row(e: EpisodicRecord, pos: int, codec: FieldCodec) -> tuple[Any, ...]:
    def enc(n: str, v: str) -> str:
        return _enc(codec, "episodic", e.episode_id, e.patient_id, n, v)

    return (
        pos,
        e.episode_id,
        e.patient_id,
        e.study_id,
        e.timestamp,
        e.z.tobytes(),
        enc("question", e.question),
        enc("answer", e.answer),
        enc("decision", e.decision),
        enc("media_path", e.media_path),
        enc("media_description", e.media_description),
        e.state.value,
        e.confidence,
        e.evidence_tier,
        e.source,
        e.created_at,
        e.decay_at,
        e.supersedes,
    )


def _dec(codec: FieldCodec, table: str, rid: str, pid: str, name: str, value: str) -> str:
    return codec.decode(table, rid, name, pid, value) if name in PII_FIELDS[table] else value


def episode_from_row(r: Sequence[Any], codec: FieldCodec) -> EpisodicRecord:
    rid, pid = r[1], r[2]

    def dec(n: str, v: str) -> str:
        return _dec(codec, "episodic", rid, pid, n, v)

    return EpisodicRecord(
        episode_id=rid,
        patient_id=pid,
        study_id=r[3],
        timestamp=r[4],
        z=np.frombuffer(bytes(r[5]), dtype=np.float32).copy(),
        question=dec("question", r[6]),
        answer=dec("answer", r[7]),
        decision=dec("decision", r[8]),
        media_path=dec("media_path", r[9]),
        media_description=dec("media_description", r[10]),
        state=State(r[11]),
        confidence=r[12],
        evidence_tier=r[13],
        source=r[14],
        created_at=r[15],
        decay_at=r[16],
        supersedes=r[17],
    )


def visual_to_row(v: VisualRecord, pos: int, codec: FieldCodec) -> tuple[Any, ...]:
    return (
        pos,
        v.visual_id,
        v.patient_id,
        v.timestamp,
        v.z.tobytes(),
        _enc(codec, "visual", v.visual_id, v.patient_id, "media_path", v.media_path),
        _enc(codec, "visual", v.visual_id, v.patient_id, "visual_tag", v.visual_tag),
        v.source_episode_id,
        v.state.value,
        v.confidence,
        v.evidence_tier,
        v.source,
        v.created_at,
        v.decay_at,
        v.supersedes,
    )


def visual_from_row(r: Sequence[Any], codec: FieldCodec) -> VisualRecord:
    return VisualRecord(
        visual_id=r[1],
        patient_id=r[2],
        timestamp=r[3],
        z=np.frombuffer(bytes(r[4]), dtype=np.float32).copy(),
        media_path=_dec(codec, "visual", r[1], r[2], "media_path", r[5]),
        visual_tag=_dec(codec, "visual", r[1], r[2], "visual_tag", r[6]),
        source_episode_id=r[7],
        state=State(r[8]),
        confidence=r[9],
        evidence_tier=r[10],
        source=r[11],
        created_at=r[12],
        decay_at=r[13],
        supersedes=r[14],
    )


def semantic_to_row(s: SemanticState, codec: FieldCodec) -> tuple[Any, ...]:
    payload = json.dumps([[i.timestamp, i.text, i.decision] for i in s.impressions], ensure_ascii=False)
    return (
        s.state_id,
        s.patient_id,
        s.category,
        s.version,
        s.state.value,
        s.created_at,
        s.supersedes,
        s.evidence_tier,
        codec.encode("semantic", s.state_id, "impressions", s.patient_id, payload),
    )


def semantic_from_row(r: Sequence[Any], codec: FieldCodec) -> SemanticState:
    payload = codec.decode("semantic", r[0], "impressions", r[1], r[8])
    try:
        items = json.loads(payload)
        impressions = tuple(Impression(float(t), str(x), str(d)) for t, x, d in items)
    except (ValueError, TypeError):
        impressions = ()  # unreadable (for example crypto-shredded): an empty history
    return SemanticState(
        state_id=r[0],
        patient_id=r[1],
        category=r[2],
        version=r[3],
        state=State(r[4]),
        created_at=r[5],
        supersedes=r[6],
        evidence_tier=r[7],
        impressions=impressions,
    )
