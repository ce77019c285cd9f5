"""A deterministic encoder and a fixed-answer backbone: no weights, no model."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..plugins.backbones.base import BackboneReply, BackboneRequest
from ..plugins.encoders.base import BaseEncoder

__all__ = ["DeterministicEncoder", "FixedBackbone"]


class DeterministicEncoder(BaseEncoder):
    """A weight-free fake encoder: a unit vector drawn from a generator seeded by the image."""

    def __init__(self, dim: int = 32, name: str = "deterministic") -> None:
        self.dim = dim
        self.name = name

    def _encode_batch(self, images: Sequence[npt.NDArray[Any]]) -> npt.NDArray[np.float64]:
        out = np.empty((len(images), self.dim), dtype=np.float64)
        for i, img in enumerate(images):
            digest = hashlib.sha256(np.ascontiguousarray(img, dtype=np.float32).tobytes()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            out[i] = rng.standard_normal(self.dim)
        return out


class FixedBackbone:
    """A backbone that gives the same ``answer`` and ``decision`` whatever it is asked."""

    def __init__(self, answer: str, decision: str = "", *, name: str = "fixed") -> None:
        self.answer, self.decision, self.name = answer, decision, name

    def generate(self, request: BackboneRequest) -> BackboneReply:
        return BackboneReply(self.answer, decision=self.decision, source=self.name)
