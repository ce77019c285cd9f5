"""The evaluation's remembering encoder: the same vectors, each image encoded once."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from msm_mem import InvalidInput, MsmMem
from msm_mem.datasets.synthetic import generate
from msm_mem.eval import arms
from msm_mem.eval.protocol import ProtocolSettings, run_protocol
from msm_mem.plugins.backbones.fitted import FittedBackbone
from msm_mem.plugins.backbones.fitted_format import FittedGroup, FittedModels
from msm_mem.plugins.encoders import get_encoder
from msm_mem.plugins.encoders.memo import MemoEncoder, image_digest
from tests.helpers import ADMIN


class Counting:
    """The pixels encoder, counting the images it is asked to encode."""

    def __init__(self) -> None:
        self.inner = get_encoder("pixels")
        self.name, self.dim = self.inner.name, self.inner.dim
        self.calls: list[int] = []

    def encode(self, images: Sequence[npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        self.calls.append(len(images))
        return self.inner.encode(images)

    def encode_paths(self, paths: Sequence[Any], *, batch_size: int = 32, progress: bool = False) -> Any:
        return self.inner.encode_paths(paths, batch_size=batch_size, progress=progress)


def _images(n: int) -> list[npt.NDArray[np.float32]]:
    rng = np.random.default_rng(3)
    return [rng.random((40, 48), dtype=np.float32) for _ in range(n)]


def test_single_images_are_encoded_once_and_give_the_same_vectors() -> None:
    """A repeated image is answered from memory with the vector the encoder gave it."""
    inner = Counting()
    memo = MemoEncoder(inner)
    images = _images(3)
    first = [memo.encode([im]) for im in images]
    again = [memo.encode([im.copy()]) for im in images]
    assert inner.calls == [1, 1, 1] and memo.hits == 3 and memo.misses == 3 and len(memo) == 3
    for im, a, b in zip(images, first, again, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, inner.inner.encode([im]))
    again[0][0, 0] = 99.0  # a caller changing its copy changes nothing remembered
    assert np.array_equal(memo.encode([images[0]]), first[0])
    memo.clear()
    memo.encode([images[0]])
    assert inner.calls == [1, 1, 1, 1]


def test_batches_pass_through_unremembered() -> None:
    """Several images at once go to the encoder as they are (a batch may round differently)."""
    inner = Counting()
    memo = MemoEncoder(inner)
    images = _images(2)
    out = memo.encode(images)
    assert inner.calls == [2] and len(memo) == 0
    assert np.array_equal(out, inner.inner.encode(images))
    assert memo.name == "pixels" and memo.dim == inner.dim


def test_the_digest_tells_shape_and_dtype_apart() -> None:
    """The same bytes in another shape or dtype are another image."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 12
    assert image_digest(a) != image_digest(a.reshape(4, 3))
    assert image_digest(a) != image_digest(a.astype(np.float64))
    assert image_digest(a) == image_digest(a.copy()) == image_digest(np.asfortranarray(a))


def test_a_store_and_the_fitted_backbone_take_it(tmp_path: Path) -> None:
    """The memo encoder stands where the store's own encoder does; the fitted backbone refuses
    an encoder other than the one its file was fitted on."""
    with MsmMem.init(tmp_path / "s", ADMIN):
        pass
    memo = MemoEncoder(get_encoder("pixels"))
    with MsmMem.open(tmp_path / "s", encoder=memo) as mem:
        assert mem.encoder_name == "pixels"
    for encoder in ("pixels", "efficientnet-lite0"):
        group = FittedGroup("label", "Q?", ("A", "B"), np.zeros((2, memo.dim)), np.zeros(2))
        FittedModels(encoder, memo.dim, (group,)).save(tmp_path / f"{encoder}.npz")
    assert FittedBackbone(tmp_path / "pixels.npz", encoder=memo).encoder is memo
    with pytest.raises(InvalidInput, match="fitted on encoder efficientnet-lite0"):
        FittedBackbone(tmp_path / "efficientnet-lite0.npz", encoder=memo)


def test_an_evaluation_encodes_each_image_alone_once_per_process(tmp_path: Path) -> None:
    """Through the protocol (one process), every study image runs the encoder alone at most
    once, although every configuration and phase asks about it again."""
    rows, _ = generate(tmp_path / "syn", patients=12, studies_per_patient=(2, 3), seed=2, size=64)
    arms._ENCODERS.clear()
    run = run_protocol(rows, ProtocolSettings(configs=("S", "SEV"), baselines=("copy-prior",)), jobs=1)
    memo = arms._ENCODERS["pixels"]
    asked = sum(1 for a in run.answers if a.arm in ("S", "SEV"))
    assert memo.misses <= len({r.image for r in rows}) < asked <= memo.hits + memo.misses
