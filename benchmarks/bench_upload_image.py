"""An upload's image work, one image at a time, this tree beside another (issue: the service).

What a served upload does with its bytes before the memory is read: ``load_image_bytes``
(decode to a GrayImage) and the default encoder's ``encode`` of that one image, timed apart,
for grey PNGs of several sizes (8-bit; and 16-bit at the largest size: the radiograph modes),
one BLAS thread as the server runs. Each measure is a fresh process importing msm-mem from
its tree (``_trees.run_in_tree``); trees, sizes and measures are interleaved in every round.

Two conditions: ``hot``, image after image; ``swept``, a 64 MiB array read between two images,
which leaves the encoder's projection matrix out of the cache as the rest of a request's work
does in a server. Prints a Markdown table: the median over rounds of each process's median
microseconds, the range, and the ratio of the two trees.

Usage: python benchmarks/bench_upload_image.py [--rounds 3] [--images 200] [--baseline OTHER_TREE]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time

import numpy as np
from _trees import answer, run_in_tree, table_head, tree_arguments, trees_of

#: (label, side in pixels, bits per pixel)
IMAGES = [("128 x 128, 8-bit", 128, 8), ("512 x 512, 8-bit", 512, 8), ("2048 x 2048, 8-bit", 2048, 8)]
IMAGES += [("2048 x 2048, 16-bit", 2048, 16)]
MEASURES = [("decode", "hot"), ("encode", "hot"), ("encode", "swept")]


def radiograph_png(side: int, bits: int, seed: int) -> bytes:
    """A smooth, noisy grey image that compresses like a radiograph (a flat noise image would
    time zlib, not the decoder's own work), as PNG bytes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side, 0:side] / side
    img = 0.5 + 0.3 * np.sin(6 * xx + seed) * np.cos(4 * yy) + 0.05 * rng.standard_normal((side, side))
    top = 2**bits - 1
    levels = (np.clip(img, 0, 1) * top).astype(np.uint8 if bits == 8 else np.uint16)
    buf = io.BytesIO()
    Image.fromarray(levels).save(buf, format="PNG")
    return buf.getvalue()


def _worker(args: argparse.Namespace) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # as the server (interfaces/http/serve.py)
    from msm_mem.plugins.encoders import get_encoder
    from msm_mem.plugins.images import load_image_bytes

    datas = [radiograph_png(args.side, args.bits, seed) for seed in range(4)]
    enc = get_encoder("pixels")
    images = [load_image_bytes(d, "upload") for d in datas]
    enc.encode(images[:1])  # the projection built once, as a serving worker has it
    sweep = np.ones(8 * 1024 * 1024)  # 64 MiB
    times = []
    n = args.images if args.side < 2048 else max(20, args.images // 10)
    for i in range(n):
        if args.condition == "swept":
            sweep.sum()
        t0 = time.perf_counter()
        if args.measure == "decode":
            load_image_bytes(datas[i % len(datas)], "upload")
        else:
            enc.encode([images[i % len(images)]])
        times.append(time.perf_counter() - t0)
    answer(statistics.median(times) * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--images", type=int, default=200, help="images timed per process (a tenth at 2048 x 2048)")
    tree_arguments(ap)
    ap.add_argument("--side", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--bits", type=int, default=8, help=argparse.SUPPRESS)
    ap.add_argument("--measure", default="decode", help=argparse.SUPPRESS)
    ap.add_argument("--condition", default="hot", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return
    if args.rounds < 1 or args.images < 20:
        ap.error("--rounds: at least 1; --images: at least 20")
    trees = trees_of(ap, args.baseline)
    got: dict[tuple[str, str, str, str], list[float]] = {}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for label, side, bits in IMAGES:
            for measure, condition in MEASURES:
                for name, tree in order:
                    opts = ["--side", str(side), "--bits", str(bits), "--measure", measure]
                    opts += ["--condition", condition, "--images", str(args.images)]
                    got.setdefault((label, measure, condition, name), []).append(run_in_tree(tree, __file__, opts))
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"Python {sys.version.split()[0]}, numpy {np.__version__}; {args.rounds} rounds")
    print(table_head("image | step | cache", trees, "us median (range)").replace("|---", "|---|---|---", 1))
    for label, _, _ in IMAGES:
        for measure, condition in MEASURES:
            cells, medians = [], []
            for name, _ in trees:
                values = got[(label, measure, condition, name)]
                medians.append(statistics.median(values))
                cells.append(f"{medians[-1]:,.0f} ({min(values):,.0f} to {max(values):,.0f})")
            ratio = f" {medians[0] / medians[1]:.2f} |" if len(trees) > 1 else ""
            print(f"| {label} | {measure} | {condition} | " + " | ".join(cells) + " |" + ratio)


if __name__ == "__main__":
    main()
