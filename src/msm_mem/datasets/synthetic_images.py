"""The synthetic set's images (:mod:`msm_mem.datasets.synthetic`): one patient's fixed anatomy
and the rendering of a study's finding state as an 8-bit grayscale chest X-ray-like PNG."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

State = dict[str, int]
Float = npt.NDArray[np.float32]


@dataclass(frozen=True)
class _Anatomy:
    """One patient's fixed anatomy, in image fractions (0..1), and lung-marking texture."""

    cx: float  # midline
    gap: float  # lung centre distance from the midline
    rx: float  # lung half-width at the base
    ry: float  # lung half-height
    ly: float  # lung centre height
    hrx: float  # heart half-width
    hry: float  # heart half-height
    body: float  # soft-tissue brightness
    lung: float  # aerated lung brightness
    nod_dx: float  # nodule offset, in lung half-widths (lateral)
    nod_dy: float  # nodule offset, in lung half-heights (up is negative)
    texture: Float


def _anatomy(rng: np.random.Generator, size: int) -> _Anatomy:
    low = rng.standard_normal((size // 8 + 1, size // 8 + 1)).astype(np.float32)
    fine = rng.standard_normal((size // 3 + 1, size // 3 + 1)).astype(np.float32)
    texture = np.zeros((size, size), dtype=np.float32)
    for a, w in ((low, 0.6), (fine, 0.4)):
        texture += w * np.asarray(Image.fromarray(a).resize((size, size), Image.Resampling.BICUBIC))
    u = rng.uniform
    return _Anatomy(
        cx=0.5 + float(rng.normal(0, 0.015)),
        gap=u(0.19, 0.23),
        rx=u(0.15, 0.18),
        ry=u(0.28, 0.33),
        ly=u(0.42, 0.47),
        hrx=u(0.12, 0.14),
        hry=u(0.10, 0.12),
        body=u(0.50, 0.60),
        lung=u(0.16, 0.24),
        nod_dx=u(0.1, 0.5),
        nod_dy=u(-0.55, -0.3),
        texture=texture,
    )


def _soft(e: Float, width: float = 0.15) -> Float:
    """1 inside the ellipse level set ``e < 1``, 0 outside, with a soft edge."""
    out: Float = np.clip((1.0 - e) / width, 0.0, 1.0).astype(np.float32)
    return out


def _render(a: _Anatomy, cur: State, rng: np.random.Generator, size: int) -> Float:
    grid = np.linspace(0.0, 1.0, size, dtype=np.float32)
    y, x = np.meshgrid(grid, grid, indexing="ij")
    x = x - np.float32(rng.uniform(-0.01, 0.01))
    y = y - np.float32(rng.uniform(-0.01, 0.01))
    cx, ly, ry = a.cx, a.ly, a.ry
    torso = _soft(((x - cx) / 0.47) ** 2 + ((y - 0.58) / 0.62) ** 2, 0.3)
    img = 0.08 + (a.body - 0.08) * torso
    lungs: dict[str, Float] = {}
    centres = {"right": cx - a.gap, "left": cx + a.gap}
    markings = np.zeros_like(img)
    # Lungs are narrow at the apex and wide at the base.
    rx = a.rx * (0.7 + 0.45 * np.clip((y - ly + ry) / (2 * ry), 0.0, 1.0))
    for side, lx in centres.items():
        lungs[side] = _soft(((x - lx) / rx) ** 2 + ((y - ly) / ry) ** 2)
        img -= (a.body - a.lung) * lungs[side]
        hilum = np.exp(-((x - (lx + cx) / 2) ** 2 + (y - ly) ** 2) / 0.02)
        markings += lungs[side] * (0.035 * a.texture + 0.08 * hilum)
    # Pneumothorax: the lung collapses away from the apex; no markings beyond the pleural line.
    for side, lx in centres.items():
        if level := cur.get(f"{side}_pneumothorax", 0):
            shrink = 1.0 - 0.13 * level
            e = ((x - lx) / (rx * shrink)) ** 2 + ((y - ly - ry * (1 - shrink)) / (ry * shrink)) ** 2
            gap = lungs[side] * (1.0 - _soft(e, 0.05))
            markings *= 1.0 - gap
            img -= 0.07 * gap
            img += 0.12 * lungs[side] * np.exp(-(((e - 1.0) / 0.05) ** 2))
    img += markings
    spine = _soft(((x - cx) / (0.05 + 0.03 * y)) ** 2 + ((y - 0.6) / 0.7) ** 4, 0.5)
    heart_w = 1.0 + 0.14 * cur.get("cardiomegaly", 0)
    hx, hy = cx + 0.05 * heart_w, ly + 0.58 * ry
    heart = _soft(((x - hx) / (a.hrx * heart_w)) ** 2 + ((y - hy) / a.hry) ** 2, 0.3)
    img = np.maximum(img, 0.68 * spine)
    img = np.maximum(img, 0.74 * heart)
    for side, lx in centres.items():
        sign = -1.0 if side == "right" else 1.0
        lobe = "rll" if side == "right" else "lll"
        if level := cur.get(f"{lobe}_consolidation", 0):
            r = 0.04 + 0.025 * level
            d2 = (x - lx - sign * 0.02) ** 2 + (y - ly - 0.5 * ry) ** 2
            img += (0.2 + 0.08 * level) * np.exp(-d2 / (2 * r * r)) * lungs[side]
        if level := cur.get(f"{side}_nodule", 0):
            nx, ny = lx + sign * a.nod_dx * rx, ly + a.nod_dy * ry
            r = 0.012 + 0.008 * level
            img += 0.36 * _soft(((x - nx) ** 2 + (y - ny) ** 2) / (r * r), 0.4)
        if level := cur.get(f"{side}_effusion", 0):
            lateral = np.maximum(sign * (x - lx) / rx, 0.0)
            top = ly + 0.85 * ry - 0.07 * level - 0.06 * lateral
            fluid = np.clip((y - top) / 0.012, 0.0, 1.0) * np.clip(lungs[side] * 3.0, 0.0, 1.0)
            img = img * (1.0 - fluid) + 0.7 * fluid
        if level := cur.get("edema", 0):
            hx2 = (lx + cx) / 2
            s2 = (0.09 + 0.03 * level) ** 2
            haze = np.exp(-((x - hx2) ** 2 + (y - ly) ** 2) / (2 * s2))
            img += 0.09 * level * haze * lungs[side]
    img = img * np.float32(rng.uniform(0.97, 1.03)) + np.float32(rng.uniform(-0.02, 0.02))
    img += rng.normal(0.0, 0.015, img.shape).astype(np.float32)
    out: Float = np.clip(img, 0.0, 1.0).astype(np.float32)
    return out


def _to_png(img: Float, path: Path) -> None:
    pixels = np.floor(img * 255.0 + 0.5).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="PNG")
