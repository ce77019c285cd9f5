"""One patient's reads on a grown store, this tree beside another.

Each tree gets its own store, grown by governed write-back turns (``bench_governance.py``'s
turns, 100 per transaction) to ``--turns`` over ``--patients`` patients (so each patient
holds turns / patients studies: episodes, visual records, claims, entities and
relationships). Then, in a fresh process per measurement (a store opened anew, its caches
cold), each of the public reads below is timed for ``--reads`` patients in turn (a care
role's audit trail, which reads the whole chain, for ``--trail-reads`` of them), and the
governed write-back is timed over ``--reads`` more turns of patients the new process has not
read yet (a turn reads the patient's entities before it links new ones). Rounds alternate
which tree goes first. Prints the median of the per-round medians, in milliseconds, and their ratio.

With ``--postgres`` the stores of record are schemas of a local PostgreSQL server the script
starts (pgserver, durable settings, a Unix socket).

Usage: python benchmarks/bench_patient_reads.py [--turns 50000] [--patients 5000] [--reads 200]
       [--trail-reads 10] [--rounds 3] [--baseline OTHER_TREE] [--postgres]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _trees import answer, run_in_tree, table_head, trees_of

HERE = Path(__file__).resolve().parent

#: the measured operations, each a public call on one patient
OPS = ("episodes", "visuals", "claims", "claim history", "audit trail", "write-back turn")


def _grow(directory: Path, turns: int, patients: int, database_url: str) -> None:
    sys.path.insert(0, str(HERE))
    from bench_governance import bench_write_back

    bench_write_back(directory, turns, patients, database_url=database_url or None)


def _measure(directory: Path, op: str, patients: int, reads: int, trail_reads: int) -> float:
    import numpy as np
    from bench_governance import AGENT

    from msm_mem import MsmMem
    from msm_mem.testing import FixedClock

    store = next(directory.glob("wb-*"))
    mem = MsmMem.open(store, clock=FixedClock(1.7e9))
    rng = np.random.default_rng(1)
    chosen = [f"P{int(i)}" for i in rng.choice(patients, size=reads, replace=False)]
    spent: list[float] = []
    if op == "write-back turn":
        gm = mem._gm
        z = rng.standard_normal((reads, mem._store.dim)).astype(np.float32)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        for i, name in enumerate(chosen):  # one turn a transaction: each pays its own reads
            t0 = time.perf_counter()
            turn = gm.begin(AGENT, name)
            item = gm.observe(turn, z[i], "What is the impression?", timestamp=1.7e9 + i, study_id=f"new{i}")
            gm.consolidate(turn, item, "Mild cardiomegaly.", decision="treat")
            gm.commit_many([turn])
            spent.append(time.perf_counter() - t0)
    else:
        chosen = chosen[:trail_reads] if op == "audit trail" else chosen
        keys = {name: [c.key for c in mem._store.claims_active(name)] or ["none"] for name in chosen}
        for name in chosen:
            t0 = time.perf_counter()
            if op == "episodes":
                mem.episodes(AGENT, name, limit=20)
            elif op == "visuals":
                mem.visuals(AGENT, name, limit=20)
            elif op == "claims":
                mem.claims(AGENT, name, limit=20)
            elif op == "claim history":
                mem.claim_history(AGENT, name, keys[name][0], limit=20)
            else:  # the patient's events, from the chain's start (every event of the chain read)
                mem.audit_trail(AGENT, name, limit=1000)
            spent.append(time.perf_counter() - t0)
    mem.close()
    return statistics.median(spent) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=50_000)
    ap.add_argument("--patients", type=int, default=5_000)
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument(
        "--trail-reads", type=int, default=10, help="patients whose audit trail is read (each reads the chain)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another source tree (holding src/msm_mem)")
    ap.add_argument("--postgres", action="store_true", help="the stores on PostgreSQL (a local server started here)")
    ap.add_argument("--database-url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--op", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        if args.op == "grow":
            _grow(args.store, args.turns, args.patients, args.database_url)
            answer(0.0)
        else:
            answer(_measure(args.store, args.op, args.patients, args.reads, args.trail_reads))
        return
    if args.rounds < 1 or args.patients < 1 or args.turns < args.patients:
        ap.error("--rounds, --patients: at least 1; --turns: at least --patients")
    if not (1 <= args.reads <= args.patients and 1 <= args.trail_reads <= args.reads):
        ap.error("--reads: 1 to --patients; --trail-reads: 1 to --reads")
    trees = trees_of(ap, args.baseline)
    common = ["--turns", str(args.turns), "--patients", str(args.patients), "--reads", str(args.reads)]
    common += ["--trail-reads", str(args.trail_reads)]
    got: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stores = {name: Path(tmp) / f"tree{i}" for i, (name, _) in enumerate(trees)}
        url = ""
        if args.postgres:
            sys.path.insert(0, str(HERE.parent / "src"))
            from msm_mem.testing import local_server

            url = local_server(Path(tmp) / "pg", delete_at_exit=True)
        for name, tree in trees:  # (each tree's own store: a tree may write what the other cannot read)
            grow = [*common, "--store", str(stores[name]), "--op", "grow", "--database-url", url]
            run_in_tree(tree, __file__, grow)
        for r in range(args.rounds):
            for op in OPS:
                for name, tree in trees if r % 2 == 0 else trees[::-1]:
                    ms = run_in_tree(tree, __file__, [*common, "--store", str(stores[name]), "--op", op])
                    got.setdefault((op, name), []).append(ms)
    where = "PostgreSQL" if args.postgres else "the embedded store"
    print(f"{args.turns:,} turns over {args.patients:,} patients on {where}; {args.reads} patients a measurement")
    print(f"(the audit trail: {args.trail_reads} patients a measurement)")
    print(table_head("call on one patient", trees, "ms"))
    for op in OPS:
        medians = [statistics.median(got[(op, name)]) for name, _ in trees]
        ratio = f" {medians[0] / medians[1]:.3f} |" if len(trees) > 1 else ""
        print(f"| {op} | " + " | ".join(f"{m:.3f}" for m in medians) + " |" + ratio)


if __name__ == "__main__":
    main()
