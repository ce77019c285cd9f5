"""Benchmarks of the governed tiers and of the online loop's own overhead. Prints a Markdown
table; every figure is a median or a rate measured in this run.

1. audit append with durable group commit: the audit log's write of 1,000 events per
   transaction (SQLite WAL, synchronous=FULL: one fsync per group), events/s;
2. audit re-verification of N events read back from the store: full (canonical form, hash,
   links) and hash-only, CPU seconds in one process (workers: ``bench_audit_verify.py``);
3. governed write-back: consent check + STM write + gate + envelope encryption + semantic and
   claim supersession + derived entities + audit, committed 100 turns per transaction,
   interactions/s: over the first ``--patients`` count (20 studies each by the end at the
   defaults) and each further count, with 240 distinct impressions (the labeler that derives
   entities memoises per text), and over the first count with every impression unique. The
   novelty check scans all of a patient's vectors, so the rate falls as histories grow. Each
   row runs ``--repeat`` times (rows interleaved, a fresh store each time) and the median rate
   is reported with the range. With ``--postgres`` the rows also run with the store of record
   on PostgreSQL (a server this script starts with pgserver: durable settings, a Unix socket);
4. the memory's own overhead per query: ``MsmMem.ask`` with a precomputed image embedding (an
   encoder that looks it up) and a constant backbone, over ``--items`` stored items (consent,
   STM, retrieval, ranking, fusion, gate, encryption, audit, commit): median ms.

Parts 1 to 3 measure internals, so they import private modules: the audit log written and read
directly (no public call appends audit events alone), and turns begun and committed 100 to a
transaction by the governed memory (the public ``observe`` and ``consolidate`` commit one
each). Part 4 loads the items with the store's bulk write (precomputed vectors; ``ingest``
encodes images) and then asks through the public API.

Usage: python benchmarks/bench_governance.py [--events 1000000] [--interactions 20000]
       [--patients 1000 100] [--items 100000] [--queries 300] [--repeat 3] [--postgres]
(``--events 2000 --interactions 200 --patients 100 --items 100 --queries 40 --repeat 1``: a
run of seconds.)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from _impressions import impressions

from msm_mem import EpisodicRecord, MsmMem, Principal, Purpose, Role, Settings, VisualRecord
from msm_mem._governance.audit.verify import verify_hashes_in_batches
from msm_mem._storage.base import WriteBatch
from msm_mem.plugins.encoders import BaseEncoder
from msm_mem.testing import FixedBackbone, FixedClock

AGENT = Principal("bench-agent", Role.AGENT, Purpose.TREATMENT)
ADMIN = Principal("bench-admin", Role.ADMIN, Purpose.OPERATIONS)
DIM = 1024
Vectors = npt.NDArray[np.float32]


class LookupEncoder(BaseEncoder):
    """Returns the vector set in ``next`` for any image (the encoder's cost is not the memory's)."""

    name, dim = "pixels", DIM

    def __init__(self) -> None:
        self.next: Vectors = np.zeros(DIM, dtype=np.float32)

    def _encode_batch(self, images: Sequence[npt.NDArray[np.float32]]) -> npt.NDArray[np.float64]:
        return self.next[None, :].astype(np.float64)


def unit(rng: np.random.Generator, n: int) -> Vectors:
    """``n`` random unit vectors of ``DIM`` float32."""
    z = rng.standard_normal((n, DIM), dtype=np.float32)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    return z


def append_events(mem: MsmMem, events: int) -> None:
    """Append ``events`` read events to the store's audit log, 1,000 per transaction, each commit
    signed (the audit log's own write: no public call appends audit events alone)."""
    audit = mem._audit
    for start in range(0, events, 1000):
        specs = [
            audit.spec(
                actor="bench",
                role="agent",
                action="read",
                source_tier="ltm",
                target_tier="stm",
                purpose="treatment",
                record_ids=("E-" + "a" * 32, "V-" + "b" * 32),
                patient="P1",
                consent_id="C-1",
            )
            for _ in range(min(1000, events - start))
        ]
        audit.write(WriteBatch(), specs)


def bench_audit(work: Path, events: int) -> dict[str, float]:
    mem = MsmMem.init(work / "audit", ADMIN, clock=FixedClock(1.7e9))
    t0 = time.perf_counter()
    append_events(mem, events)
    append = events / (time.perf_counter() - t0)
    mem._audit.checkpoint()
    t0 = time.process_time()
    ok_full = mem._audit.verify(full=True, processes=1).ok
    full = time.process_time() - t0
    t0 = time.process_time()
    ok_hash = mem._audit.verify(full=False).ok
    hashes = time.process_time() - t0
    assert ok_full and ok_hash
    # the two parts of hash-only verification, apart: reading the pages of rows, hashing them in memory
    t0 = time.process_time()
    pages = list(mem._store.iter_audit_batches())
    read = time.process_time() - t0
    t0 = time.process_time()
    assert verify_hashes_in_batches(pages).ok
    hashing = time.process_time() - t0
    mem.close()
    return {
        "append_events_per_s": append,
        "verify_full_s": full,
        "verify_hash_s": hashes,
        "read_s": read,
        "hash_in_memory_s": hashing,
    }


def bench_write_back(work: Path, n: int, patients: int, unique: bool = False, database_url: str | None = None) -> float:
    directory = work / f"wb-{patients}-{unique}"
    shutil.rmtree(directory, ignore_errors=True)  # a repeat starts from an empty store
    schema = f"wb_{uuid.uuid4().hex[:12]}"  # (a server store: a fresh schema each time)
    mem = MsmMem.init(directory, ADMIN, clock=FixedClock(1.7e9), database_url=database_url, schema=schema)
    gm = mem._gm
    rng = np.random.default_rng(0)
    z = unit(rng, n)
    for p in range(patients):  # patients' keys and pseudonyms exist already in steady state
        mem._audit.pseudonym(f"P{p}")
    answers = impressions()
    t0 = time.perf_counter()
    for start in range(0, n, 100):
        batch = range(start, min(n, start + 100))
        names = [f"P{i % patients}" for i in batch]
        turns = gm.begin_many(AGENT, names, novelty=[(f"P{i % patients}", z[i]) for i in batch])
        for i, turn in zip(batch, turns, strict=True):
            item = gm.observe(turn, z[i], "What is the impression?", timestamp=1.6e9 + i, study_id=f"s{i}")
            answer = answers[i % len(answers)]
            answer = f"{answer.rstrip('.')} on image {i}." if unique else answer
            gm.consolidate(turn, item, answer, decision="treat")
        gm.commit_many(turns)
    rate = n / (time.perf_counter() - t0)
    mem.close()
    return rate


def bench_query_overhead(work: Path, items: int, queries: int) -> tuple[float, float]:
    """Median ms of ``MsmMem.ask`` (write-back on) with ``items`` stored items: a follow-up image
    of the patient, and an unrelated image."""
    directory = work / "q"
    mem = MsmMem.init(directory, ADMIN, settings=Settings(), clock=FixedClock(1.7e9))
    rng = np.random.default_rng(1)
    patients = max(1, items // 10)
    stored = np.zeros((0, DIM), dtype=np.float32)
    for start in range(0, items, 5000):
        m = min(5000, items - start)
        z = unit(rng, m)
        stored = np.concatenate([stored, z])
        ids = range(start, start + m)
        mem._store.write(
            WriteBatch(
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
                        evidence_tier="ground_truth",
                    )
                    for j, i in enumerate(ids)
                ],
                visuals=[
                    VisualRecord(f"V-{i}", f"P{i % patients}", 1.6e9 + i, z[j], f"img/{i}.png", "PA", f"E-{i}")
                    for j, i in enumerate(ids)
                ],
            )
        )
    mem.close()
    encoder = LookupEncoder()
    backbone = FixedBackbone("Right lower lobe consolidation, unchanged.")
    mem = MsmMem.open(directory, encoder=encoder, backbone=backbone, clock=FixedClock(1.7e9))
    image = np.zeros((8, 8), dtype=np.float32)
    # a follow-up study resembles the patient's earlier one: its vector plus noise (cosine ~0.9);
    # an unrelated image makes the retrieval policy widen to a population scan as well
    noise = unit(rng, queries)
    warm = min(20, queries // 2)
    results = []
    for near in (True, False):
        times = []
        for q in range(queries):
            i = q % items
            z = stored[i] + 0.45 * noise[q] if near else noise[q]
            encoder.next = (z / np.linalg.norm(z)).astype(np.float32)
            t0 = time.perf_counter()
            mem.ask(
                AGENT,
                f"P{i % patients}",
                image,
                "What is the impression?",
                timestamp=1.7e9,
                study_id=f"q{q}-{near}",
            )
            times.append(time.perf_counter() - t0)
        results.append(statistics.median(times[warm:]) * 1e3)
    mem.close()
    return results[0], results[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--interactions", type=int, default=20_000)
    ap.add_argument("--patients", type=int, nargs="+", default=[1000, 100])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300, help="queries of the overhead part, each kind")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each write-back row (median reported)")
    ap.add_argument(
        "--postgres", action="store_true", help="also run the write-back rows on PostgreSQL (a local pgserver)"
    )
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat: at least 1")
    if args.items < 10 or args.queries < 2:
        ap.error("--items: at least 10; --queries: at least 2")
    if args.events < 1 or args.interactions < 1:
        ap.error("--events and --interactions: at least 1")
    if min(args.patients) < 100:
        ap.error("--patients: at least 100 (a transaction holds 100 turns of different patients)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        audit = bench_audit(work, args.events)
        runs = [(p, False) for p in args.patients] + [(args.patients[0], True)]
        wb: dict[tuple[int, bool], list[float]] = {run: [] for run in runs}
        for _ in range(args.repeat):  # interleaved, so that a slow spell of the machine hits every row
            for p, u in runs:
                wb[(p, u)].append(bench_write_back(work, args.interactions, p, u))
        on_postgres: dict[tuple[int, bool], list[float]] = {}
        if args.postgres:
            from msm_mem.testing import local_server

            url = local_server(work / "pgdata", delete_at_exit=True)
            for _ in range(args.repeat):
                for p, u in runs:
                    rate = bench_write_back(work, args.interactions, p, u, database_url=url)
                    on_postgres.setdefault((p, u), []).append(rate)
        overhead = bench_query_overhead(work, args.items, args.queries)
    print("| measure | result | goal |")
    print("|---|---|---|")
    print(
        "| audit append, durable group commit (1,000 events / transaction) "
        f"| {audit['append_events_per_s']:,.0f} events/s | >= 5,000 |"
    )
    print(
        f"| full re-verification of {args.events:,} events (read, canonical form, hash, links, checkpoints), "
        f"one process | {audit['verify_full_s']:.1f} s CPU | <= 5 s |"
    )
    print(f"| hash-only verification of {args.events:,} events | {audit['verify_hash_s']:.1f} s CPU | <= 2 s |")
    print(
        f"| apart: reading the pages of rows from SQLite into a list / hashing and links on those pages "
        f"| {audit['read_s']:.1f} s / {audit['hash_in_memory_s']:.1f} s CPU | - |"
    )
    for (p, unique), rates in wb.items():
        answers = "every impression unique" if unique else "240 distinct impressions"
        spread = f" ({min(rates):,.0f} to {max(rates):,.0f} over {len(rates)} runs)" if len(rates) > 1 else ""
        print(
            f"| governed write-back ({args.interactions:,} interactions over {p:,} patients, {answers}, "
            f"100 per transaction), median | {statistics.median(rates):,.0f} interactions/s{spread} | >= 2,000 |"
        )
    for (p, unique), rates in on_postgres.items():
        answers = "every impression unique" if unique else "240 distinct impressions"
        spread = f" ({min(rates):,.0f} to {max(rates):,.0f} over {len(rates)} runs)" if len(rates) > 1 else ""
        print(
            f"| same on PostgreSQL 16 + pgvector (local pgserver, Unix socket, fsync on), over "
            f"{p:,} patients, {answers}, median | {statistics.median(rates):,.0f} interactions/s{spread} | >= 2,000 |"
        )
    print(
        f"| memory overhead per query with {args.items:,} stored items, follow-up image of the patient (median) "
        f"| {overhead[0]:.2f} ms | <= 5 ms |"
    )
    print(f"| same, unrelated image: the policy also scans the population (median) | {overhead[1]:.2f} ms | - |")


if __name__ == "__main__":
    main()
