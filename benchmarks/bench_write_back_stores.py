"""Governed write-back on both stores, this tree beside another (issue: write-back on PostgreSQL).

Runs the three write-back rows of ``bench_governance.py`` (the same turns, 100 per
transaction: over ``--patients`` patients with 240 distinct impressions, then the first
patient count with every impression unique) on the embedded store and on PostgreSQL (a local
server this script starts with pgserver: durable settings, a Unix socket), for this source
tree and, with ``--baseline OTHER_TREE``, for another tree (a checkout holding
``src/msm_mem``). Each run is a fresh process on a fresh store (a fresh schema on the one
server); rows, stores and trees are interleaved in every round, so a slow spell of a shared
machine hits all of them. Prints a Markdown table: the median rate of each row over
``--rounds`` runs with its range, and the ratio of the medians. The turns of a tree whose
``GovernedMemory`` has ``begin_many`` begin as one batch; an older tree's begin one by one.

Usage: python benchmarks/bench_write_back_stores.py [--interactions 20000] [--patients 1000 100]
       [--rounds 3] [--baseline OTHER_TREE] [--stores sqlite postgres]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

from _trees import answer, run_in_tree, table_head, tree_arguments, trees_of

HERE = Path(__file__).resolve().parent


def _worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    from bench_governance import bench_write_back

    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or None
        rate = bench_write_back(Path(tmp), args.interactions, args.patients[0], args.unique, database_url=url)
    answer(rate)


def _run(tree: Path, interactions: int, patients: int, unique: bool, url: str) -> float:
    args = ["--interactions", str(interactions), "--patients", str(patients)]
    args += ["--unique"] if unique else []
    return run_in_tree(tree, __file__, args + (["--database-url", url] if url else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interactions", type=int, default=20_000)
    ap.add_argument("--patients", type=int, nargs="+", default=[1000, 100])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stores", nargs="+", choices=["sqlite", "postgres"], default=["sqlite", "postgres"])
    tree_arguments(ap)
    ap.add_argument("--unique", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--database-url", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return
    if args.rounds < 1 or args.interactions < 100 or min(args.patients) < 100:
        ap.error("--rounds: at least 1; --interactions and --patients: at least 100")
    trees = trees_of(ap, args.baseline)
    rows = [(p, False) for p in args.patients] + [(args.patients[0], True)]
    rates: dict[tuple[str, int, bool, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = ""
        if "postgres" in args.stores:
            sys.path.insert(0, str(HERE.parent / "src"))
            from msm_mem.testing import local_server

            url = local_server(Path(tmp) / f"pg-{uuid.uuid4().hex[:6]}", delete_at_exit=True)
        for _ in range(args.rounds):
            for store in args.stores:
                for p, unique in rows:
                    for name, tree in trees:
                        rate = _run(tree, args.interactions, p, unique, url if store == "postgres" else "")
                        rates.setdefault((store, p, unique, name), []).append(rate)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(table_head("store | write-back row", trees, "median (range)").replace("|---", "|---|---", 1))
    for store in args.stores:
        for p, unique in rows:
            answers = "every impression unique" if unique else "240 distinct impressions"
            cells, medians = [], []
            for name, _ in trees:
                got = rates[(store, p, unique, name)]
                medians.append(statistics.median(got))
                cells.append(f"{medians[-1]:,.0f}/s ({min(got):,.0f} to {max(got):,.0f})")
            ratio = f" {medians[0] / medians[1]:.2f} |" if len(trees) > 1 else ""
            label = "PostgreSQL" if store == "postgres" else "embedded (SQLite)"
            print(f"| {label} | {p:,} patients, {answers} | " + " | ".join(cells) + " |" + ratio)


if __name__ == "__main__":
    main()
