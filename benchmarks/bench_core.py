"""Benchmark of the memory core on the embedded store.

For each size N (episodic items; as many visual items; one semantic state per patient;
N/10 patients of about 10 studies each, 1024-d vectors) it measures, in one process per size:

- bulk ingest with precomputed vectors (Store.write in batches of 5,000 records: SQLite rows,
  vector blobs and the FAISS cache in one transaction per batch), items/s;
- resident memory after reopening the store (the FAISS cache loaded from disk), against the
  raw vector bytes (N x 1024 x 4 per memory);
- patient-scoped retrieval S+E+V, k=10 (5 episodic + 5 visual + the semantic state, records
  hydrated from SQLite) through Memory.retrieve, median over 1,000 random patients;
- the search part alone (Store.search_many for E and V: validation, lock, exact top-k, ids) against
  numpy brute force over that patient's vectors (given the patient's row numbers: gather with
  ``take``, one matrix-vector product, argsort), same patients, same run, interleaved, so the
  ratio is measured side by side. Each of the two is timed right after a retrieve of the same
  patient and query, in alternating order (whichever runs first after a retrieve finds colder
  caches), and their answers are checked to be equal.

It measures internals, so it imports private modules: the store (``SqliteStore``, written in
bulk with precomputed vectors), its envelope codec, the memory core (``Memory``) and the
store's vector cache, which no public call exposes.

Usage: python benchmarks/bench_core.py [--sizes 10000 100000 1000000] [--workdir DIR]
Prints one Markdown table row per size (``--sizes 2000``: a run of seconds).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

DIM = 1024


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_one(n: int, workdir: Path) -> dict[str, float]:
    """The figures of one size, measured in this process (``--one``)."""
    from msm_mem import EpisodicRecord, Impression, SemanticState, VisualRecord
    from msm_mem._governance.crypto import EnvelopeCipher
    from msm_mem._governance.envelope_codec import EnvelopeCodec
    from msm_mem._memory.msm import Memory
    from msm_mem._storage.base import WriteBatch
    from msm_mem._storage.sqlite import SqliteStore
    from msm_mem.testing import InMemoryKeyProvider

    keks = InMemoryKeyProvider()

    def encrypted(store: SqliteStore) -> SqliteStore:  # a store holds PHI only through the envelope codec
        store.use_codec(EnvelopeCodec(EnvelopeCipher(store.store_id, keks, store.keys()), store.keys()))
        store.use_row_key(bytes(range(32)))  # the row digests' key (MsmMem derives it)
        return store

    patients = max(1, n // 10)
    rng = np.random.default_rng(0)
    store = encrypted(SqliteStore.create(workdir / "store", dim=DIM, encoder="bench"))
    batch_size = 5000
    t0 = time.perf_counter()
    written = 0
    while written < n:
        m = min(batch_size, n - written)
        z = rng.standard_normal((m, DIM), dtype=np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        ids = range(written, written + m)
        batch = WriteBatch(
            episodes=[
                EpisodicRecord(
                    f"E-{i}",
                    f"P{i % patients}",
                    1.6e9 + i,
                    z[j],
                    "What is the impression?",
                    "Right lower lobe consolidation.",
                    "treat",
                    f"img/{i}.png",
                    "",
                    f"s{i}",
                )
                for j, i in enumerate(ids)
            ],
            visuals=[
                VisualRecord(f"V-{i}", f"P{i % patients}", 1.6e9 + i, z[j], f"img/{i}.png", "PA", f"E-{i}")
                for j, i in enumerate(ids)
            ],
        )
        store.write(batch)
        written += m
    ingest_s = time.perf_counter() - t0
    sem = [
        SemanticState(f"S-{p}", f"P{p}", "impression", (Impression(1.6e9, "Right lower lobe consolidation."),))
        for p in range(patients)
    ]
    for start in range(0, len(sem), 10000):
        store.write(WriteBatch(semantic=sem[start : start + 10000]))
    store.close()
    del store, batch
    gc.collect()

    rss_before = rss_bytes()
    t0 = time.perf_counter()
    store = encrypted(SqliteStore.open(workdir / "store"))
    open_s = time.perf_counter() - t0
    rss_after = rss_bytes()
    memory = Memory(store)

    qrng = np.random.default_rng(1)
    sample = qrng.choice(patients, size=min(1000, patients), replace=False)
    queries = qrng.standard_normal((len(sample), DIM), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    # brute-force baseline: each sampled patient's vectors gathered in advance
    epi_vecs = store._vectors._index["episodic"].vectors()  # the store's cache, read in place
    vis_vecs = store._vectors._index["visual"].vectors()
    mats = {}
    for p in sample:
        pos = store._vectors._index["episodic"].positions(f"P{p}")
        vpos = store._vectors._index["visual"].positions(f"P{p}")
        mats[p] = (pos.copy(), vpos.copy())

    full: list[float] = []
    search: list[float] = []
    brute: list[float] = []
    for _ in range(2):  # warm-up pass, then measured pass
        full.clear()
        search.clear()
        brute.clear()
        for i, (p, zq) in enumerate(zip(sample, queries, strict=True)):
            pid, (e, v) = f"P{p}", mats[p]
            # store and brute force each run right after a retrieve of the same patient and
            # query, in alternating order: the first call after a retrieve finds colder caches
            for run_store in (i % 2 == 0, i % 2 == 1):
                t = time.perf_counter()
                r = memory.retrieve(pid, zq, k_epi=5, k_vis=5)
                if run_store == (i % 2 == 0):
                    full.append(time.perf_counter() - t)
                if run_store:
                    t = time.perf_counter()
                    got = store.search_many(zq, [("episodic", 5), ("visual", 5)], pid)
                    search.append(time.perf_counter() - t)
                else:
                    t = time.perf_counter()
                    se = epi_vecs.take(e, 0) @ zq
                    sv = vis_vecs.take(v, 0) @ zq
                    top_e = np.argsort(-se)[:5]
                    top_v = np.argsort(-sv)[:5]
                    brute.append(time.perf_counter() - t)
            assert len(r.episodic) == min(5, len(e)) and len(r.semantic) == 1
            # the store's answer is brute force's: same records in the same order, same cosines
            want = [[f"E-{x}" for x in e[top_e]], [f"V-{x}" for x in v[top_v]]]
            assert [[rid for rid, _ in hits] for hits in got] == want
            assert np.allclose([s for _, s in got[0] + got[1]], np.concatenate([se[top_e], sv[top_v]]), atol=1e-6)
    raw = 2 * n * DIM * 4
    store.close()
    return {
        "n": n,
        "patients": patients,
        "ingest_items_per_s": 2 * n / ingest_s,
        "ingest_records_per_s": n / ingest_s,
        "open_s": open_s,
        "raw_vector_bytes": raw,
        "rss_delta_bytes": rss_after - rss_before,
        "rss_total_bytes": rss_after,
        "peak_rss_bytes": peak_rss_bytes(),
        "retrieve_median_ms": statistics.median(full) * 1e3,
        "retrieve_p95_ms": float(np.percentile(full, 95)) * 1e3,
        "search_median_ms": statistics.median(search) * 1e3,
        "brute_median_ms": statistics.median(brute) * 1e3,
        "search_over_brute": statistics.median(search) / statistics.median(brute),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument(
        "--workdir", type=Path, default=None, help="scratch folder, created if missing (default: a temp dir)"
    )
    args = ap.parse_args()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)  # a scratch folder that does not exist yet is made
    if args.one:
        work = Path(tempfile.mkdtemp(dir=args.workdir))
        try:
            print(json.dumps(run_one(args.one, work)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    print(
        "| items (E + V each) | patients | ingest items/s | open s | RSS delta / raw vectors | "
        "S+E+V k=10 median ms (p95) | E+V search median ms | numpy brute force ms | search / brute |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--one", str(n)]
        if args.workdir:
            cmd += ["--workdir", str(args.workdir)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        print(
            f"| {n:,} | {r['patients']:,} | {r['ingest_items_per_s']:,.0f} | {r['open_s']:.1f} | "
            f"{r['rss_delta_bytes'] / 2**20:,.0f} MiB / {r['raw_vector_bytes'] / 2**20:,.0f} MiB = "
            f"{r['rss_delta_bytes'] / r['raw_vector_bytes']:.2f}x | {r['retrieve_median_ms']:.3f} "
            f"({r['retrieve_p95_ms']:.3f}) | {r['search_median_ms']:.3f} | {r['brute_median_ms']:.3f} | "
            f"{r['search_over_brute']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
