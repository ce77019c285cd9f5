"""msm-mem beside the vector stores an engineer would pick instead, on the same data.

For each data set and size N it writes one data set (N x 1024 unit float32 vectors, a patient
label per row, 10 rows per patient, queries), then builds every system from it and queries it,
one system at a time, each phase in its own process (build; then open + queries, so that
resident memory is what an opened store holds). Every system gets the same rows, the same
queries and the same k:

- patient-scoped exact top-5 (a random patient per query, the query a new sample of that
  patient): numpy over the patient's rows is the limit and the truth for recall@5;
- population top-10 (every row): FAISS flat is the exact limit and the truth for recall@10;
  (the truths are computed once per data set, before any system runs, by ``faiss.knn`` and
  numpy); every approximate system's search knob is raised, on 200 separate tuning queries, until
  recall@10 >= 0.95 (the first value that reaches it is kept; "not reached" otherwise);
- build (insert) throughput, rows/s, and index builds apart; bytes on disk per row; resident
  memory per row (growth of the query process's RSS from before open to after the queries;
  a PostgreSQL server's memory is not in it).

Latencies are medians and 95th percentiles over ``--queries`` (default 1,000) queries, one per
call, after ``--warmup`` (default 100) warm-up queries that are not counted.

Data sets (``--data``):

- ``random``: isotropic random unit vectors (the worst case for approximate search);
- ``cxr``: realistic vectors: the ``pixels`` encoder's embeddings of the shared chest X-rays
  (``../shared/data/covid-cxr/images``; rows 0..M-1 are those real embeddings), augmented up to
  N by a clustered generator: patient p has a centre at cosine ~0.9 from real image p mod M, its
  rows and queries at cosine ~0.9 from that centre. Skipped with a message when the images are
  absent.

msm-mem is measured through its public, audited ``MsmMem.retrieve`` and, apart, through its
internals (the store's search, the memory core's retrieve: private imports, see
``_peers_msm.py``).

Usage (in an environment with the ``peers``, ``postgres`` and ``plots`` extras; numpy,
faiss-flat, msm-mem and msm-mem-hnsw need none of them):

    python benchmarks/bench_peers.py [--sizes 10000 100000 1000000] [--data random cxr]
        [--systems ...] [--cap SYSTEM=N ...] [--workdir DIR] [--out DIR]

(``--sizes 2000 --data random --systems numpy faiss-flat msm-mem --queries 20 --warmup 2``:
a run of seconds.)

Systems whose build would take hours at the largest sizes are capped (``CAPS``; the reason is
printed); ``--cap NAME=0`` lifts a cap. Prints Markdown tables; ``--out`` also gets
``peers.json`` and ``bench_peers.png`` (each cost against N).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _peers_data import CXR_DIR, PATIENT_K, POPULATION_K, TARGET_RECALL, cxr_embeddings, make_data, make_truth
from _peers_msm import SEED, MsmMemHnsw, MsmMemSystem
from _peers_report import merge, plot, print_tables
from _peers_stores import Chroma, Lance, Pgvector, pg_stop
from _peers_systems import FaissFlat, FaissHnsw, Hnswlib, NumpyLimit, System
from _peers_timing import paired, recall, rss_bytes, stats, timed

SYSTEMS: dict[str, type[System]] = {
    s.name: s for s in (NumpyLimit, FaissFlat, MsmMemSystem, MsmMemHnsw, FaissHnsw, Hnswlib, Chroma, Lance, Pgvector)
}
#: largest N each system (or its population index) is built at by default, and why
CAPS: dict[str, tuple[int, str]] = {
    "chroma": (100_000, "Chroma inserts a few hundred 1024-d rows/s here: 1M rows would take about an hour"),
    "faiss-hnsw": (100_000, "an HNSW build of 1M 1024-d rows takes about half an hour on 2 cores"),
    "hnswlib": (100_000, "an HNSW build of 1M 1024-d rows takes about half an hour on 2 cores"),
    "msm-mem-hnsw": (100_000, "an HNSW build of 1M 1024-d rows (E and V) takes about an hour on 2 cores"),
    "pgvector/population": (100_000, "pgvector's HNSW build of 1M 1024-d rows takes hours on 2 cores"),
    "lancedb/population": (100_000, "the IVF_PQ build (k-means over 1M rows) takes tens of minutes on 2 cores"),
}


# children --------------------------------------------------------------------------------


def child_build(system: System, data: Path, d: Path) -> dict[str, Any]:
    x = np.load(data / "x.npy", mmap_mode="r")  # read as each system copies it in: one copy in memory
    patients = np.load(data / "patients.npy")
    t0 = time.perf_counter()
    extra = system.build(d, x, patients)
    build_s = extra.pop("build_s", time.perf_counter() - t0)  # a system may time its writes alone
    return {"build_s": build_s, "build_rows_per_s": len(x) / build_s, **extra}


def child_query(
    system: System, data: Path, d: Path, warmup: int, population: bool, exact_queries: int | None
) -> dict[str, Any]:
    pq, pp, popq = np.load(data / "pq.npy"), np.load(data / "pp.npy"), np.load(data / "popq.npy")
    n = len(np.load(data / "patients.npy", mmap_mode="r"))
    truth_p = np.load(data / "truth_patient.npy") if (data / "truth_patient.npy").exists() else None
    truth_pop = np.load(data / "truth_pop.npy") if (data / "truth_pop.npy").exists() else None
    queries = len(pq)
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    system.open(d)
    out: dict[str, Any] = {"open_s": time.perf_counter() - t0, "patient": [], "population": []}
    args = [(pq[i], int(pp[i]), PATIENT_K) for i in range(queries)]
    for label, query, extra in system.patient_variants(d):
        limit = getattr(system, "patient_limit", lambda: None)()
        pair = None
        if limit is not None and label.endswith("` E"):  # the limit reads one memory, as this does
            times, got, pair = paired(query, limit, args, warmup)
            pair["limit"] = "numpy"
        else:
            times, got = timed(query, args, warmup)
        row = {"label": label, **stats(times), **extra, **({"paired": pair} if pair else {})}
        if truth_p is None and system.name == "numpy":
            np.save(data / "truth_patient.npy", np.array(got))
        elif truth_p is not None:
            row["recall"] = recall(got, truth_p)
        out["patient"].append(row)
    main = system.population() if population else None
    if main is not None:
        out["prepare"] = system.prepare_population(d)
        chosen = None
        if system.knob is not None and truth_pop is not None:
            tune = [(popq[i], POPULATION_K) for i in range(queries, len(popq))]
            for value in system.knob_values:
                system.set_knob(value)
                _, got = timed(main, tune, 0)
                chosen = value
                if recall(got, truth_pop[queries:]) >= TARGET_RECALL:
                    break
        args_pop = [(popq[i], POPULATION_K) for i in range(queries)]
        args_exact, warmup_exact = args_pop, warmup
        if exact_queries is not None and exact_queries < queries:  # a full scan a query: fewer
            args_exact, warmup_exact = args_pop[:exact_queries], min(warmup, max(1, exact_queries // 10))
        if system.knob is None:
            args_pop, warmup = args_exact, warmup_exact
        limit = getattr(system, "population_limit", lambda: None)()
        pair = None
        if limit is not None:
            times, got, pair = paired(main, limit, args_pop, warmup)
            pair["limit"] = "its graph searched directly" if system.knob else "numpy"
        else:
            times, got = timed(main, args_pop, warmup)
        if system.knob is not None and truth_pop is not None and chosen is not None:
            # tuned on other queries: where the measured ones fall short, the next value is measured
            later = [v for v in system.knob_values if v > chosen]
            while later and recall(got, truth_pop[:queries]) < TARGET_RECALL:
                chosen = later.pop(0)
                system.set_knob(chosen)
                if limit is not None:
                    times, got, pair = paired(main, limit, args_pop, warmup)
                    pair["limit"] = "its graph searched directly"
                else:
                    times, got = timed(main, args_pop, warmup)
        row = {"label": system.name, "knob": system.knob, "value": chosen, **stats(times)}
        if pair:
            row["paired"] = pair
        if truth_pop is None and system.name == "faiss-flat":
            full = [main(popq[i], POPULATION_K) for i in range(queries, len(popq))]
            np.save(data / "truth_pop.npy", np.array(got + full))
        elif truth_pop is not None:
            row["recall"] = recall(got, truth_pop[: len(got)])
        row["queries"] = len(got)
        out["population"].append(row)
        for label, query in getattr(system, "population_extras", lambda: iter(()))():
            times, _ = timed(query, args_exact, warmup_exact)
            out["population"].append({"label": label, **stats(times), "queries": len(times)})
    out["resident_bytes"] = rss_bytes() - rss0
    out["disk_bytes"] = system.disk_bytes(d)
    out["per_row"] = {"resident": out["resident_bytes"] / n, "disk": out["disk_bytes"] / n}
    out["versions"] = system.versions()
    system.close()
    return out


def child_main(args: argparse.Namespace) -> None:
    system = SYSTEMS[args.system]()
    if args.child == "build":
        result = child_build(system, args.data_dir, args.dir)
    else:
        result = child_query(system, args.data_dir, args.dir, args.warmup, not args.no_population, args.exact_queries)
    args.result.write_text(json.dumps(result))


# the run ---------------------------------------------------------------------------------


#: the variables that set the thread pools of BLAS, OpenMP (FAISS) and the Rust runtimes
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "RAYON_NUM_THREADS",
    "TOKIO_WORKER_THREADS",
)


def run_child(
    phase: str,
    name: str,
    data: Path,
    d: Path,
    warmup: int,
    population: bool,
    threads: int | None = None,
    exact_queries: int | None = None,
) -> dict[str, Any]:
    result = d.parent / f"{name}-{phase}.json"
    cmd = [sys.executable, __file__, "--child", phase, "--system", name, "--data-dir", str(data), "--dir", str(d)]
    cmd += ["--result", str(result), "--warmup", str(warmup)] + ([] if population else ["--no-population"])
    cmd += [] if exact_queries is None else ["--exact-queries", str(exact_queries)]
    env = dict(os.environ)
    if threads is not None:
        env.update({v: str(threads) for v in THREAD_VARIABLES})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} {phase} failed:\n{proc.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(result.read_text())
    return figures


def caps(overrides: list[str]) -> dict[str, tuple[int, str]]:
    out = dict(CAPS)
    for item in overrides:
        name, _, value = item.partition("=")
        if name not in out and name not in SYSTEMS:
            raise SystemExit(f"--cap {item}: unknown system {name!r}")
        limit = int(value)
        if limit <= 0:
            out.pop(name, None)
        else:
            out[name] = (limit, "capped on the command line")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--data", nargs="+", choices=["random", "cxr"], default=["random", "cxr"])
    ap.add_argument("--systems", nargs="+", choices=sorted(SYSTEMS), default=list(SYSTEMS))
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads of BLAS, OpenMP and the Rust runtimes in every system (default: each library's own)",
    )
    ap.add_argument(
        "--exact-queries",
        type=int,
        default=None,
        help="population queries measured on the exact systems and the governed population call "
        "(each a scan of every row; default: --queries)",
    )
    ap.add_argument("--build-threads", type=int, default=None, help="threads of the builds (default: --threads)")
    ap.add_argument(
        "--hnsw-from-exact",
        action="store_true",
        help="build msm-mem-hnsw by reopening msm-mem's directory with the HNSW setting (one graph "
        "build over every row, not the writes again)",
    )
    ap.add_argument("--patient-only", action="store_true", help="skip population search (and its indexes)")
    ap.add_argument("--cap", action="append", default=[], metavar="SYSTEM=N", help="cap a system at N rows (0: no cap)")
    ap.add_argument(
        "--workdir", type=Path, default=None, help="scratch folder, created if missing (default: a temp dir)"
    )
    ap.add_argument("--out", type=Path, default=None, help="folder for peers.json and bench_peers.png")
    ap.add_argument("--child", choices=["build", "query"], help=argparse.SUPPRESS)
    ap.add_argument("--system", help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--no-population", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--merge", type=Path, nargs="+", help="print (and --out: plot) these peers.json together")
    args = ap.parse_args()
    if args.child:
        return child_main(args)
    if args.merge:
        merged = merge(args.merge)
        print_tables(merged)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "peers.json").write_text(json.dumps(merged, indent=1))
            plot(merged, args.out / "bench_peers.png")
        return None
    limits = caps(args.cap)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=args.workdir))
    order = ["numpy", "faiss-flat"] + [s for s in SYSTEMS if s not in ("numpy", "faiss-flat")]
    names = [s for s in order if s in args.systems]
    real = cxr_embeddings() if "cxr" in args.data else None
    report: dict[str, Any] = {
        "threads": args.threads,
        "build_threads": args.build_threads,
        "machine": f"{platform.processor() or platform.machine()}, python {platform.python_version()}",
        "runs": [],
        "caps": {},
    }
    try:
        for kind in args.data:
            if kind == "cxr" and real is None:
                print(f"cxr data set skipped: {CXR_DIR} is absent", flush=True)
                continue
            for n in args.sizes:
                base = work / f"{kind}-{n}"
                info = make_data(kind, n, args.queries, base / "data", real)
                make_truth(base / "data")
                print(f"# {kind} N={n:,}: {info['description']}", flush=True)
                for name in names:
                    cap = limits.get(name)
                    if cap is not None and n > cap[0]:
                        report["caps"][name] = cap
                        print(f"  {name}: not built at N={n:,} ({cap[1]})", flush=True)
                        continue
                    pop_cap = limits.get(f"{name}/population")
                    population = (pop_cap is None or n <= pop_cap[0]) and not args.patient_only
                    if pop_cap is not None and n > pop_cap[0]:
                        report["caps"][f"{name}/population"] = pop_cap
                        print(f"  {name}: population index not built at N={n:,} ({pop_cap[1]})", flush=True)
                    d = base / name
                    try:
                        build_threads = args.threads if args.build_threads is None else args.build_threads
                        built = run_child("build", name, base / "data", d, args.warmup, population, build_threads)
                        queried = run_child(
                            "query", name, base / "data", d, args.warmup, population, args.threads, args.exact_queries
                        )
                    except RuntimeError as exc:
                        print(f"  {name}: FAILED: {exc}", flush=True)
                        continue
                    finally:
                        if name == "pgvector":
                            pg_stop(d)
                        if name == "msm-mem" and args.hnsw_from_exact and d.is_dir():
                            d.rename(base / SEED)
                        shutil.rmtree(d, ignore_errors=True)
                    run = {**info, "system": name, "notes": SYSTEMS[name].notes, "build": built, **queried}
                    report["runs"].append(run)
                    if args.out is not None:  # what is measured so far survives an interrupted run
                        args.out.mkdir(parents=True, exist_ok=True)
                        (args.out / "peers.json").write_text(json.dumps(report, indent=1))
                    print(
                        f"  {name}: built {built['build_rows_per_s']:,.0f} rows/s; "
                        + "; ".join(
                            f"{r['label']} {r['median_ms']:.3f} ms" + (f" r={r['recall']:.3f}" if "recall" in r else "")
                            for r in queried["patient"] + queried["population"]
                        ),
                        flush=True,
                    )
                shutil.rmtree(base / "data", ignore_errors=True)
                shutil.rmtree(base / SEED, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_tables(report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "peers.json").write_text(json.dumps(report, indent=1))
        plot(report, args.out / "bench_peers.png")


if __name__ == "__main__":
    main()
