"""One governed ask at a time, in process, this tree beside another: the cost of a served ask
without HTTP and without a load generator sharing the cores.

Each run is a fresh process (``PYTHONPATH=TREE/src``) on a fresh store: the synthetic set
(``datasets.synthetic.generate``, ``--patients`` patients, seed 0) ingested, then ``--asks``
calls of ``MsmMem.ask`` with write-back (the default), one at a time, one BLAS thread (as the
server runs), the studies in a fixed order that interleaves the patients; the first
``--warmup`` are not timed. A run prints the median milliseconds of an ask. The embedded store
and, with ``--postgres``, PostgreSQL (a local server this script starts with pgserver, a fresh
schema per run); trees alternate in order from round to round. Prints a Markdown table: the
median over ``--rounds`` runs of each run's median, with the range, and the ratio.

Usage: python benchmarks/bench_ask_one.py [--patients 100] [--asks 400] [--warmup 50]
       [--rounds 3] [--postgres] [--baseline OTHER_TREE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _trees import answer, run_in_tree, table_head, tree_arguments, trees_of

HERE = Path(__file__).resolve().parent


def _worker(args: argparse.Namespace) -> None:
    from threadpoolctl import threadpool_limits

    from msm_mem import MsmMem, Principal
    from msm_mem.datasets.synthetic import generate

    threadpool_limits(1)
    admin = Principal("bench-admin", "admin", "operations")
    agent = Principal("bench-agent", "agent", "treatment")
    with tempfile.TemporaryDirectory() as tmp:
        rows, _ = generate(Path(tmp) / "data", patients=args.patients, seed=0)
        where = {"database_url": args.database_url, "schema": f"ask_{uuid.uuid4().hex[:12]}"}
        with MsmMem.init(Path(tmp) / "store", admin, **(where if args.database_url else {})) as mem:
            mem.ingest(Principal("bench-ingest", "system", "operations"), rows)
            studies = [(r.patient_id, r.image) for r in rows]
            ms = []
            for i in range(args.asks):
                patient, image = studies[(i * 7) % len(studies)]
                t0 = time.perf_counter()
                mem.ask(agent, patient, image, "What is the impression?")
                if i >= args.warmup:
                    ms.append((time.perf_counter() - t0) * 1e3)
    answer(statistics.median(ms))


def _run(tree: Path, args: argparse.Namespace, url: str) -> float:
    run = ["--patients", str(args.patients), "--asks", str(args.asks), "--warmup", str(args.warmup)]
    return run_in_tree(tree, __file__, run + (["--database-url", url] if url else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patients", type=int, default=100)
    ap.add_argument("--asks", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--postgres", action="store_true", help="PostgreSQL too (a local server started here)")
    tree_arguments(ap)
    ap.add_argument("--database-url", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.patients < 1 or args.rounds < 1 or args.warmup < 0 or args.asks <= args.warmup:
        ap.error("--patients and --rounds: at least 1; --warmup: 0 or more; --asks: more than --warmup")
    if args.worker:
        _worker(args)
        return
    trees = trees_of(ap, args.baseline)
    stores = ["embedded (SQLite)"] + (["PostgreSQL"] if args.postgres else [])
    got: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        url = ""
        if args.postgres:
            sys.path.insert(0, str(HERE.parent / "src"))
            from msm_mem.testing import local_server

            url = local_server(Path(tmp) / "pg", delete_at_exit=True)
        for r in range(args.rounds):
            for store in stores:
                for name, tree in trees if r % 2 == 0 else trees[::-1]:
                    ms = _run(tree, args, url if store == "PostgreSQL" else "")
                    got.setdefault((store, name), []).append(ms)
                    print(f"round {r + 1} {store} {name}: {ms:.3f} ms", file=sys.stderr)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(table_head("store", trees, "ms median (range)"))
    for store in stores:
        medians = [statistics.median(got[(store, name)]) for name, _ in trees]
        cells = [
            f"{m:.2f} ({min(got[(store, n)]):.2f} to {max(got[(store, n)]):.2f})"
            for m, (n, _) in zip(medians, trees, strict=True)
        ]
        ratio = f" {medians[0] / medians[1]:.2f} |" if len(trees) > 1 else ""
        print(f"| {store} | " + " | ".join(cells) + " |" + ratio)


if __name__ == "__main__":
    main()
