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
distribution samplers whose streams NumPy may change between versions. All arithmetic is in
float64 and the result is cast to float32; summation-order differences between BLAS builds are
around 1e-16, far below float32 resolution. Expect cosine > 0.95 between an image and a
slightly noisy or brightness-shifted copy; unrelated images score clearly lower. This is a
low-level "visual fingerprint", not a learned representation: it finds the same or similar
views, not the same disease.
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


@lru_cache(maxsize=1)
def _projection() -> npt.NDArray[np.float64]:
    """The (512, 4096) +-1/sqrt(512) matrix drawn from the raw bits of PCG64(SEED)."""
    n_bits = _PROJ_DIM * _SIDE * _SIDE
    words = np.random.PCG64(SEED).random_raw(n_bits // 64).astype("<u8")
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    signs = 1.0 - 2.0 * bits.astype(np.float64)
    proj: npt.NDArray[np.float64] = (signs / np.sqrt(_PROJ_DIM)).reshape(_PROJ_DIM, _SIDE * _SIDE)
    proj.setflags(write=False)
    return proj


def _unit(v: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    norm = float(np.sqrt(np.dot(v, v)))
    out: npt.NDArray[np.float64] = v / norm if norm > 1e-12 else np.zeros_like(v)
    return out


def _block_mean(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    k = _SIDE // _GRID
    out: npt.NDArray[np.float64] = x.reshape(_GRID, k, _GRID, k).mean(axis=(1, 3)).ravel()
    return out


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
            std = float(x.std())
            if std < 1e-6:
                out[i] = 1.0
                continue
            x /= std
            layout = _block_mean(x)
            gy, gx = np.gradient(x)
            edges = _block_mean(np.hypot(gx, gy))
            edges -= edges.mean()
            detail = proj @ x.ravel()
            out[i] = _BLOCK_WEIGHT * np.concatenate([_unit(layout), _unit(edges), _unit(detail)])
        return out
