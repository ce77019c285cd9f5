"""The encoder contract and the shared batching code.

An encoder maps grayscale images (float32 ``(h, w)`` arrays in ``[0, 1]``, as produced by
:mod:`msm_mem.plugins.images`) to L2-normalised float32 vectors of a fixed dimension ``dim``.
Its ``name`` and ``dim`` identify the vector space: a store records both and refuses vectors
from another encoder.

Implementations subclass :class:`BaseEncoder`, which provides input checks, output
normalisation and the path-batching logic (:meth:`BaseEncoder.encode_paths`), and implement
only :meth:`BaseEncoder._encode_batch`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from ..._errors import InvalidInput, InvalidVector
from ..images import load_image

__all__ = ["BaseEncoder", "Encoder", "l2_normalise"]

Matrix = npt.NDArray[np.float32]
PathLike = str | os.PathLike[str]


@runtime_checkable
class Encoder(Protocol):
    """Maps images to unit vectors.

    Invariants: ``encode`` returns shape ``(len(images), dim)``, dtype float32, every row with
    L2 norm 1 (within float32 rounding), so the dot product of two rows is their cosine in
    ``[-1, 1]``; the same input gives the same output. ``name`` identifies the vector space:
    the registry name, with ``:variant`` appended for non-default weights (``:random`` for
    randomly initialised ones).
    """

    name: str
    dim: int

    def encode(self, images: Sequence[npt.NDArray[Any]]) -> Matrix:
        """Encode grayscale ``(h, w)`` float images in ``[0, 1]``; returns ``(n, dim)``."""
        ...

    def encode_paths(self, paths: Sequence[PathLike], *, batch_size: int = 32, progress: bool = False) -> Matrix:
        """Load and encode image files in batches; returns ``(len(paths), dim)``."""
        ...


def l2_normalise(x: npt.NDArray[Any]) -> Matrix:
    """Rows of ``x`` divided by their L2 norm (computed in float64), as float32.

    Raises :class:`InvalidVector` when a row is non-finite or has zero norm.
    """
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        raise InvalidVector(f"expected a 2-D matrix of vectors, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise InvalidVector("encoder produced non-finite values")
    norms = np.sqrt(np.einsum("ij,ij->i", a, a))
    if a.shape[0] and float(norms.min()) == 0.0:
        raise InvalidVector("encoder produced a zero vector")
    return np.ascontiguousarray(a / norms[:, None], dtype=np.float32)


class BaseEncoder(ABC):
    """Shared machinery: input checks, normalisation, batching over files, progress bar.

    Subclasses set ``name`` and ``dim`` and implement :meth:`_encode_batch`.
    """

    name: str
    dim: int

    @abstractmethod
    def _encode_batch(self, images: Sequence[npt.NDArray[np.float32]]) -> npt.NDArray[Any]:
        """Raw features ``(len(images), dim)`` for checked images; normalised by the caller."""

    def encode(self, images: Sequence[npt.NDArray[Any]]) -> Matrix:
        """Encode grayscale ``(h, w)`` images with values in ``[0, 1]``.

        Returns float32 ``(len(images), dim)`` with unit-norm rows; an empty sequence gives
        ``(0, dim)``. Raises :class:`InvalidInput` for an image that is not a finite, non-empty
        2-D array or has values outside ``[0, 1]``.
        """
        checked = [_check_image(img, i) for i, img in enumerate(images)]
        if not checked:
            return np.zeros((0, self.dim), dtype=np.float32)
        raw = np.asarray(self._encode_batch(checked))
        if raw.shape != (len(checked), self.dim):
            raise InvalidVector(
                f"encoder {self.name!r} returned shape {raw.shape}, expected {(len(checked), self.dim)}"
            )
        return l2_normalise(raw)

    def iter_encode_paths(
        self, paths: Sequence[PathLike], *, batch_size: int = 32, progress: bool = False
    ) -> Iterator[Matrix]:
        """Yield one ``(b, dim)`` matrix per batch of at most ``batch_size`` files, in order.

        Streaming form of :meth:`encode_paths`: only one batch of images is in memory.
        A file that cannot be loaded raises :class:`~msm_mem._errors.ImageError`.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
        items = list(paths)
        with tqdm(total=len(items), disable=not progress, unit="img", desc=f"encode[{self.name}]") as bar:
            for start in range(0, len(items), batch_size):
                chunk = items[start : start + batch_size]
                yield self.encode([load_image(p) for p in chunk])
                bar.update(len(chunk))

    def encode_paths(self, paths: Sequence[PathLike], *, batch_size: int = 32, progress: bool = False) -> Matrix:
        """Load image files (PNG, JPEG, DICOM, video keyframe) and encode them in batches.

        Returns float32 ``(len(paths), dim)`` in the order of ``paths``; ``progress=True``
        shows a progress bar on stderr.
        """
        parts = list(self.iter_encode_paths(paths, batch_size=batch_size, progress=progress))
        if not parts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(parts, axis=0))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, dim={self.dim})"


def _check_image(img: Any, index: int) -> npt.NDArray[np.float32]:
    a = np.asarray(img)
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise InvalidInput(f"image {index}: expected a non-empty (h, w) array, got {a.shape}")
    if not np.issubdtype(a.dtype, np.number) or np.issubdtype(a.dtype, np.complexfloating):
        raise InvalidInput(f"image {index}: expected real numbers, got dtype {a.dtype}")
    f = a.astype(np.float32, copy=False)
    # two passes for a valid image: NaN fails both comparisons and an infinity the bound, so
    # the finiteness pass runs only to name what is wrong
    if not (float(f.min()) >= -1e-6 and float(f.max()) <= 1.0 + 1e-6):
        if not np.all(np.isfinite(f)):
            raise InvalidInput(f"image {index}: contains NaN or infinity")
        raise InvalidInput(f"image {index}: values must lie in [0, 1] (see msm_mem.plugins.images)")
    return np.ascontiguousarray(f)
