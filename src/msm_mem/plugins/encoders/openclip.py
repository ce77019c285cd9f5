"""``open_clip``: image embeddings of an OpenCLIP model (dimension depends on the model).

Weights: ``open_clip.create_model(model, pretrained=tag)`` downloads the tagged checkpoint
(default ``ViT-B-32`` / ``laion2b_s34b_b79k``, 512-d) from its hub on first use and caches
it; without a network and an empty cache, construction fails with :class:`BackendError`.
Tests use ``pretrained=None`` (randomly initialised). Install: ``pip install
'msm-mem[openclip]'``.

Preprocessing (see :mod:`._torch`): centre square crop, bicubic resize to the model's input
size, gray repeated to RGB, normalised with the model's own mean/std (the CLIP values for
most models). Features: ``model.encode_image``, then L2-normalised. ``name`` is
``open_clip:<model>:<tag>`` (``random`` for no weights) because the vector space depends on
both.
"""

from __future__ import annotations

from typing import Any

from ..._errors import BackendError
from ._torch import CLIP_MEAN, CLIP_STD, TorchEncoder, import_optional

__all__ = ["OpenCLIPEncoder"]

_EXTRA = "openclip"


class OpenCLIPEncoder(TorchEncoder):
    """OpenCLIP ``encode_image`` embeddings; ``dim`` is the model's output dimension."""

    bicubic = True

    def __init__(
        self,
        *,
        model: str = "ViT-B-32",
        pretrained: str | None = "laion2b_s34b_b79k",
        device: str = "cpu",
    ) -> None:
        super().__init__(_EXTRA, device)
        oc = import_optional("open_clip", _EXTRA)
        try:
            net = oc.create_model(model, pretrained=pretrained, device=device)
        except Exception as exc:  # unknown model names, download and checkpoint errors
            raise BackendError(f"cannot create open_clip model {model!r}/{pretrained!r}: {exc}") from exc
        cfg = dict(oc.get_model_preprocess_cfg(net))
        size = cfg.get("size", 224)
        self.size = int(size if isinstance(size, int) else size[0])
        self.mean = tuple(float(v) for v in cfg.get("mean", CLIP_MEAN))
        self.std = tuple(float(v) for v in cfg.get("std", CLIP_STD))
        self.dim = int(net.visual.output_dim)
        self.name = f"open_clip:{model}:{pretrained or 'random'}"
        self._model: Any = net.eval()

    def _features(self, batch: Any) -> Any:
        return self._model.encode_image(batch)
