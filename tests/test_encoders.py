"""Tests of the encoder contract, the registry and the default ``pixels`` encoder."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from msm_mem._errors import ImageError, InvalidInput, MissingExtra
from msm_mem.plugins.encoders import (
    BaseEncoder,
    Encoder,
    available_encoders,
    get_encoder,
    known_encoders,
)
from msm_mem.plugins.encoders.pixels import PixelsEncoder

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
COVID = SHARED / "data" / "covid-cxr"


def phantom(seed: int, size: int = 256) -> np.ndarray:
    """A chest-radiograph-like image: bright body, dark lungs, mediastinum, random opacities."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = 0.55 + 0.1 * yy
    for cx in (0.32, 0.68):
        cx += rng.normal(0, 0.02)
        lung = ((xx - cx) / 0.15) ** 2 + ((yy - 0.45) / 0.3) ** 2 < 1
        img = np.where(lung, 0.2, img)
    img = img + 0.3 * np.exp(-(((xx - 0.5) / 0.06) ** 2))
    for _ in range(4):
        bx, by, r = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), rng.uniform(0.03, 0.08)
        img = img + 0.25 * np.exp(-((xx - bx) ** 2 + (yy - by) ** 2) / r**2)
    out: np.ndarray = np.clip(img, 0, 1).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def enc() -> PixelsEncoder:
    return PixelsEncoder()


def test_pixels_satisfies_protocol_and_declares_1024(enc: PixelsEncoder) -> None:
    """PixelsEncoder is an Encoder named 'pixels' with dim 1024, and get_encoder returns one."""
    assert isinstance(enc, Encoder) and isinstance(enc, BaseEncoder)
    assert (enc.name, enc.dim) == ("pixels", 1024)
    got = get_encoder("pixels")
    assert isinstance(got, PixelsEncoder) and got.dim == 1024


def test_output_shape_dtype_and_unit_norm(enc: PixelsEncoder) -> None:
    """encode returns (n, 1024) float32 rows with L2 norm 1, for images of any size."""
    imgs = [phantom(1), phantom(2, size=300)[:, :200], np.random.default_rng(3).random((40, 90))]
    z = enc.encode(imgs)
    assert z.shape == (3, 1024) and z.dtype == np.float32 and z.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-6)
    assert enc.encode([]).shape == (0, 1024)


def test_deterministic_within_and_across_processes(enc: PixelsEncoder) -> None:
    """Two encoders, and a fresh Python process, give bit-identical vectors."""
    img = phantom(7)
    a = enc.encode([img])
    b = PixelsEncoder().encode([img.copy()])
    assert np.array_equal(a, b)
    code = (
        "import sys, numpy as np\n"
        "from msm_mem.plugins.encoders.pixels import PixelsEncoder\n"
        "img = np.frombuffer(sys.stdin.buffer.read(), dtype=np.float32).reshape(256, 256)\n"
        "sys.stdout.buffer.write(PixelsEncoder().encode([img]).tobytes())\n"
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=img.tobytes(),
        capture_output=True,
        check=True,
        env={"PYTHONPATH": src},
    ).stdout
    assert out == a.tobytes()


def test_batch_composition_does_not_change_vectors(enc: PixelsEncoder) -> None:
    """A vector does not depend on the other images in its batch."""
    imgs = [phantom(s) for s in range(4)]
    together = enc.encode(imgs)
    alone = np.concatenate([enc.encode([im]) for im in imgs])
    assert np.array_equal(together, alone)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_near_duplicates_score_above_095(enc: PixelsEncoder, seed: int) -> None:
    """Slight noise, a brightness shift, a gamma change and a small crop keep cosine > 0.95."""
    img = phantom(seed)
    rng = np.random.default_rng(100 + seed)
    variants = [
        np.clip(img + rng.normal(0, 0.03, img.shape), 0, 1),
        np.clip(img + 0.08, 0, 1),
        img**0.8,
        img[3:, 3:],
    ]
    z = enc.encode([img, *[v.astype(np.float32) for v in variants]])
    cos = z[1:] @ z[0]
    assert np.all(cos > 0.95), cos


def test_affine_intensity_change_is_invariant(enc: PixelsEncoder) -> None:
    """Contrast and brightness a*x + b without clipping leave the vector essentially unchanged."""
    img = phantom(4)
    z = enc.encode([img, 0.5 * img + 0.3])
    assert float(z[0] @ z[1]) > 0.9999


def _float64_pixels(img: np.ndarray) -> np.ndarray:
    """The pixels vector computed plainly, all in float64 (np.gradient, np.hypot, the scaled
    float64 projection), as the encoder was first written: the reference of the fast path."""
    from msm_mem.plugins.encoders.pixels import SEED
    from msm_mem.plugins.images import resize

    words = np.random.PCG64(SEED).random_raw(512 * 4096 // 64).astype("<u8")
    signs = 1.0 - 2.0 * np.unpackbits(words.view(np.uint8), bitorder="little").astype(np.float64)
    proj = (signs / np.sqrt(512)).reshape(512, 4096)
    x = resize(img, 64).astype(np.float64)
    x = (x - x.mean()) / x.std()

    def unit(v: np.ndarray) -> np.ndarray:
        return v / np.linalg.norm(v)

    def blocks(a: np.ndarray) -> np.ndarray:
        return a.reshape(16, 4, 16, 4).mean(axis=(1, 3)).ravel()

    edges = blocks(np.hypot(*np.gradient(x)))
    z = np.concatenate([unit(blocks(x)), unit(edges - edges.mean()), unit(proj @ x.ravel())]) / np.sqrt(3.0)
    return z / np.linalg.norm(z)


def test_pixels_matches_its_float64_reference(enc: PixelsEncoder) -> None:
    """Every coordinate within 1e-6 of the all-float64 computation (1 - cosine < 1e-10), for
    phantoms, noise and small or oblong images: the float32 projection changes no vector."""
    rng = np.random.default_rng(21)
    imgs = [phantom(s) for s in range(6)] + [phantom(7, size=300)[:, :120], phantom(8, size=40)]
    imgs += [rng.random((int(rng.integers(5, 200)), int(rng.integers(5, 200)))).astype(np.float32) for _ in range(6)]
    got = enc.encode(imgs).astype(np.float64)
    want = np.stack([_float64_pixels(img) for img in imgs])
    assert float(np.abs(got - want).max()) < 1e-6
    assert float((1.0 - np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1)).max()) < 1e-10


def test_unrelated_images_score_clearly_lower(enc: PixelsEncoder) -> None:
    """A radiograph-like image vs. a rotated other one, noise, stripes: each cosine < 0.5."""
    img = phantom(5)
    rng = np.random.default_rng(9)
    stripes = np.tile((np.arange(256) // 16 % 2).astype(np.float32), (256, 1))
    others = [np.rot90(phantom(6)).copy(), rng.random((256, 256)).astype(np.float32), stripes]
    z = enc.encode([img, *others])
    cos = z[1:] @ z[0]
    assert np.all(cos < 0.5), cos
    near = enc.encode([img, np.clip(img + rng.normal(0, 0.03, img.shape), 0, 1)])
    assert float(near[0] @ near[1]) > float(cos.max()) + 0.4


def test_constant_image_maps_to_fixed_unit_vector(enc: PixelsEncoder) -> None:
    """A constant image (no contrast) encodes to the uniform unit vector, whatever its level."""
    z = enc.encode([np.zeros((8, 8), np.float32), np.full((50, 20), 0.7, np.float32)])
    np.testing.assert_allclose(z, 1.0 / np.sqrt(1024), atol=1e-7)


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((4, 4, 3), np.float32),
        np.zeros((0, 5)),
        np.full((4, 4), np.nan),
        np.full((4, 4), 2.0),
    ],
)
def test_invalid_images_raise_invalid_input(enc: PixelsEncoder, bad: np.ndarray) -> None:
    """3-D, empty, non-finite and out-of-range arrays are refused with InvalidInput."""
    with pytest.raises(InvalidInput):
        enc.encode([phantom(0), bad])


@pytest.mark.parametrize(
    ("value", "problem"),
    [(np.nan, "NaN or infinity"), (np.inf, "NaN or infinity"), (-np.inf, "NaN or infinity"), (1.5, r"\[0, 1\]")],
)
def test_an_invalid_pixel_is_named(enc: PixelsEncoder, value: float, problem: str) -> None:
    """One NaN or infinite pixel is refused as such, one out of range as out of [0, 1]."""
    img = phantom(3)
    img[10, 20] = value
    with pytest.raises(InvalidInput, match=problem):
        enc.encode([img])


def _write_pngs(tmp_path: Path, n: int) -> list[Path]:
    paths = []
    for i in range(n):
        p = tmp_path / f"img{i}.png"
        Image.fromarray((phantom(i, size=96) * 255).round().astype(np.uint8)).save(p)
        paths.append(p)
    return paths


def test_encode_paths_matches_encode_for_any_batch_size(
    enc: PixelsEncoder, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """encode_paths keeps order and equals encode(load_image(...)) for batch sizes 1, 2 and 32."""
    from msm_mem.plugins.images import load_image

    paths = _write_pngs(tmp_path, 5)
    expected = enc.encode([load_image(p) for p in paths])
    for bs in (1, 2, 32):
        assert np.array_equal(enc.encode_paths(paths, batch_size=bs), expected)
    assert capsys.readouterr().err == ""
    enc.encode_paths(paths, batch_size=2, progress=True)
    assert "5/5" in capsys.readouterr().err
    assert enc.encode_paths([]).shape == (0, 1024)
    batches = list(enc.iter_encode_paths(paths, batch_size=2))
    assert [b.shape[0] for b in batches] == [2, 2, 1]


def test_encode_paths_errors(enc: PixelsEncoder, tmp_path: Path) -> None:
    """A bad batch size is InvalidInput; an unreadable file is ImageError naming it."""
    paths = _write_pngs(tmp_path, 2)
    bad_sizes: list[object] = [0, -1, True, 2.5]
    for bs in bad_sizes:
        with pytest.raises(InvalidInput, match="batch_size"):
            enc.encode_paths(paths, batch_size=bs)  # type: ignore[arg-type]
    (tmp_path / "junk.png").write_bytes(b"junk")
    with pytest.raises(ImageError, match="junk.png"):
        enc.encode_paths([*paths, tmp_path / "junk.png"])


def test_registry_unknown_name_lists_known_names() -> None:
    """An unknown encoder name raises InvalidInput whose message lists every known name."""
    with pytest.raises(InvalidInput) as info:
        get_encoder("resnet-9000")
    for name in ("pixels", "efficientnet-lite0", "torchxrayvision", "imagebind", "open_clip"):
        assert name in str(info.value)
        assert name in known_encoders()


def test_registry_bad_option_is_invalid_input() -> None:
    """An option the encoder does not accept raises InvalidInput, not TypeError."""
    with pytest.raises(InvalidInput, match="bad options"):
        get_encoder("pixels", size=32)


def test_registry_missing_dependency_raises_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """When torch is not importable, the torch encoders raise MissingExtra naming their extra."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else real(name, *a),
    )
    extras = {"efficientnet-lite0": "efficientnet", "torchxrayvision": "xrv"}
    extras |= {"imagebind": "imagebind", "open_clip": "openclip"}
    for name, extra in extras.items():
        with pytest.raises(MissingExtra) as info:
            get_encoder(name)
        assert info.value.extra == extra and f"msm-mem[{extra}]" in str(info.value)
        assert isinstance(info.value, ImportError)
    assert available_encoders() == ["pixels"]


def test_available_encoders_is_subset_with_pixels() -> None:
    """available_encoders always includes 'pixels' and only registered names, sorted."""
    names = available_encoders()
    assert "pixels" in names and set(names) <= set(known_encoders()) and names == sorted(names)


@pytest.mark.shared
def test_real_radiographs_near_duplicate_vs_other_patients(enc: PixelsEncoder) -> None:
    """On ../shared covid-cxr images, a noisy copy scores > 0.95; other images average < 0.6."""
    if not (COVID / "metadata.csv").is_file():
        pytest.skip("../shared/data/covid-cxr absent")
    with (COVID / "metadata.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))[:24]
    from msm_mem.plugins.images import load_image

    imgs = [load_image(COVID / r["image"]) for r in rows]
    z = enc.encode(imgs)
    off = (z @ z.T)[~np.eye(len(z), dtype=bool)]
    assert float(off.mean()) < 0.6
    rng = np.random.default_rng(0)
    for img, v in zip(imgs[:6], z[:6], strict=True):
        noisy = np.clip(img + rng.normal(0, 0.03, img.shape), 0, 1).astype(np.float32)
        assert float(enc.encode([noisy])[0] @ v) > 0.95
