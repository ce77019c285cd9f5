"""The governed store on one PostgreSQL server and on Citus clusters on the same machine, side
by side in one run. Prints Markdown tables; every figure is measured in this run.

All are started here from the tree ``make cluster-build`` makes (PostgreSQL 16.2 with pgvector
0.8.6, and Citus 13.2.2): the single server, a coordinator with one worker and a coordinator
with two workers (Citus's default of 32 shards a table), all on 127.0.0.1 with the same
settings (``synchronous_commit`` on, ``fsync`` off). On each, one hospital (tenant) is made
with ``MsmMem.init --database-url`` (on a coordinator the store distributes itself),
``--patients`` x ``--studies`` synthetic studies are ingested, then, interleaved between the
three in blocks of ten calls:

1. governed write-back: ``MsmMem.ask`` (consent, STM, retrieval, backbone, gate, encryption,
   semantic and claim supersession, audit; one transaction) on a new study of a patient, its
   answer written back: median and 95th percentile ms;
2. retrieval of a patient's stored study (``retrieve(image_study=...)``, patient scope: no
   encoding) and the same with ``scope="population"``: median and 95th percentile ms.

3. HNSW population search over shared shards: on the cluster, a hospital of ``--recall-rows``
   1024-d episodes and a tenth as many for a second hospital, both of patients ``P0`` to
   ``P49`` (so every shard holds rows of both), ``population_search="hnsw"`` (the index
   built after the rows are in); for
   ``--queries`` queries near the small hospital's rows (a stored vector plus noise), its
   population search's recall@10 against the exact top 10 (numpy over its vectors) and median
   ms, with pgvector 0.8's ``hnsw.iterative_scan`` on (the store's setting) and off: through
   the store (the worker's planner picks the HNSW index or the tenant's btree, which is exact),
   and the same query with ``enable_sort = off``, which makes the worker scan the index as it
   does for a hospital too large to sort its rows; the worker's plan of each (``EXPLAIN``).

4. concurrent governed write-back of one hospital: ``--writers`` processes (as ``msm-mem serve
   --workers`` runs), each with its own handle, each asking ``--concurrent-asks`` times about
   patients of its own, all started together (and the same with ``--concurrent-reads``
   audited reads of a patient's episodes: each a commit of one audit event, a write that is
   mostly the lock's), on a hospital made with one audit chain (its writers queue on one lock)
   and with ``--lanes`` (``init(audit_chains=...)``: a lock, chain and row digests per patient
   lane), the two taking turns ``--rounds`` times, on the single server and on the two-worker
   cluster: calls a second (median of the rounds, and their range), median and 95th
   percentile ms of a call under that load, and that the audit verifies after.

Then bytes per study: what every table grows by (heap, TOAST and indexes,
``pg_total_relation_size`` on the single server; the sum of its shards' sizes, ``citus_shards``,
on the cluster; both after ``VACUUM ANALYZE``) while a second hospital of 100 patients goes
from ``--size-base`` to ``--size-base`` + ``--size-studies`` ingested studies, over those
studies, and the sizing of 1, 10 and 100 hospitals of ``--scale-studies`` studies each from
that figure. A hospital's patients are spread over every shard; its ``meta`` row, audit chain
and pseudonyms are on one.

Usage: python benchmarks/bench_citus.py [--patients 20] [--studies 5] [--asks 200]
       [--retrieves 200] [--recall-rows 10000] [--queries 50] [--size-base 500]
       [--size-studies 1000] [--scale-studies 200000] [--writers 4] [--concurrent-asks 40]
       [--concurrent-reads 150] [--lanes 8] [--rounds 3] [--tree .cluster/pgserver/pginstall]
(``--patients 2 --studies 1 --asks 4 --retrieves 4 --recall-rows 200 --queries 4
--size-base 20 --size-studies 20 --writers 2 --concurrent-asks 2 --concurrent-reads 2
--rounds 1``: a run of a minute.)
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from PIL import Image

from msm_mem import EpisodicRecord, FixedClock, ManifestRow, MsmMem, Principal, Purpose, Role, Settings
from msm_mem._storage.base import WriteBatch
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


def _store(work: Path, name: str, dsn: str, patients: int, studies: int) -> MsmMem:
    """A new hospital's store with its studies ingested."""
    mem = MsmMem.init(
        work / name,
        ADMIN,
        database_url=dsn,
        schema=SCHEMA,
        clock=FixedClock(T0),
        backbone=FixedBackbone("Right lower lobe opacity, stable", "no change"),
    )
    rows = [
        ManifestRow(f"P{p}", f"S{p}-{s}", T0 - 86400 * (s + 1), str(_png(work, p * studies + s)), QUESTION, "effusion")
        for p in range(patients)
        for s in range(studies)
    ]
    mem.ingest(SYSTEM, rows)
    return mem


def _growth(work: Path, name: str, dsn: str, base: int, more: int) -> float:
    """Bytes per study that the tables grow by while a second hospital (100 patients) goes from
    ``base`` to ``base + more`` ingested studies: the marginal cost of a study, once every
    shard holds rows (a shard's first pages would count as a cost of the first studies)."""
    mem = MsmMem.init(
        work / f"sizing-{name}",
        ADMIN,
        settings=Settings(tenant="sizing"),
        database_url=dsn,
        schema=SCHEMA,
        clock=FixedClock(T0),
        backbone=FixedBackbone("Right lower lobe opacity, stable", "no change"),
    )

    def rows(start: int, n: int) -> list[ManifestRow]:
        return [
            ManifestRow(
                f"Q{i % 100}", f"Z{i}", T0 - 3600 * (i + 1), str(_png(work, 1_000_000 + i)), QUESTION, "effusion"
            )
            for i in range(start, start + n)
        ]

    mem.ingest(SYSTEM, rows(0, base))
    before = _sizes(dsn, name != "single")
    mem.ingest(SYSTEM, rows(base, more))
    after = _sizes(dsn, name != "single")
    mem.close()
    return (after - before) / more


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


def _writer(directory: Path, w: int, calls: int, kind: str, ready: Any, out: Any) -> None:
    """One writer process: its own handle, ``calls`` calls about its own five patients once every
    writer is ready, each a governed write: an ask written back (``kind`` "ask") or an audited
    read of a patient's episodes ("read": a commit of one audit event). Puts ``(ms of each call,
    error or "")`` on ``out``."""
    backbone = FixedBackbone("Right lower lobe opacity, stable", "no change")
    ms: list[float] = []
    try:
        with MsmMem.open(directory, clock=FixedClock(T0), backbone=backbone) as mem:
            images = [
                np.random.default_rng(20_000 + w * calls + i).random((64, 64), dtype=np.float32) for i in range(calls)
            ]
            ready.wait()
            for i, image in enumerate(images):
                start = time.perf_counter()
                if kind == "ask":
                    mem.ask(AGENT, f"W{w}-{i % 5}", image, QUESTION, study_id=f"C{w}-{i}")
                else:
                    mem.episodes(AGENT, f"W{w}-{i % 5}")
                ms.append((time.perf_counter() - start) * 1000)
    except Exception as exc:  # noqa: BLE001 - reported by the parent: a failed write voids the figure
        out.put((ms, repr(exc)))
        return
    out.put((ms, ""))


def _concurrent(
    directory: Path, dsn: str, lanes: int, writers: int, calls: int, kind: str
) -> tuple[float, list[float], bool]:
    """``writers`` processes, a handle each, making ``calls`` calls of ``kind`` about patients of
    their own on a new hospital of ``lanes`` audit chains in ``directory``: (calls a second, ms
    of each call, audit verified after)."""
    backbone = FixedBackbone("Right lower lobe opacity, stable", "no change")
    options: dict[str, Any] = {"database_url": dsn, "schema": SCHEMA, "audit_chains": lanes}
    settings = Settings(tenant=directory.name)
    MsmMem.init(directory, ADMIN, settings=settings, clock=FixedClock(T0), backbone=backbone, **options).close()
    context = multiprocessing.get_context("fork")
    ready, out = context.Barrier(writers + 1), context.Queue()
    processes = [context.Process(target=_writer, args=(directory, w, calls, kind, ready, out)) for w in range(writers)]
    for process in processes:
        process.start()
    ready.wait()
    start = time.perf_counter()
    results = [out.get() for _ in processes]
    seconds = time.perf_counter() - start
    for process in processes:
        process.join()
    failed = [error for _, error in results if error]
    if failed:
        raise RuntimeError(f"a concurrent {kind} failed on {directory.name}: {failed[0]}")
    with MsmMem.open(directory, clock=FixedClock(T0), backbone=backbone) as mem:
        verified = mem.verify_audit(ADMIN).ok
    return writers * calls / seconds, [x for ms, _ in results for x in ms], verified


def _lanes_side_by_side(
    work: Path, targets: dict[str, str], lanes: int, writers: int, calls: dict[str, int], rounds: int
) -> dict[tuple[str, str, int], tuple[list[float], list[float], bool]]:
    """:func:`_concurrent` of one lane and of ``lanes``, taking turns ``rounds`` times on each
    target and kind: ``(target, kind, lanes) -> (calls a second of each round, ms, verified)``."""
    out: dict[tuple[str, str, int], tuple[list[float], list[float], bool]] = {}
    for name, dsn in targets.items():
        for kind, n in calls.items():
            for r in range(rounds):
                for count in (1, lanes):
                    rate, ms, verified = _concurrent(work / f"{kind}-{name}-{count}-{r}", dsn, count, writers, n, kind)
                    rates, times, ok = out.get((name, kind, count), ([], [], True))
                    out[(name, kind, count)] = ([*rates, rate], [*times, *ms], ok and verified)
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


def _hospital(work: Path, dsn: str, tenant: str, rows: int, seed: int) -> np.ndarray:
    """A hospital of ``rows`` episodes with random unit vectors, written in bulk; its vectors."""
    mem = MsmMem.init(work / tenant, ADMIN, settings=Settings(tenant=tenant), database_url=dsn, schema="recall")
    z = np.random.default_rng(seed).standard_normal((rows, mem.dim), dtype=np.float32)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    for start in range(0, rows, 1000):
        batch = [
            EpisodicRecord(f"E-{i}", f"P{i % 50}", T0 + i, z[i], QUESTION, "effusion", study_id=f"S{i}")
            for i in range(start, min(start + 1000, rows))
        ]
        mem._store.write(WriteBatch(episodes=batch))
    mem.close()
    return z


#: the store's HNSW population search (``_storage/postgres/search.py``), with text parameters
_HNSW_QUERY = (
    "SELECT id FROM recall.episodic WHERE state IN ('active', 'anonymized') AND tenant = %(t)s"
    " ORDER BY z <#> %(q)s::vector LIMIT 10"
)


def _settings(conn: psycopg.Connection[Any], iterative: bool, forced: bool) -> None:
    """The search's ``SET LOCAL`` settings, passed on to the worker by the coordinator."""
    conn.execute("SET LOCAL citus.propagate_set_commands TO 'local'")
    conn.execute("SET LOCAL hnsw.ef_search = 40")
    conn.execute(f"SET LOCAL hnsw.iterative_scan = {'relaxed_order' if iterative else 'off'}")
    if forced:  # the worker plans on the index, as for a hospital too large to sort its rows
        conn.execute("SET LOCAL enable_sort = off")


def _plan(dsn: str, tenant: str, q: np.ndarray, iterative: bool, forced: bool) -> str:
    """How the worker plans the search: on the HNSW index, or on the tenant's btree (exact)."""
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        _settings(conn, iterative, forced)
        # bound on the client: Citus cannot get a worker's plan of a statement with parameters here
        cur = psycopg.ClientCursor(conn).execute("EXPLAIN " + _HNSW_QUERY, _params(tenant, q))
        text = "\n".join(str(r[0]) for r in cur.fetchall())
    if "Scan" not in text.split("Task", 1)[-1]:
        raise RuntimeError(f"no worker plan: {text}")
    return "HNSW index" if "_hnsw" in text else "tenant btree, exact"


def _params(tenant: str, q: np.ndarray) -> dict[str, str]:
    return {"t": tenant, "q": "[" + ",".join(f"{x:.8g}" for x in q) + "]"}


def _recall(work: Path, dsn: str, rows: int, queries: int) -> list[tuple[str, str, float, float, str]]:
    """(path, iterative scan, recall@10, median ms, worker's plan) of the small hospital's HNSW
    population search: through the store (the planner's choice), and the same query with the
    index forced."""
    _hospital(work, dsn, "big", rows, 1)
    small = "small"
    z = _hospital(work, dsn, small, max(rows // 10, 20), 2)
    rng = np.random.default_rng(3)
    near = z[rng.integers(0, len(z), queries)] + 0.05 * rng.standard_normal((queries, z.shape[1]), dtype=np.float32)
    near /= np.linalg.norm(near, axis=1, keepdims=True)
    truth = [set(np.argsort(-(z @ q))[:10].tolist()) for q in near]
    mem = MsmMem.open(work / small, settings=Settings(tenant=small, population_search="hnsw"))  # builds the index
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE recall.episodic")
    store = mem._store
    out = []
    for forced in (False, True):
        for iterative in (True, False):
            found, ms = 0, []
            if not forced:
                store._vectors.iterative = iterative  # type: ignore[attr-defined]
            with psycopg.connect(dsn, autocommit=True) as conn:
                for q, best in zip(near, truth, strict=True):
                    start = time.perf_counter()
                    if forced:
                        with conn.transaction():
                            _settings(conn, iterative, forced)
                            ids = [str(r[0]) for r in conn.execute(_HNSW_QUERY, _params(small, q)).fetchall()]
                    else:
                        ids = [i for i, _ in store.search("episodic", q, 10, None)]
                    ms.append((time.perf_counter() - start) * 1000)
                    found += len(best & {int(i.removeprefix("E-")) for i in ids})
            path = "its query, the index forced (enable_sort off)" if forced else "the store's search"
            plan = _plan(dsn, small, near[0], iterative, forced)
            out.append((path, "on" if iterative else "off", found / (10 * queries), statistics.median(ms), plan))
    mem.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patients", type=int, default=20)
    parser.add_argument("--studies", type=int, default=5)
    parser.add_argument("--asks", type=int, default=200)
    parser.add_argument("--retrieves", type=int, default=200)
    parser.add_argument("--recall-rows", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=50)
    parser.add_argument("--size-base", type=int, default=500)
    parser.add_argument("--size-studies", type=int, default=1000)
    parser.add_argument("--scale-studies", type=int, default=200_000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--concurrent-asks", type=int, default=40)
    parser.add_argument("--concurrent-reads", type=int, default=150)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, default=ROOT / ".cluster" / "pgserver" / "pginstall")
    args = parser.parse_args()
    if not (args.tree / "bin" / "pg_ctl").exists():
        raise SystemExit(f"no PostgreSQL tree with Citus at {args.tree}: run `make cluster-build`")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with (
            LocalCluster(args.tree, work / "single", workers=0, citus=False) as single,
            LocalCluster(args.tree, work / "one-worker", workers=1) as one_worker,
            LocalCluster(args.tree, work / "cluster", workers=2) as cluster,
        ):
            targets = {"single": single.dsn(), "citus": cluster.dsn()}
            timed = {**targets, "citus-1": one_worker.dsn()}
            mems = {name: _store(work, name, dsn, args.patients, args.studies) for name, dsn in timed.items()}
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
            per_study = {
                name: _growth(work, name, dsn, args.size_base, args.size_studies) for name, dsn in targets.items()
            }
            recall = _recall(work, cluster.dsn(), args.recall_rows, args.queries)
            calls = {"ask": args.concurrent_asks, "read": args.concurrent_reads}
            concurrent = _lanes_side_by_side(work, targets, args.lanes, args.writers, calls, args.rounds)

    print(f"one hospital: {args.patients} patients x {args.studies} studies ingested, {args.asks} asks")
    print("single: one PostgreSQL 16.2 server; Citus 13.2.2: a coordinator and 1 or 2 workers; same machine\n")
    print(
        "| operation | calls | single PostgreSQL, median (p95) ms | Citus, 1 worker, median (p95) ms"
        " | Citus, 2 workers, median (p95) ms | 2 workers / single | 2 workers / 1 worker |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, ms in rows.items():
        two = statistics.median(ms["citus"])
        print(
            f"| {label} | {len(ms['single'])} | {_cell(ms['single'])} | {_cell(ms['citus-1'])} | {_cell(ms['citus'])}"
            f" | {two / statistics.median(ms['single']):.2f}x | {two / statistics.median(ms['citus-1']):.2f}x |"
        )
    small = max(args.recall_rows // 10, 20)
    print(
        f"\nHNSW population search of a hospital of {small:,} rows sharing its shards with one of {args.recall_rows:,}"
    )
    print(f"(1024-d, {args.queries} queries near its rows, k = 10, hnsw.ef_search = 40)\n")
    print("| search | iterative scan | recall@10 | median ms | worker's plan |")
    print("|---|---|---|---|---|")
    for path, iterative, r, median_ms, plan in recall:
        print(f"| {path} | {iterative} | {r:.3f} | {median_ms:,.1f} | {plan} |")
    print(
        f"\nbytes per study (a hospital of 100 patients from {args.size_base:,} to"
        f" {args.size_base + args.size_studies:,} ingested studies, 1024-d vectors, exact search: no HNSW index)\n"
    )
    print("| store | bytes per study |")
    print("|---|---|")
    for name, size in per_study.items():
        print(f"| {name} | {size:,.0f} |")
    print(
        f"\nconcurrent governed writes of one hospital: {args.writers} writer processes, a handle each, about"
        f" patients of their own; one audit chain and {args.lanes} lanes taking turns, {args.rounds} rounds each\n"
    )
    print(
        "| store | writes | audit chains (lanes) | calls a second, median of rounds (range)"
        " | median (p95) ms a call | audit verifies |"
    )
    print("|---|---|---|---|---|---|")
    kinds = {
        "ask": f"ask written back, {args.concurrent_asks} each",
        "read": f"audited read, {args.concurrent_reads} each",
    }
    for (name, kind, lanes), (rates, times, verified) in concurrent.items():
        label = "single PostgreSQL" if name == "single" else "Citus, 2 workers"
        spread = f"{statistics.median(rates):,.1f} ({min(rates):,.1f} to {max(rates):,.1f})"
        print(f"| {label} | {kinds[kind]} | {lanes} | {spread} | {_cell(times)} | {'yes' if verified else 'NO'} |")
    for name in targets:
        for kind in calls:
            ratio = statistics.median(concurrent[(name, kind, args.lanes)][0]) / statistics.median(
                concurrent[(name, kind, 1)][0]
            )
            print(f"\n{name}, {kind}: {args.lanes} lanes / 1 lane, calls a second: {ratio:.2f}x")
    per = per_study["citus"]
    print(f"\nsizing from the cluster's figure, {args.scale_studies:,} studies a hospital\n")
    print("| hospitals | studies | size | per worker, 2 workers | workers of 1 TiB |")
    print("|---|---|---|---|---|")
    for hospitals in (1, 10, 100):
        total = per * args.scale_studies * hospitals
        print(
            f"| {hospitals} | {hospitals * args.scale_studies:,} | {total / 2**30:,.1f} GiB | "
            f"{total / 2 / 2**30:,.1f} GiB | {max(1, math.ceil(total / 2**40))} |"
        )


if __name__ == "__main__":
    main()
