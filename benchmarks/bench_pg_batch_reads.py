"""The reads of a batch of governed turns on PostgreSQL, timed in one process: the read-ahead
with the batch's novelty searches, beside the read-ahead and one novelty check a turn; and a
data key read that the key table has cached.

A store on a local PostgreSQL server this script starts (pgserver), ``--records`` episodic and
visual records over ``--patients`` patients (1024-d random unit vectors), analyzed. Then, in
``--batches`` alternating rounds, for a batch of 100 patients with one new query vector each:

- ``read-ahead with the novelty searches``: ``Store.prefetch(patients, queries)`` (what
  ``GovernedMemory.begin_many(..., novelty=...)`` asks) and each turn's novelty check
  (``search_many``, top 1 of E and of V) answered from it;
- ``read-ahead, then a novelty check a turn``: ``Store.prefetch(patients)`` and each turn's
  two searches sent when it asks (one round trip a turn).

Prints the median wall time and client CPU time of a batch (the first four rounds warm up),
and the median time of a cached key read (``store.keys().get``, 20,000 reads a round). Run it
with ``PYTHONPATH=OTHER_TREE/src`` to measure another tree the same way.

Usage: python benchmarks/bench_pg_batch_reads.py [--patients 1000] [--records 10000] [--batches 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_governance import unit

import msm_mem
from msm_mem import EpisodicRecord, MsmMem, Principal, VisualRecord
from msm_mem._storage.base import VectorKind, WriteBatch
from msm_mem.testing import local_server

ADMIN = Principal("bench-admin", "admin", "operations")
BATCH = 100
WARM_UP = 4
REQUESTS: list[tuple[VectorKind, int]] = [("episodic", 1), ("visual", 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patients", type=int, default=1000)
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--batches", type=int, default=30)
    args = ap.parse_args()
    if args.patients < BATCH or args.records < 1 or args.batches <= WARM_UP:
        ap.error(f"--patients: at least {BATCH}; --records: at least 1; --batches: more than {WARM_UP}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        url = local_server(work / "pg", delete_at_exit=True)
        mem = MsmMem.init(work / "s", ADMIN, database_url=url, schema="bench_reads")
        try:
            store = mem._store
            rng = np.random.default_rng(0)
            for start in range(0, args.records, 1000):
                ids = range(start, min(args.records, start + 1000))
                z = unit(rng, len(ids))
                owner = [f"P{i % args.patients}" for i in ids]
                episodes = [
                    EpisodicRecord(f"E-{i}", owner[j], 1.7e9 + i, z[j], "Q?", "A.", "", f"i/{i}.png", "", f"s{i}")
                    for j, i in enumerate(ids)
                ]
                visuals = [
                    VisualRecord(f"V-{i}", owner[j], 1.7e9 + i, z[j], f"i/{i}.png", "PA", f"E-{i}")
                    for j, i in enumerate(ids)
                ]
                store.write(WriteBatch(episodes=episodes, visuals=visuals))
            store._conn.execute("ANALYZE")  # type: ignore[attr-defined]
            ways = ("read-ahead with the novelty searches", "read-ahead, then a novelty check a turn")
            spent: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
            for b in range(args.batches):
                patients = [f"P{(b * BATCH + j) % args.patients}" for j in range(BATCH)]
                queries = list(zip(patients, unit(rng, BATCH), strict=True))
                for way in ways if b % 2 else ways[::-1]:
                    store.sync()
                    c0, t0 = time.process_time(), time.perf_counter()
                    store.prefetch(patients, queries) if way == ways[0] else store.prefetch(patients)
                    for patient, z in queries:
                        store.search_many(z, REQUESTS, patient)
                    spent[way].append((time.perf_counter() - t0, time.process_time() - c0))
            mem._audit.pseudonym("P0")
            keys = store.keys()
            reads = []
            for _ in range(10):
                t0 = time.perf_counter()
                for _ in range(20_000):
                    keys.get("P0")
                reads.append((time.perf_counter() - t0) / 20_000)
        finally:
            mem.close()
    print(f"msm_mem from {msm_mem.__file__}; {args.records:,} records over {args.patients:,} patients")
    print("| a batch of 100 turns' reads | wall ms, median | client CPU ms, median |")
    print("|---|---|---|")
    for way, times in spent.items():
        kept = times[WARM_UP:]
        wall = statistics.median(t for t, _ in kept) * 1e3
        cpu = statistics.median(c for _, c in kept) * 1e3
        print(f"| {way} | {wall:.1f} | {cpu:.1f} |")
    print(f"\na cached data key read: {statistics.median(reads) * 1e6:.2f} us (median of 10 rounds of 20,000)")


if __name__ == "__main__":
    main()
