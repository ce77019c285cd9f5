"""``torchxrayvision``: 1024-d features of the torchxrayvision chest X-ray DenseNet-121.

Weights: ``torchxrayvision.models.DenseNet(weights=...)`` downloads the named checkpoint
(default ``densenet121-res224-all``, trained on the pooled public chest X-ray datasets) from
the project's release hub on first use and caches it under ``~/.torchxrayvision``; without a
network and an empty cache, construction fails with :class:`BackendError`. Tests build the
same architecture with ``weights=None`` (randomly initialised). Install:
``pip install 'msm-mem[xrv]'`` (torchxrayvision needs a torchvision built for the installed
torch).

Preprocessing (see :mod:`._torch`): centre square crop, bilinear resize to 224 x 224, one
channel, scaled to torchxrayvision's ``[-1024, 1024]`` range (``x * 2048 - 1024``).
Features: ``DenseNet.features2``: the last dense block after ReLU, global-average-pooled
(1024), then L2-normalised.
"""

from __future__ import annotations

from typing import Any

from ..._errors import BackendError
from ._torch import TorchEncoder, import_optional

__all__ = ["XRVEncoder"]

_EXTRA = "xrv"
DEFAULT_WEIGHTS = "densenet121-res224-all"


class XRVEncoder(TorchEncoder):
    """torchxrayvision DenseNet-121 pooled features, 1024-d."""

    dim = 1024
    size = 224
    mean = (0.5,)
    std = (1.0 / 2048.0,)

    def __init__(self, *, weights: str | None = DEFAULT_WEIGHTS, device: str = "cpu") -> None:
        super().__init__(_EXTRA, device)
        xrv = import_optional("torchxrayvision", _EXTRA)
        if weights == DEFAULT_WEIGHTS:
            self.name = "torchxrayvision"
        else:
            self.name = f"torchxrayvision:{weights or 'random'}"
        try:
            model = xrv.models.DenseNet(weights=weights)
        except Exception as exc:  # download and unpickling errors of many kinds
            raise BackendError(f"cannot load torchxrayvision weights {weights!r}: {exc}") from exc
        self._model: Any = model.eval().to(device)

    def _features(self, batch: Any) -> Any:
        return self._model.features2(batch)
