"""The default encoder, ``pixels``: 1024-d, no weights, no network, deterministic.

What it computes, for one grayscale image:

1. Resize to 64 x 64 with Pillow's bilinear filter (antialiased when shrinking, so it
   averages like an area filter). The aspect ratio is not kept: chest radiographs are close to
   square and a fixed grid keeps anatomy at comparable positions.
2. Standardise to zero mean and unit variance (float64). This removes global brightness and
   contrast, which vary between devices and exposures but not with anatomy.
3. Three blocks, each scaled to unit L2 norm:

   a. **layout** (256): the 16 x 16 grid of 4 x 4 block means of the standardised image:
      where the dense (bright) and lucent (dark) regions are: lungs, mediastinum, diaphragm.
   b. **edges** (256): the 16 x 16 grid of block-mean gradient magnitudes (central
      differences), centred to zero mean: where the boundaries are (heart border,
      costophrenic angles, ribs, lines and tubes), independent of their polarity.
   c. **detail** (512): a fixed random projection of the full 64 x 64 standardised image
      with a +-1 matrix (Johnson-Lindenstrauss), which approximately preserves the
      correlation between images at 64 x 64, i.e. finer structure than the 16 x 16 grids.

4. Concatenate the blocks weighted by ``1/sqrt(3)``: the cosine of two vectors is then the
   mean of the three block cosines. A constant image (no contrast) has no standardised
   content and maps to the fixed vector with all coordinates ``1/sqrt(1024)``.

Reproducibility: the projection's signs are the raw bits of ``numpy.random.PCG64(SEED)``
(``SEED = 20240611``); raw bit-generator output is fixed by the PCG64 algorithm, unlike
distribution samplers whose streams NumPy may change between versions. The arithmetic is
float64 and the result is cast to float32, except the detail projection: one float32
matrix-vector product (the signs are exact in float32; the standardised image is rounded to
float32 and its sums accumulate in float32), since the matrix is read whole for every image
and a float32 one is half the bytes (8 MiB): less memory traffic a product, and less of the
rest of a server's cache evicted. Against the same blocks computed all in float64, a vector
differs by at most about 1e-7 in any coordinate (``1 - cosine`` below 1e-13 over the test
images), so vectors stored by a version that projected in float64 stay comparable with new
ones; BLAS builds that sum in another order differ at that level too. The same input gives
the same output on one machine. Expect cosine > 0.95 between an image and a slightly noisy or
brightness-shifted copy; unrelated images score clearly lower. This is a low-level "visual
fingerprint", not a learned representation: it finds the same or similar views, not the same
disease.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from ..images import resize
from .base import BaseEncoder

__all__ = ["SEED", "PixelsEncoder"]

SEED = 20240611
_SIDE = 64
_GRID = 16
_PROJ_DIM = 512
_BLOCK_WEIGHT = 1.0 / np.sqrt(3.0)
_LAYOUT = _GRID * _GRID  # where the edges block starts
_DETAIL = 2 * _GRID * _GRID  # where the detail block starts


@lru_cache(maxsize=1)
def _projection() -> npt.NDArray[np.float32]:
    """The (512, 4096) float32 matrix of +-1 drawn from the raw bits of PCG64(SEED) (the block
    is scaled to unit norm afterwards, so the JL factor ``1/sqrt(512)`` is left out)."""
    n_bits = _PROJ_DIM * _SIDE * _SIDE
    words = np.random.PCG64(SEED).random_raw(n_bits // 64).astype("<u8")
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    signs = np.float32(1.0) - np.float32(2.0) * bits.astype(np.float32)
    proj: npt.NDArray[np.float32] = signs.reshape(_PROJ_DIM, _SIDE * _SIDE)
    proj.setflags(write=False)
    return proj


def _scale_to_unit(v: npt.NDArray[np.float64]) -> None:
    """``v`` scaled in place to unit L2 norm, then by the block weight (zeros for a zero block)."""
    norm = float(np.sqrt(np.dot(v, v)))
    if norm > 1e-12:
        v /= norm
        v *= _BLOCK_WEIGHT
    else:
        v[:] = 0.0


@lru_cache(maxsize=1)
def _pooling() -> npt.NDArray[np.float64]:
    """The (16, 64) matrix of ones that sums each run of 4 pixels: ``P @ x @ P.T`` sums the
    4 x 4 blocks of a 64 x 64 image (two small products instead of a reduction over two axes)."""
    pool: npt.NDArray[np.float64] = np.kron(np.eye(_GRID), np.ones((1, _SIDE // _GRID))).astype(np.float64)
    pool.setflags(write=False)
    return pool


def _block_mean(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The 16 x 16 grid of 4 x 4 block means of a 64 x 64 image, flattened row by row."""
    pool = _pooling()
    out: npt.NDArray[np.float64] = (pool @ x @ pool.T).ravel()
    out /= (_SIDE // _GRID) ** 2
    return out


def _gradient_magnitude(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The magnitude of ``np.gradient(x)`` (unit spacing: central differences inside,
    one-sided at the borders), without its per-call set-up; ``sqrt(gx^2 + gy^2)`` rather than
    ``np.hypot``, whose care for overflow a standardised image does not need."""
    gy = np.empty_like(x)
    gx = np.empty_like(x)
    np.subtract(x[2:], x[:-2], out=gy[1:-1])
    gy[1:-1] /= 2.0
    np.subtract(x[1], x[0], out=gy[0])
    np.subtract(x[-1], x[-2], out=gy[-1])
    np.subtract(x[:, 2:], x[:, :-2], out=gx[:, 1:-1])
    gx[:, 1:-1] /= 2.0
    np.subtract(x[:, 1], x[:, 0], out=gx[:, 0])
    np.subtract(x[:, -1], x[:, -2], out=gx[:, -1])
    gx *= gx
    gy *= gy
    gx += gy
    return np.sqrt(gx, out=gx)


class PixelsEncoder(BaseEncoder):
    """Weight-free 1024-d image fingerprint (layout + edges + projected detail); see module."""

    name = "pixels"
    dim = 2 * _GRID * _GRID + _PROJ_DIM

    def _encode_batch(self, images: Sequence[npt.NDArray[np.float32]]) -> npt.NDArray[np.float64]:
        proj = _projection()
        out = np.empty((len(images), self.dim), dtype=np.float64)
        for i, img in enumerate(images):
            x = resize(img, _SIDE).astype(np.float64)
            x -= x.mean()
            flat = x.ravel()  # a view: scaled below with x
            std = float(np.sqrt(np.dot(flat, flat) / flat.size))
            if std < 1e-6:
                out[i] = 1.0
                continue
            x /= std
            row = out[i]
            row[:_LAYOUT] = _block_mean(x)
            row[_LAYOUT:_DETAIL] = _block_mean(_gradient_magnitude(x))
            edges = row[_LAYOUT:_DETAIL]
            edges -= edges.mean()
            row[_DETAIL:] = proj @ flat.astype(np.float32)
            for block in (row[:_LAYOUT], edges, row[_DETAIL:]):
                _scale_to_unit(block)
        return out
