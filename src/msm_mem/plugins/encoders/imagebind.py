"""``imagebind``: 1024-d ImageBind (huge) vision embeddings, the paper's encoder.

Weights: with ``weights_path`` the checkpoint ``imagebind_huge.pth`` is loaded from that
file; otherwise ``imagebind_model.imagebind_huge(pretrained=True)`` downloads it from Meta's
file hub into ``./.checkpoints`` on first use (needs a network; failure is a
:class:`BackendError`). ``pretrained=False`` gives randomly initialised weights.

Package: the adapter uses ImageBind's documented API (``imagebind.models.imagebind_model``:
``imagebind_huge``, ``ModalityType.VISION``; the model returns L2-normalised embeddings).
PyPI has no official release (the ``imagebind`` name there is an empty placeholder); install
ImageBind from its source repository, or the third-party ``imagebind-unofficial`` repackage,
which has the same API. Importing the package also imports its audio/video loaders, so
torchaudio, pytorchvideo and ``pkg_resources`` (setuptools < 81) must be importable. The
project's tests exercise the preprocessing and the loading path with a stand-in module; the
real architecture (randomly initialised) was checked by hand, not in the test suite.

Preprocessing (ImageBind's ``load_and_transform_vision_data``): centre square crop, bicubic
resize to 224 x 224, gray repeated to RGB, CLIP mean/std normalisation.
"""

from __future__ import annotations

from typing import Any

from ..._errors import BackendError
from ._torch import CLIP_MEAN, CLIP_STD, TorchEncoder, import_optional

__all__ = ["ImageBindEncoder"]

_EXTRA = "imagebind"


class ImageBindEncoder(TorchEncoder):
    """ImageBind-huge vision embeddings, 1024-d."""

    dim = 1024
    size = 224
    mean = CLIP_MEAN
    std = CLIP_STD
    bicubic = True

    def __init__(self, *, weights_path: str | None = None, pretrained: bool = True, device: str = "cpu") -> None:
        super().__init__(_EXTRA, device)
        ib = import_optional("imagebind.models.imagebind_model", _EXTRA)
        self._vision = ib.ModalityType.VISION
        self.name = "imagebind" if (pretrained or weights_path) else "imagebind:random"
        try:
            if weights_path is not None:
                model = ib.imagebind_huge(pretrained=False)
                state = self._torch.load(weights_path, map_location="cpu", weights_only=True)
                model.load_state_dict(state)
            else:
                model = ib.imagebind_huge(pretrained=pretrained)
        except Exception as exc:  # download, file and checkpoint errors
            raise BackendError(f"cannot load ImageBind weights: {exc}") from exc
        self._model: Any = model.eval().to(device)

    def _features(self, batch: Any) -> Any:
        return self._model({self._vision: batch})[self._vision]
