"""One frozen settings object, passed in; never module globals."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from ._errors import InvalidInput

__all__ = ["Settings"]


@dataclass(frozen=True)
class Settings:
    """Tunable parameters, with the paper's defaults.

    - ``k_epi``, ``k_vis``: hits per episodic / visual query (paper: 5 each).
    - ``top_k``: evidence items kept overall after fusion ranking (paper: 10).
    - ``tau``: novelty threshold of the write-back gate; an interaction is novel when the
      maximum cosine against the patient's stored embeddings is ``< tau`` (paper: 0.9).
    - ``min_answer_words``: the gate's minimum answer length in words.
    - ``lexicon_path``: a clinical keyword file replacing the packaged one (one term a line).
    - ``semantic_history``: impressions kept per patient and category (paper: N=5).
    - ``prompt_budget_chars``: fused prompt budget; the lowest-ranked evidence goes first.
    - ``encoder``: name of the image encoder plugin.
    - ``stm_ttl_s``: lifetime of a short-term item in seconds.
    """

    k_epi: int = 5
    k_vis: int = 5
    top_k: int = 10
    tau: float = 0.9
    min_answer_words: int = 3
    lexicon_path: Path | None = None
    semantic_history: int = 5
    prompt_budget_chars: int = 6000
    encoder: str = "pixels"
    stm_ttl_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("k_epi", "k_vis", "top_k", "semantic_history", "prompt_budget_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInput(f"setting {name} must be a positive integer, got {value!r}")
        if not isinstance(self.min_answer_words, int) or self.min_answer_words < 0:
            raise InvalidInput(f"setting min_answer_words must be >= 0, got {self.min_answer_words!r}")
        if not (-1.0 <= float(self.tau) <= 1.0):
            raise InvalidInput(f"setting tau must be a cosine in [-1, 1], got {self.tau!r}")
        if not (float(self.stm_ttl_s) > 0):
            raise InvalidInput(f"setting stm_ttl_s must be > 0, got {self.stm_ttl_s!r}")
        if not self.encoder:
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
                    values[f.name] = Path(raw)
                elif f.name in ("tau", "stm_ttl_s"):
                    values[f.name] = float(raw)
                elif f.name == "encoder":
                    values[f.name] = raw
                else:
                    values[f.name] = int(raw)
            except ValueError as exc:
                raise InvalidInput(f"MSM_MEM_{f.name.upper()}={raw!r}: {exc}") from exc
        return cls(**values)
