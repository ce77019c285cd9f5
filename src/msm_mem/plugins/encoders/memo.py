"""An encoder that remembers what it encoded one image at a time, for one process's lifetime.

``msm-mem eval`` asks about the same studies many times (every configuration, phase and
question group answers them again, and the fitted backbone reads the query image once more);
with a CNN encoder that repeats the same forward pass thousands of times. :class:`MemoEncoder`
wraps an encoder and keeps the vector of every image it was asked to encode *alone*, keyed by
the SHA-256 of the image's shape, dtype and bytes, so each distinct image is encoded once.

The numbers do not change: a single-image call returns exactly what the wrapped encoder
returned for that image alone (the encoders are deterministic), and a call with several images
is passed through unchanged and not remembered (a batched forward pass may round differently
from a single one). Nothing is written anywhere; the memory holds only vectors and digests,
and :meth:`MemoEncoder.clear` empties it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .base import BaseEncoder, Encoder, Matrix

__all__ = ["MemoEncoder", "image_digest"]


def image_digest(image: npt.NDArray[Any]) -> bytes:
    """SHA-256 of an image array's shape, dtype and bytes (C order)."""
    a = np.ascontiguousarray(image)
    h = hashlib.sha256()
    h.update(f"{a.shape}|{a.dtype.str}|".encode())
    h.update(a.tobytes())
    return h.digest()


class MemoEncoder(BaseEncoder):
    """``inner`` with single-image results remembered (module docstring); same ``name`` and
    ``dim``, so a store accepts it wherever it accepts ``inner``."""

    def __init__(self, inner: Encoder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self._vectors: dict[bytes, Matrix] = {}
        #: single-image calls answered from memory, and those that ran the wrapped encoder
        self.hits = 0
        self.misses = 0

    def encode(self, images: Sequence[npt.NDArray[Any]]) -> Matrix:
        if len(images) != 1:
            return self.inner.encode(images)
        digest = image_digest(np.asarray(images[0]))
        if (known := self._vectors.get(digest)) is not None:
            self.hits += 1
            return known.copy()
        vector = np.ascontiguousarray(self.inner.encode(images))
        self._vectors[digest] = vector.copy()
        self.misses += 1
        return vector

    def _encode_batch(self, images: Sequence[npt.NDArray[np.float32]]) -> npt.NDArray[Any]:
        return self.inner.encode(images)  # not reached: encode is overridden

    def clear(self) -> None:
        """Forget every remembered vector."""
        self._vectors.clear()

    def __len__(self) -> int:
        return len(self._vectors)
