"""The governed store on one PostgreSQL server and on a Citus cluster on the same machine, side
by side in one run. Prints Markdown tables; every figure is measured in this run.

Both are started here from the tree ``make cluster-build`` makes (PostgreSQL 16.2 with pgvector
0.8.6, and Citus 13.2.2): the single server, and a coordinator with two workers, all on
127.0.0.1 with the same settings (``synchronous_commit`` on, ``fsync`` off). On each, one
hospital (tenant) is made with ``MsmMem.init --database-url`` (on the coordinator the store
distributes itself), ``--patients`` x ``--studies`` synthetic studies are ingested, then,
interleaved between the two in blocks of ten calls:

1. governed write-back: ``MsmMem.ask`` (consent, STM, retrieval, backbone, gate, encryption,
   semantic and claim supersession, audit; one transaction) on a new study of a patient, its
   answer written back: median and 95th percentile ms;
2. retrieval of a patient's stored study (``retrieve(image_study=...)``, patient scope: no
   encoding) and the same with ``scope="population"``: median and 95th percentile ms.

Then bytes per study: what every table grew by (heap, TOAST and indexes,
``pg_total_relation_size`` on the single server; the sum of its shards' sizes, ``citus_shards``,
on the cluster; both after ``VACUUM ANALYZE``) from the empty store to the end, over the
studies stored (ingested and asked), and the sizing of 1, 10 and
100 hospitals of ``--scale-studies`` studies each from that figure. A hospital is a tenant: all
of its rows are one shard group on one worker.

Usage: python benchmarks/bench_citus.py [--patients 20] [--studies 5] [--asks 200]
       [--retrieves 200] [--scale-studies 200000] [--tree .cluster/pgserver/pginstall]
(``--patients 2 --studies 1 --asks 4 --retrieves 4``: a run of seconds.)
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
from PIL import Image

from msm_mem import FixedClock, ManifestRow, MsmMem, Principal, Purpose, Role
from msm_mem.testing import FixedBackbone
from msm_mem.testing._citus import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
ADMIN = Principal("bench-admin", Role.ADMIN, Purpose.OPERATIONS)
SYSTEM = Principal("bench-ingest", Role.SYSTEM, Purpose.OPERATIONS)
AGENT = Principal("bench-agent", Role.AGENT, Purpose.TREATMENT)
SCHEMA = "msm_mem"
T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"
BLOCK = 10  # calls of one kind on one target before the other's turn
TABLES = "SELECT table_name FROM information_schema.columns WHERE table_schema = %s AND column_name = 'tenant'"


def _png(folder: Path, seed: int) -> Path:
    path = folder / f"img{seed}.png"
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8), mode="L").save(path)
    return path


def _store(work: Path, name: str, dsn: str, patients: int, studies: int) -> tuple[MsmMem, int]:
    """A new hospital's store with its studies ingested, and the bytes of its tables before."""
    mem = MsmMem.init(
        work / name,
        ADMIN,
        database_url=dsn,
        schema=SCHEMA,
        clock=FixedClock(T0),
        backbone=FixedBackbone("Right lower lobe opacity, stable", "no change"),
    )
    empty = _sizes(dsn, name == "citus")
    rows = [
        ManifestRow(f"P{p}", f"S{p}-{s}", T0 - 86400 * (s + 1), str(_png(work, p * studies + s)), QUESTION, "effusion")
        for p in range(patients)
        for s in range(studies)
    ]
    mem.ingest(SYSTEM, rows)
    return mem, empty


def _timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000


def _run(
    mems: dict[str, MsmMem], make: Callable[[MsmMem, int], Callable[[], object]], calls: int
) -> dict[str, list[float]]:
    """Each target's milliseconds per call, the targets taking turns in blocks of ``BLOCK``."""
    out: dict[str, list[float]] = {name: [] for name in mems}
    for start in range(0, calls, BLOCK):
        for name, mem in mems.items():
            out[name] += [_timed(make(mem, i)) for i in range(start, min(start + BLOCK, calls))]
    return out


def _cell(ms: list[float]) -> str:
    p95 = float(np.percentile(ms, 95))
    return f"{statistics.median(ms):,.1f} ({p95:,.1f})"


def _sizes(dsn: str, distributed: bool) -> int:
    """Bytes of every table of the store's schema (all of its shards on a cluster)."""
    total = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [str(r[0]) for r in conn.execute(TABLES, (SCHEMA,)).fetchall()]
        for table in tables:
            conn.execute(f"VACUUM ANALYZE {SCHEMA}.{table}".encode())
            if distributed:
                row = conn.execute(
                    "SELECT COALESCE(sum(shard_size), 0) FROM citus_shards WHERE table_name = %s::regclass",
                    (f"{SCHEMA}.{table}",),
                ).fetchone()
            else:
                row = conn.execute("SELECT pg_total_relation_size(%s)", (f"{SCHEMA}.{table}",)).fetchone()
            total += int(row[0]) if row else 0
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patients", type=int, default=20)
    parser.add_argument("--studies", type=int, default=5)
    parser.add_argument("--asks", type=int, default=200)
    parser.add_argument("--retrieves", type=int, default=200)
    parser.add_argument("--scale-studies", type=int, default=200_000)
    parser.add_argument("--tree", type=Path, default=ROOT / ".cluster" / "pgserver" / "pginstall")
    args = parser.parse_args()
    if not (args.tree / "bin" / "pg_ctl").exists():
        raise SystemExit(f"no PostgreSQL tree with Citus at {args.tree}: run `make cluster-build`")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with (
            LocalCluster(args.tree, work / "single", workers=0, citus=False) as single,
            LocalCluster(args.tree, work / "cluster", workers=2) as cluster,
        ):
            targets = {"single": single.dsn(), "citus": cluster.dsn()}
            made = {name: _store(work, name, dsn, args.patients, args.studies) for name, dsn in targets.items()}
            mems = {name: mem for name, (mem, _) in made.items()}
            images = [np.random.default_rng(10_000 + i).random((64, 64), dtype=np.float32) for i in range(args.asks)]

            def ask(mem: MsmMem, i: int) -> Callable[[], object]:
                p = i % args.patients
                return lambda: mem.ask(AGENT, f"P{p}", images[i], QUESTION, study_id=f"ACC-{i}")

            def retrieve(scope: str) -> Callable[[MsmMem, int], Callable[[], object]]:
                def make(mem: MsmMem, i: int) -> Callable[[], object]:
                    p, s = i % args.patients, (i // args.patients) % args.studies
                    return lambda: mem.retrieve(AGENT, f"P{p}", image_study=f"S{p}-{s}", scope=scope)  # type: ignore[arg-type]

                return make

            rows = {
                "governed write-back (ask, answer written back)": _run(mems, ask, args.asks),
                "retrieve a stored study, patient scope": _run(mems, retrieve("patient"), args.retrieves),
                "retrieve a stored study, population scope": _run(mems, retrieve("population"), args.retrieves),
            }
            for mem in mems.values():
                mem.close()
            studies = args.patients * args.studies + args.asks
            per_study = {
                name: (_sizes(dsn, name == "citus") - made[name][1]) / studies for name, dsn in targets.items()
            }

    print(f"one hospital: {args.patients} patients x {args.studies} studies ingested, {args.asks} asks")
    print("single: one PostgreSQL 16.2 server; citus: Citus 13.2.2, a coordinator and 2 workers; same machine\n")
    print("| operation | calls | single PostgreSQL, median (p95) ms | Citus, median (p95) ms | Citus / single |")
    print("|---|---|---|---|---|")
    for label, ms in rows.items():
        ratio = statistics.median(ms["citus"]) / statistics.median(ms["single"])
        print(f"| {label} | {len(ms['single'])} | {_cell(ms['single'])} | {_cell(ms['citus'])} | {ratio:.2f}x |")
    print(f"\nbytes per study ({studies} studies stored, 1024-d vectors, exact search: no HNSW index)\n")
    print("| store | bytes per study |")
    print("|---|---|")
    for name, size in per_study.items():
        print(f"| {name} | {size:,.0f} |")
    per = per_study["citus"]
    print(f"\nsizing from the cluster's figure, {args.scale_studies:,} studies a hospital\n")
    print("| hospitals | studies | size | per worker, 2 workers (a hospital is on one) |")
    print("|---|---|---|---|")
    for hospitals in (1, 10, 100):
        total = per * args.scale_studies * hospitals
        one = per * args.scale_studies
        print(
            f"| {hospitals} | {hospitals * args.scale_studies:,} | {total / 2**30:,.1f} GiB | "
            f"{max(one, total / 2) / 2**30:,.1f} GiB or more |"
        )


if __name__ == "__main__":
    main()
