"""Shared code of the torch-based encoders: guarded imports, preprocessing, batched inference.

Preprocessing is done in NumPy/Pillow (no torchvision transforms), identically for every
adapter: centre-crop the grayscale image to a square (the shorter side), resize it to the
model's input size (bilinear or bicubic, antialiased), clip to ``[0, 1]``, repeat it on the
model's number of channels (grayscale -> RGB as three equal channels), then normalise each
channel as ``(x - mean) / std`` with ``x`` in ``[0, 1]``. Cropping then resizing equals the
usual "resize the shorter side, then centre crop" of CLIP-style pipelines.
"""

from __future__ import annotations

import importlib
from abc import abstractmethod
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._errors import MissingExtra
from ..images import resize
from .base import BaseEncoder

__all__ = ["CLIP_MEAN", "CLIP_STD", "TorchEncoder", "import_optional", "preprocess"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def import_optional(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtra` naming ``extra``.

    A module that is installed but fails to import (for example a torchvision built for
    another torch) is reported the same way, with the import error in the message.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(exc.name or module, extra) from exc
    except Exception as exc:  # a broken install raises arbitrary errors at import time
        what = f"a working {module} (import failed: {type(exc).__name__}: {exc})"
        raise MissingExtra(what, extra) from exc


def preprocess(
    images: Sequence[npt.NDArray[np.float32]],
    *,
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    bicubic: bool = False,
) -> npt.NDArray[np.float32]:
    """Batch of grayscale ``[0, 1]`` images -> float32 ``(n, len(mean), size, size)``.

    See the module docstring for the steps; ``len(mean) == len(std)`` is the channel count.
    """
    if len(mean) != len(std) or not mean:
        raise ValueError("mean and std must have the same, non-zero length")
    m = np.asarray(mean, dtype=np.float32)[:, None, None]
    s = np.asarray(std, dtype=np.float32)[:, None, None]
    out = np.empty((len(images), len(mean), size, size), dtype=np.float32)
    for i, img in enumerate(images):
        h, w = img.shape
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        square = img[top : top + side, left : left + side]
        x = np.clip(resize(square, size, bicubic=bicubic), 0.0, 1.0)
        out[i] = (x[None, :, :] - m) / s
    return out


class TorchEncoder(BaseEncoder):
    """Base of the torch adapters: preprocess, run :meth:`_features` under ``no_grad``.

    Subclasses set ``name``, ``dim``, ``size``, ``mean``, ``std``, ``bicubic``, build
    ``self._model`` (in eval mode) and implement :meth:`_features`.
    """

    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    bicubic: bool = False

    def __init__(self, extra: str, device: str = "cpu") -> None:
        self._torch: Any = import_optional("torch", extra)
        self.device = device

    @abstractmethod
    def _features(self, batch: Any) -> Any:
        """Model features for a preprocessed tensor batch: a ``(n, dim)`` tensor."""

    def _encode_batch(self, images: Sequence[npt.NDArray[np.float32]]) -> npt.NDArray[Any]:
        torch = self._torch
        x = preprocess(images, size=self.size, mean=self.mean, std=self.std, bicubic=self.bicubic)
        with torch.no_grad():
            feats = self._features(torch.from_numpy(x).to(self.device))
            result: npt.NDArray[Any] = feats.detach().to("cpu", torch.float64).numpy()
        return result
