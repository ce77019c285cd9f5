"""Benchmark of the rule-based finding labeler (it derives the entities of every new claim).

Labels every impression and report text of the IU X-ray archive (3,955 reports shipped inside
the torchxrayvision wheel, read without importing torch), then the 4,800 short impressions of
the write-back benchmark's unique row, with the memo emptied, and prints the median over
``--passes`` passes of the time per text. The labeler is an internal of the memory layer, so
it is imported from its private module (and its memo emptied there). The labels themselves
are fixed by tests/test_labeler.py.

Usage: python benchmarks/bench_labeler.py [--passes 5] [--texts N]
(``--passes 1 --texts 200``: a run of seconds.)
"""

from __future__ import annotations

import argparse
import statistics
import time

from _impressions import impressions

from msm_mem._memory import labeler
from msm_mem.datasets import iu_xray


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--texts", type=int, default=None, help="label only the first N texts of each set")
    args = ap.parse_args()
    if args.passes < 1 or (args.texts is not None and args.texts < 1):
        ap.error("--passes and --texts must be at least 1")
    rows, _ = iu_xray.load()
    sets = {
        "IU X-ray impressions and reports": [t for r in rows for t in (r.answer, r.report) if t.strip()],
        # the impressions of the governance benchmark's write-back row with every one unique
        "unique write-back impressions (bench_governance)": [
            f"{text.rstrip('.')} on image {i}." for i, text in enumerate(impressions() * 20)
        ],
    }
    print("| texts | median us per text (no memo) |")
    print("|---|---|")
    for name, every in sets.items():
        texts = every[: args.texts]
        times = []
        for _ in range(args.passes):
            labeler._label.cache_clear()
            t0 = time.perf_counter()
            for text in texts:
                labeler.label(text)
            times.append((time.perf_counter() - t0) / len(texts))
        print(f"| {len(texts):,} {name} | {statistics.median(times) * 1e6:.1f} |")


if __name__ == "__main__":
    main()
