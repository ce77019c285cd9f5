"""One frozen settings object, passed in; never module globals."""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from ._errors import InvalidInput

__all__ = [
    "DEFAULT_EF_SEARCH",
    "DEFAULT_RETENTION_S",
    "DEFAULT_TENANT",
    "MAX_EF_SEARCH",
    "PopulationSearch",
    "Settings",
    "check_population_search",
    "check_tenant",
]

#: how population (cross-patient) search runs: exact, or an approximate HNSW graph
PopulationSearch = Literal["exact", "hnsw"]
#: HNSW candidate depth of the embedded store's population search (recall: docs/performance.md)
DEFAULT_EF_SEARCH = 128
MAX_EF_SEARCH = 100_000
#: the tenant of a store made without one
DEFAULT_TENANT = "default"
#: the default retention of a long-term record of full trust after the patient's last activity:
#: ten years (docs/design.md, "Retention")
DEFAULT_RETENTION_S = 10 * 365.25 * 86_400.0
#: the longest retention accepted: past a century and a half it outlives any patient
MAX_RETENTION_S = 150 * 365.25 * 86_400.0
_TENANT = re.compile(r"[A-Za-z0-9_-]{1,63}")


def check_tenant(tenant: object) -> str:
    """``tenant`` when it is a tenant id (1 to 63 ASCII letters, digits, ``-`` and ``_``), or
    :class:`InvalidInput` naming what is wrong."""
    if not isinstance(tenant, str) or not _TENANT.fullmatch(tenant):
        raise InvalidInput(f"tenant must be 1 to 63 ASCII letters, digits, '-' or '_', got {tenant!r}")
    return tenant


def check_population_search(mode: object, ef_search: object) -> PopulationSearch:
    """``mode`` as a :data:`PopulationSearch`, or :class:`InvalidInput` naming what is wrong."""
    if mode not in get_args(PopulationSearch):
        raise InvalidInput(f"setting population_search must be 'exact' or 'hnsw', got {mode!r}")
    if not isinstance(ef_search, int) or isinstance(ef_search, bool) or not 1 <= ef_search <= MAX_EF_SEARCH:
        raise InvalidInput(
            f"setting population_ef_search must be an integer in [1, {MAX_EF_SEARCH}], got {ef_search!r}"
        )
    return mode  # type: ignore[return-value]  # checked against the literal's values above


def _flag(raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("not a true/false value (1/0, true/false, yes/no, on/off)")


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Settings:
    """Tunable parameters, with the paper's defaults.

    - ``k_epi``, ``k_vis``: hits per episodic / visual query (paper: 5 each).
    - ``top_k``: evidence items kept overall after fusion ranking (paper: 10).
    - ``tau``: novelty threshold of the write-back gate; an interaction is novel when the
      maximum cosine against the patient's stored embeddings is ``< tau`` (paper: 0.9).
    - ``min_answer_words``: the gate's minimum answer length in words.
    - ``structured_gate``: for stores whose questions expect short structured answers (a
      label, yes/no): an answer shorter than ``min_answer_words`` is judged by novelty alone
      (the length and keyword tests are meant for free text and refuse every label). Answers
      of ``min_answer_words`` or more words still need a clinical keyword. Default False (the
      paper's gate).
    - ``lexicon_path``: a clinical keyword file replacing the packaged one (one term a line).
    - ``semantic_history``: impressions kept per patient and category (paper: N=5).
    - ``prompt_budget_chars``: fused prompt budget; the lowest-ranked evidence goes first.
    - ``encoder``: name of the image encoder plugin.
    - ``stm_ttl_s``: lifetime of a short-term item in seconds (default one day).
    - ``consolidate_after_s``: age after which ``maintain`` retries the gate on a held STM item
      once (consolidate or discard); until then a critic may promote it.
    - ``population_search``: how population (cross-patient) retrieval searches, in the policy's
      population step and ``retrieve(scope="population")``: ``"exact"`` (default; one
      matrix-vector product over every stored vector) or ``"hnsw"`` (an approximate HNSW
      graph: sub-linear, may miss some of the true top-k; recall in ``docs/performance.md``).
      Patient-scoped retrieval is exact either way. On PostgreSQL ``"hnsw"`` is pgvector's.
    - ``population_ef_search``: the embedded store's HNSW search depth (candidates kept while
      searching, at least k): larger is slower and finds more of the true top-k.
    - ``retention_s``: how long a long-term record of full trust (confidence 1, tier weight 1)
      is kept after the patient's last activity in the store (a new study, a written answer, a
      critic's verdict) before ``maintain`` anonymises it; a record keeps ``retention_s x
      confidence x tier_weight``. Default ten years (:data:`DEFAULT_RETENTION_S`; why: docs/
      design.md, "Retention"); finite, > 0 and at most 150 years.
    - ``tenant``: the tenant a new store is made for (``init``; 1 to 63 ASCII letters, digits,
      ``-``, ``_``). Every row carries it, and the tenants of one PostgreSQL schema are
      separate stores (docs/deploy.md, Citus). An opened store's recorded tenant replaces it.
    """

    k_epi: int = 5
    k_vis: int = 5
    top_k: int = 10
    tau: float = 0.9
    min_answer_words: int = 3
    structured_gate: bool = False
    lexicon_path: Path | None = None
    semantic_history: int = 5
    prompt_budget_chars: int = 6000
    encoder: str = "pixels"
    stm_ttl_s: float = 86400.0
    consolidate_after_s: float = 3600.0
    population_search: PopulationSearch = "exact"
    population_ef_search: int = DEFAULT_EF_SEARCH
    retention_s: float = DEFAULT_RETENTION_S
    tenant: str = DEFAULT_TENANT

    def __post_init__(self) -> None:
        check_population_search(self.population_search, self.population_ef_search)
        check_tenant(self.tenant)
        for name in ("k_epi", "k_vis", "top_k", "semantic_history", "prompt_budget_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInput(f"setting {name} must be a positive integer, got {value!r}")
        words = self.min_answer_words
        if not isinstance(words, int) or isinstance(words, bool) or words < 0:
            raise InvalidInput(f"setting min_answer_words must be an integer >= 0, got {words!r}")
        if not isinstance(self.structured_gate, bool):
            raise InvalidInput(f"setting structured_gate must be true or false, got {self.structured_gate!r}")
        # numbers are checked by type first: float("x") would escape as a bare ValueError
        if not _is_number(self.tau) or not (-1.0 <= float(self.tau) <= 1.0):
            raise InvalidInput(f"setting tau must be a cosine in [-1, 1], got {self.tau!r}")
        if not _is_number(self.stm_ttl_s) or not (0 < float(self.stm_ttl_s) < math.inf):
            raise InvalidInput(f"setting stm_ttl_s must be finite and > 0, got {self.stm_ttl_s!r}")
        if not _is_number(self.retention_s) or not (0 < float(self.retention_s) <= MAX_RETENTION_S):
            raise InvalidInput(
                f"setting retention_s must be seconds in (0, {MAX_RETENTION_S:.0f}] (at most 150 years;"
                f" default {DEFAULT_RETENTION_S:.0f}, ten years), got {self.retention_s!r}"
            )
        if not isinstance(self.encoder, str) or not self.encoder.strip():
            raise InvalidInput("setting encoder must name an encoder plugin")

    def with_(self, **changes: Any) -> Settings:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        """Read ``MSM_MEM_<FIELD>`` variables (for example ``MSM_MEM_TAU=0.85``)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"MSM_MEM_{f.name.upper()}")
            if raw is None:
                continue
            try:
                if f.name == "lexicon_path":
                    values[f.name] = Path(raw) if raw.strip() else None  # empty: the packaged one
                elif f.name in ("tau", "stm_ttl_s", "consolidate_after_s", "retention_s"):
                    values[f.name] = float(raw)
                elif f.name in ("encoder", "population_search", "tenant"):
                    values[f.name] = raw
                elif f.name == "structured_gate":
                    values[f.name] = _flag(raw)
                else:
                    values[f.name] = int(raw)
            except ValueError as exc:
                raise InvalidInput(f"MSM_MEM_{f.name.upper()}={raw!r}: {exc}") from exc
        return cls(**values)
