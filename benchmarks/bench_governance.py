"""Benchmarks of the governed tiers (issue: governed tiers) and of the online loop's own
overhead (issue: agent loop). Prints a Markdown table; every figure is a median or a rate
measured in this run.

1. audit append with durable group commit: AuditLog.write of 1,000 events per transaction
   (SQLite WAL, synchronous=FULL: one fsync per group), events/s;
2. audit re-verification of N events read back from the store: full (canonical form, hash,
   links) and hash-only, CPU seconds in one process (workers: ``bench_audit_verify.py``);
3. governed write-back: consent check + STM write + gate + envelope encryption + semantic and
   claim supersession + derived entities + audit, committed 100 turns per transaction,
   interactions/s: over 1,000 patients (20 studies each by the end) and over 100 patients
   (200 each) with 240 distinct impressions (the labeler that derives entities memoises per
   text), and over 1,000 patients with every impression unique. The novelty check scans all of
   a patient's vectors, so the rate falls as histories grow. Each row runs ``--repeat`` times
   (rows interleaved, a fresh store each time) and the median rate is reported with the range:
   on a shared machine one run can be a third off the next. With ``--postgres`` the three rows
   also run with the store of record on PostgreSQL (a server this script starts with
   pgserver: durable settings, a Unix socket); ``bench_write_back_stores.py`` runs them on both
   stores beside another source tree;
4. the memory's own overhead per query (MemoryAgent.ask with a precomputed image embedding and
   a constant backbone: consent, STM, retrieval over N stored items, ranking, fusion, gate,
   encryption, audit, commit): median ms.

Usage: python benchmarks/bench_governance.py [--events 1000000] [--interactions 20000]
       [--patients 1000 100] [--items 100000] [--repeat 3] [--postgres]
"""

from __future__ import annotations

import argparse
import inspect
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from _impressions import impressions

from msm_mem import EpisodicRecord, MsmMem, Principal, Settings, VisualRecord
from msm_mem._agent.agent import MemoryAgent, Query
from msm_mem._governance.audit_chain import verify_hashes_in_batches
from msm_mem._storage.base import WriteBatch
from msm_mem.plugins.encoders.base import BaseEncoder
from msm_mem.testing import FixedBackbone, FixedClock

AGENT = Principal("bench-agent", "agent")
ADMIN = Principal("bench-admin", "admin", "operations")


class LookupEncoder(BaseEncoder):
    """Returns a precomputed vector per image (the encoder's cost is not the memory's)."""

    name, dim = "pixels", 1024

    def __init__(self) -> None:
        self.next: np.ndarray | None = None

    def _encode_batch(self, images):  # type: ignore[no-untyped-def]
        assert self.next is not None
        return self.next[None, :].astype(np.float64)


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    z = rng.standard_normal((n, 1024), dtype=np.float32)
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def bench_audit(work: Path, events: int) -> dict[str, float]:
    mem = MsmMem.init(work / "audit", ADMIN, clock=FixedClock(1.7e9))
    mem._audit.checkpoint_every = 10**12  # checkpoints are measured separately (one per pass)
    spec = dict(
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
    t0 = time.perf_counter()
    for start in range(0, events, 1000):
        mem._audit.write(WriteBatch(), [mem._audit.spec(**spec) for _ in range(min(1000, events - start))])
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
    batched = hasattr(gm, "begin_many")  # (a tree before it began each turn alone)
    # (a tree before the novelty searches were read ahead with the batch's other reads)
    ahead = batched and "novelty" in inspect.signature(gm.begin_many).parameters
    for start in range(0, n, 100):
        batch = range(start, min(n, start + 100))
        names = [f"P{i % patients}" for i in batch]
        if ahead:
            turns = gm.begin_many(AGENT, names, novelty=[(f"P{i % patients}", z[i]) for i in batch])
        elif batched:
            turns = gm.begin_many(AGENT, names)
        else:
            turns = [gm.begin(AGENT, name) for name in names]
        for i, turn in zip(batch, turns, strict=True):
            item = gm.observe(turn, z[i], "What is the impression?", timestamp=1.6e9 + i, study_id=f"s{i}")
            answer = answers[i % len(answers)]
            answer = f"{answer.rstrip('.')} on image {i}." if unique else answer
            gm.consolidate(turn, item, answer, decision="treat")
        gm.commit_many(turns)
    rate = n / (time.perf_counter() - t0)
    mem.close()
    return rate


def bench_query_overhead(work: Path, items: int, queries: int = 300) -> tuple[float, float]:
    mem = MsmMem.init(work / "q", ADMIN, settings=Settings(), clock=FixedClock(1.7e9))
    rng = np.random.default_rng(1)
    patients = items // 10
    for start in range(0, items, 5000):
        m = min(5000, items - start)
        z = unit(rng, m)
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
    encoder = LookupEncoder()
    agent = MemoryAgent(mem._gm, encoder, FixedBackbone("Right lower lobe consolidation, unchanged."))
    image = np.zeros((8, 8), dtype=np.float32)
    # a follow-up study resembles the patient's earlier one: its vector plus noise (cosine ~0.9);
    # an unrelated image makes the retrieval policy widen to a population scan as well
    base = mem._store.get_episodes([f"E-{p}" for p in range(queries)])
    noise = unit(rng, queries)
    results = []
    for near in (True, False):
        times = []
        for q in range(queries):
            z = base[q].z + 0.45 * noise[q] if near else noise[q]
            encoder.next = (z / np.linalg.norm(z)).astype(np.float32)
            t0 = time.perf_counter()
            agent.ask(
                AGENT,
                Query(base[q].patient_id, image, "What is the impression?", timestamp=1.7e9, study_id=f"q{q}-{near}"),
            )
            times.append(time.perf_counter() - t0)
        results.append(statistics.median(times[20:]) * 1e3)
    mem.close()
    return results[0], results[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--interactions", type=int, default=20_000)
    ap.add_argument("--patients", type=int, nargs="+", default=[1000, 100])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each write-back row (median reported)")
    ap.add_argument(
        "--postgres", action="store_true", help="also run the write-back rows on PostgreSQL (a local pgserver)"
    )
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat: at least 1")
    if args.items < 300:
        ap.error("--items: at least 300 (the overhead part asks 300 queries of stored patients)")
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
        overhead = bench_query_overhead(work, args.items)
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
