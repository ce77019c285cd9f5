"""Typed records of the paper's three memories, shared by every layer.

Field names follow the paper (section 2.2 and appendix A.1): episodic records
``(episode_id, patient_id, timestamp, z, question, answer, decision, media_path,
media_description)``, visual records ``(visual_id, patient_id, timestamp, z, media_path,
visual_tag, source_episode_id)`` and a per-patient, per-category semantic state that keeps a
bounded history of impressions. Times are UTC seconds since the epoch; ``z`` is an
L2-normalised float32 vector.

The governance columns (``state``, ``confidence``, ``evidence_tier``, ``created_at``,
``decay_at``, ``source``, ``supersedes``) are part of every long-term record from the start, so
that the tiers of the governance layer need no second schema.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ._errors import InvalidInput, InvalidVector
from ._limits import MAX_QUESTION_CHARS, MAX_TAG_CHARS, MAX_TEXT_CHARS, check_id, check_path, check_text

__all__ = [
    "Claim",
    "EpisodicRecord",
    "Hit",
    "Impression",
    "Kind",
    "QUESTION_TYPES",
    "ManifestRow",
    "RowProblem",
    "SemanticState",
    "State",
    "Vector",
    "VisualRecord",
    "keyed_id",
    "new_id",
    "readonly",
    "unit_vector",
]

Vector = npt.NDArray[np.float32]
Kind = Literal["episodic", "visual", "semantic", "claim"]


class State(StrEnum):
    """Lifecycle state of a long-term record (seed: Active / Superseded / Anonymized / Retracted)."""

    ACTIVE = "active"
    SUPERSEDED = "superseded"
    ANONYMIZED = "anonymized"
    RETRACTED = "retracted"


def new_id(prefix: str) -> str:
    """A random, stable identifier such as ``E-1f0c...`` (128 random bits as 32 hex digits);
    never derived from patient data (but see :func:`keyed_id`)."""
    return f"{prefix}-{os.urandom(16).hex()}"


def keyed_id(prefix: str, key: bytes, *parts: str) -> str:
    """The identifier of a record whose identity is its content (an ingested row): the first
    128 bits of HMAC-SHA256 under a store secret ``key`` of the ``parts``, as 32 hex digits, so
    two writers of the same row make the same id and the database keeps one; without the key
    the id tells nothing of the parts."""
    message = "\x1f".join(parts).encode("utf-8")
    return f"{prefix}-{hmac.new(key, message, hashlib.sha256).hexdigest()[:32]}"


def readonly(z: Any) -> Any:
    """``z`` itself when it is not a writable array, else a read-only copy: a record handed out
    cannot have its embedding changed in place (and never aliases the caller's buffer)."""
    if isinstance(z, np.ndarray) and z.flags.writeable:
        z = z.copy()
        z.flags.writeable = False
    return z


def unit_vector(z: object, dim: int) -> Vector:
    """Validate ``z`` and return it L2-normalised as a contiguous float32 vector of ``dim``.

    Raises :class:`InvalidVector` for a wrong shape or dimension, NaN/Inf values or a zero norm.
    """
    if isinstance(z, np.ndarray) and z.dtype == np.float32 and z.shape == (dim,):
        # float32 entries squared cannot overflow or underflow in float64: no scaling needed,
        # and a NaN or infinite entry makes the sum of squares non-finite
        wide = z.astype(np.float64)
        squares = float(np.dot(wide, wide))
        if not math.isfinite(squares):
            raise InvalidVector("vector contains NaN or infinite values")
        if squares == 0.0:
            raise InvalidVector("vector has zero norm and cannot be normalised")
        return (wide / math.sqrt(squares)).astype(np.float32)
    try:
        arr = np.asarray(z, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InvalidVector(f"not a numeric vector: {exc}") from exc
    if arr.ndim != 1:
        raise InvalidVector(f"expected a 1-d vector, got shape {arr.shape}")
    if arr.shape[0] != dim:
        raise InvalidVector(f"expected dimension {dim}, got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)):
        raise InvalidVector("vector contains NaN or infinite values")
    # scale by the largest magnitude first: squares of huge (or subnormal) entries would
    # overflow (or underflow) the norm although the direction is well defined
    scale = float(np.max(np.abs(arr))) if arr.size else 0.0
    if scale == 0.0:
        raise InvalidVector("vector has zero norm and cannot be normalised")
    arr = arr / scale
    return np.ascontiguousarray(arr / np.linalg.norm(arr), dtype=np.float32)


def _check_text(name: str, value: object, *, required: bool = False) -> None:
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise InvalidInput(f"{name} must not be empty")


# UTC seconds of 0001-01-01 and 9999-12-31T23:59:59: times outside cannot be shown as dates
_MIN_TIME, _MAX_TIME = -62_135_596_800.0, 253_402_300_799.0


def _check_time(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number of UTC seconds, got {value!r}")
    if not _MIN_TIME <= value <= _MAX_TIME:
        raise InvalidInput(f"{name} is outside the years 1-9999, got {value!r}")


def _check_confidence(value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 <= value <= 1.0:
        raise InvalidInput(f"confidence must be in [0, 1], got {value!r}")


@dataclass(frozen=True, slots=True)
class EpisodicRecord:
    """One past interaction: what was seen, asked, answered and decided (paper e_i)."""

    episode_id: str
    patient_id: str
    timestamp: float
    z: Vector = field(repr=False, compare=False)
    question: str
    answer: str
    decision: str = ""
    media_path: str = ""
    media_description: str = ""
    study_id: str = ""
    state: State = State.ACTIVE
    confidence: float = 1.0
    evidence_tier: str = "agent"
    source: str = ""
    created_at: float = 0.0
    decay_at: float | None = None
    supersedes: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "z", readonly(self.z))
        _check_text("episode_id", self.episode_id, required=True)
        _check_text("patient_id", self.patient_id)
        _check_time("timestamp", self.timestamp)
        for name in ("question", "answer", "decision", "media_path", "media_description"):
            _check_text(name, getattr(self, name))
        _check_confidence(self.confidence)


@dataclass(frozen=True, slots=True)
class VisualRecord:
    """One visual observation kept for prototype-level retrieval (paper v_i)."""

    visual_id: str
    patient_id: str
    timestamp: float
    z: Vector = field(repr=False, compare=False)
    media_path: str = ""
    visual_tag: str = ""
    source_episode_id: str = ""
    state: State = State.ACTIVE
    confidence: float = 1.0
    evidence_tier: str = "agent"
    source: str = ""
    created_at: float = 0.0
    decay_at: float | None = None
    supersedes: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "z", readonly(self.z))
        _check_text("visual_id", self.visual_id, required=True)
        _check_text("patient_id", self.patient_id)
        _check_time("timestamp", self.timestamp)
        for name in ("media_path", "visual_tag", "source_episode_id"):
            _check_text(name, getattr(self, name))
        _check_confidence(self.confidence)


@dataclass(frozen=True, slots=True)
class Impression:
    """One entry of a semantic history: an impression, its decision and its time marker."""

    timestamp: float
    text: str
    decision: str = ""

    def __post_init__(self) -> None:
        _check_time("impression timestamp", self.timestamp)
        _check_text("impression text", self.text)
        _check_text("impression decision", self.decision)


@dataclass(frozen=True, slots=True)
class SemanticState:
    """A patient's semantic memory for one category: a bounded impression history.

    Each update is a new version that supersedes the previous one; ``impressions`` are ordered
    oldest first and hold at most N entries (paper default N=5).
    """

    state_id: str
    patient_id: str
    category: str
    impressions: tuple[Impression, ...]
    version: int = 1
    state: State = State.ACTIVE
    created_at: float = 0.0
    supersedes: str | None = None
    evidence_tier: str = "agent"

    def __post_init__(self) -> None:
        _check_text("state_id", self.state_id, required=True)
        _check_text("patient_id", self.patient_id)
        _check_text("category", self.category)
        if not isinstance(self.impressions, tuple) or not all(isinstance(i, Impression) for i in self.impressions):
            raise InvalidInput("impressions must be a tuple of Impression")
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise InvalidInput(f"version must be a positive integer, got {self.version!r}")

    def summary(self) -> str:
        """A deterministic text summary: one ``[time] impression (decision)`` line each, oldest first."""
        from datetime import UTC, datetime

        lines = []
        for imp in self.impressions:
            when = datetime.fromtimestamp(imp.timestamp, UTC).strftime("%Y-%m-%d")
            tail = f" (decision: {' '.join(imp.decision.split())})" if imp.decision else ""
            text = " ".join(imp.text.split())  # one line per impression, whatever the text holds
            lines.append(f"[{when}] {text}{tail}")
        return "\n".join(lines)

    @property
    def last(self) -> Impression | None:
        """The most recent impression, or ``None`` for an empty history."""
        return self.impressions[-1] if self.impressions else None


@dataclass(frozen=True, slots=True)
class Claim:
    """A long-term finding: content about a subject patient, from a source, with confidence
    in [0, 1] and an evidence tier; versioned by supersession (one ACTIVE per ``key``)."""

    claim_id: str
    patient_id: str
    key: str
    content: str
    source: str
    confidence: float
    evidence_tier: str
    created_at: float
    decay_at: float | None = None
    state: State = State.ACTIVE
    supersedes: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.confidence <= 1.0:
            raise InvalidInput(f"claim confidence must be in [0, 1], got {self.confidence!r}")
        if not self.key:
            raise InvalidInput("a claim needs a key")


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved item: ``score`` is the cosine similarity in [-1, 1] (1.0 for semantic state;
    for a claim, the cosine with its study's image). ``time`` is the evidence's clinical time
    (UTC seconds) where the record does not carry it itself (a claim: its study's time)."""

    id: str
    kind: Kind
    score: float
    record: EpisodicRecord | VisualRecord | SemanticState | Claim
    time: float | None = None


#: How a question's answers are scored: ``label`` (a short finding label: label F1 and exact
#: match), ``yes_no`` (accuracy and F1 on yes vs no), ``text`` (free text: BLEU, ROUGE-L, CIDEr,
#: token F1 and the labeler's finding F1). A manifest without the column means ``text``.
QUESTION_TYPES: tuple[str, ...] = ("label", "yes_no", "text")


@dataclass(frozen=True, slots=True)
class ManifestRow:
    """One validated question about one study. ``timestamp`` is UTC seconds; ``image`` is an
    absolute path string. A study may carry several questions (rows sharing ``patient_id`` and
    ``study_id``, one image); ``question_type`` is one of :data:`QUESTION_TYPES`.

    Construction checks every field against :mod:`msm_mem._limits` (ids without wildcard or
    control characters, bounded text) and raises :class:`InvalidInput` naming the field."""

    patient_id: str
    study_id: str
    timestamp: float
    image: str
    question: str
    answer: str
    report: str = ""
    decision: str = ""
    view: str = ""
    line: int = 0
    question_type: str = "text"

    def __post_init__(self) -> None:
        # every loader and every caller of ingest builds rows through here: bounded ids and text
        check_id("patient_id", self.patient_id)
        check_id("study_id", self.study_id)
        _check_time("timestamp", self.timestamp)
        check_path("image", self.image)
        if not self.image.strip():
            raise InvalidInput("image must not be empty")
        # text in NFC: frozen, so the checked values are set past the dataclass's guard
        object.__setattr__(self, "question", check_text("question", self.question, MAX_QUESTION_CHARS, required=True))
        for name in ("answer", "report", "decision"):
            object.__setattr__(self, name, check_text(name, getattr(self, name), MAX_TEXT_CHARS))
        object.__setattr__(self, "view", check_text("view", self.view, MAX_TAG_CHARS))
        if self.question_type not in QUESTION_TYPES:
            raise InvalidInput(
                f"question_type must be one of {', '.join(QUESTION_TYPES)}, got {str(self.question_type)[:40]!r}"
            )
        if self.question_type == "yes_no" and self.answer.strip().lower().rstrip(".") not in ("yes", "no", ""):
            # an unknown outcome has no row (or an empty answer): it is never scored as a guess
            raise InvalidInput(f"a yes_no question's answer must be yes, no or empty, got {self.answer[:40]!r}")
        if not isinstance(self.line, int) or isinstance(self.line, bool) or self.line < 0:
            raise InvalidInput(f"line must be an integer >= 0, got {self.line!r}")

    def to_dict(self) -> dict[str, Any]:
        """The row as manifest columns (timestamp as ISO 8601 UTC)."""
        data = asdict(self)
        data.pop("line")
        data["timestamp"] = datetime.fromtimestamp(self.timestamp, UTC).isoformat()
        return data


@dataclass(frozen=True, slots=True)
class RowProblem:
    """A row that was skipped: its 1-based line number (0 when unknown) and the reason."""

    line: int
    reason: str
