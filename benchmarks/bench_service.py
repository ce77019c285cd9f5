"""Benchmark of the HTTP service: real ``msm-mem serve`` processes on loopback ports, loaded by
wrk (a standard HTTP load generator in C, Debian package ``wrk``), in interleaved rounds. Prints
Markdown tables and the library versions; every figure is measured in this run.

1. a store is made and a synthetic set ingested through the public API
   (``datasets.synthetic.generate``: ``--patients`` patients, 2 to 5 studies each), once per
   backend: the embedded store, and with ``--postgres`` a PostgreSQL server this script starts
   (``testing.local_server``); an API key (an agent, treatment, every patient) is created in it;
2. every run gets its own copy of that store (the directory; on PostgreSQL also the database,
   cloned with ``CREATE DATABASE ... TEMPLATE``), so runs do not see each other's writes;
3. a run: ``msm-mem serve`` (the package this interpreter imports) with ``--workers N``, a
   short warm-up, then wrk with C connections (each of ``--connections``; a closed loop: each
   sends its next request when its last is answered, so below the server's capacity latency is
   a request's own time, and once the server is saturated more connections only queue longer)
   for ``--seconds`` seconds, the studies in an order that interleaves the patients
   (``_loadgen.interleaved``); the operations (``--ops``): ``retrieve``, a study's PNG POSTed as
   multipart to ``/v1/patients/{id}/retrieve``; ``retrieve-study``, the same endpoint given the
   stored study's id (``image_study``, a urlencoded form: the server reads the patient's
   episodes to find the image, audited, then retrieves with it); ``ask``, the PNG with the
   question and ``write_back=true`` to ``/ask``; requests/s answered with a success, p50/p99
   latency from wrk, the answers refused (a status of 400 or more), and the CPU seconds the
   server's processes used per request (from ``/proc``: a figure a busy machine inflates less
   than latency), with the share of their main threads (the event loops: HTTP parsing, routing,
   form parsing, the credential check, sending the answer; the rest is the request's work in
   the thread pool), and the context switches of all their threads per request (a count, which
   a busy machine's speed changes less than it changes seconds);
4. ``--rounds`` rounds: each round runs every (store, server setting, workers, connections,
   operation), the order of the settings alternating between rounds; the tables give the
   median over rounds;
5. the service's overhead: one connection, one request at a time (wrk ``-c1``), against
   ``MsmMem.retrieve`` called in this process on the same store (one BLAS thread, as the
   server runs), in interleaved blocks; the ratio of the two medians.

``--threads`` measures the server once per ``serve --threads`` value, each a setting of its
own. The load generator runs on the same machine as the server and shares its cores (wrk is
light: one thread). A setting the server refuses is reported as refused. To compare two
versions of msm-mem, run the script in each checkout (with its own environment).

Usage:
    python benchmarks/bench_service.py [--patients 100] [--workers 1,2] [--connections 8,16]
        [--seconds 10] [--rounds 3] [--postgres [--no-embedded]]
        [--ops retrieve,retrieve-study,ask] [--threads 4,8,16]
(``--patients 2 --workers 1 --connections 1 --seconds 1 --rounds 1 --blocks 1 --ops retrieve``:
a run of seconds.) Needs wrk on the PATH (``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from _loadgen import LUA, OPS, context_switches, cpu_seconds, request_list, warm_up, wrk
from _service_report import report

from msm_mem import MsmMem, Principal, Purpose, Role
from msm_mem.datasets.synthetic import generate
from msm_mem.interfaces.auth.apikeys import ApiKeyStore

ADMIN = Principal("bench-admin", Role.ADMIN, Purpose.OPERATIONS)
INGEST = Principal("bench-ingest", Role.SYSTEM, Purpose.OPERATIONS)
AGENT = Principal("bench-agent", Role.AGENT, Purpose.TREATMENT)


@dataclass(frozen=True)
class Setting:
    """A server setting to measure: a name and its ``serve`` options."""

    name: str
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Base:
    """A built store of one backend: its directory, and on PostgreSQL the server and database."""

    name: str
    directory: Path
    dsn: str | None
    token: str


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(work: Path, name: str, patients: int, dsn: str | None) -> tuple[Base, list[tuple[str, str, str]]]:
    """A store with the synthetic set ingested and an API key; the (patient, image path, study id)
    of every study."""
    rows, _ = generate(work / "data", patients=patients, seed=0)
    directory = work / "base"
    url = None if dsn is None else _with_db(dsn, "bench_base")
    if dsn is not None:
        _psql(dsn, "CREATE DATABASE bench_base")
    with MsmMem.init(directory, ADMIN, database_url=url) as mem:
        mem.ingest(INGEST, rows)
    token, _ = ApiKeyStore.of_store(directory).create(AGENT, ["*"])
    return Base(name, directory, dsn, token), [(r.patient_id, r.image, r.study_id) for r in rows]


def _with_db(dsn: str, dbname: str) -> str:
    from psycopg.conninfo import make_conninfo

    return make_conninfo(dsn, dbname=dbname)


def _psql(dsn: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement.encode())


def copy_store(base: Base, work: Path, run: int) -> tuple[Path, str | None]:
    """A run's own copy of the base store (and of its database on PostgreSQL)."""
    directory = work / f"run{run}"
    shutil.copytree(base.directory, directory)
    if base.dsn is None:
        return directory, None
    _psql(base.dsn, f"CREATE DATABASE bench_run{run} TEMPLATE bench_base")
    return directory, _with_db(base.dsn, f"bench_run{run}")


def drop_copy(base: Base, directory: Path, run: int) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    if base.dsn is not None:
        _psql(base.dsn, f"DROP DATABASE IF EXISTS bench_run{run}")


def serve(
    directory: Path, dsn: str | None, workers: int, log: Path, extra: Sequence[str] = ()
) -> tuple[str, subprocess.Popen[bytes]]:
    """``msm-mem serve`` (with the options ``extra``); waits (bounded) until it is ready.
    RuntimeError when it exits."""
    port = free_port()
    cmd = [sys.executable, "-m", "msm_mem", "serve", str(directory), "--port", str(port)]
    cmd += ["--workers", str(workers), "--log-level", "warning", *extra]
    if dsn is not None:
        cmd += ["--database-url", dsn]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):  # at most about two minutes on a busy machine
        if process.poll() is not None:
            raise RuntimeError(log.read_text()[-300:].strip().splitlines()[-1])
        try:
            if httpx.get(url + "/ready", timeout=2.0).status_code == 200:
                return url, process
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop(process)
    raise RuntimeError("the server did not start")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def one_run(
    args: argparse.Namespace,
    setting: Setting,
    base: Base,
    workers: int,
    connections: int,
    listing: Path,
    work: Path,
    run: int,
) -> dict[str, float] | str:
    """One measured run; the reason when the server refused the setting."""
    directory, dsn = copy_store(base, work, run)
    try:
        try:
            url, process = serve(directory, dsn, workers, work / f"server{run}.log", setting.options)
        except RuntimeError as exc:
            return f"refused ({str(exc)[:80]})"
        try:
            warm_up(url, base.token, listing, args.script, connections, min(3.0, args.seconds))
            cpu0, loop0 = cpu_seconds(process.pid)
            switches0 = context_switches(process.pid)
            doc = wrk(url, base.token, listing, args.script, connections, args.seconds)
            cpu1, loop1 = cpu_seconds(process.pid)
            switches1 = context_switches(process.pid)
            doc["cpu_ms"] = (cpu1 - cpu0) * 1e3 / max(doc["requests"], 1)
            doc["loop_ms"] = (loop1 - loop0) * 1e3 / max(doc["requests"], 1)
            doc["switches"] = (switches1 - switches0) / max(doc["requests"], 1)
            return doc
        finally:
            stop(process)
    finally:
        drop_copy(base, directory, run)


def overhead(
    args: argparse.Namespace,
    setting: Setting,
    base: Base,
    studies: list[tuple[str, str, str]],
    listing: Path,
    work: Path,
    run: int,
) -> tuple[float, float]:
    """Median ms of one retrieve at a time over HTTP (wrk -c1, per-block p50) and of
    ``MsmMem.retrieve`` in this process on the same store, in interleaved blocks."""
    directory, dsn = copy_store(base, work, run)
    mem = MsmMem.open(directory, database_url=dsn)
    url, process = serve(directory, dsn, 1, work / f"server{run}.log", setting.options)
    http_ms: list[float] = []
    direct_ms: list[float] = []
    block_s = min(2.0, args.seconds)
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)  # as the server does (interfaces/http/serve.py): one BLAS thread
    try:
        warm_up(url, base.token, listing, args.script, max(args.connections), min(3.0, args.seconds))
        for b in range(args.blocks + 1):
            block = wrk(url, base.token, listing, args.script, 1, block_s)
            ms: list[float] = []
            end, i = time.perf_counter() + block_s, b * 997
            while time.perf_counter() < end:
                patient, path, _ = studies[i % len(studies)]
                t0 = time.perf_counter()
                mem.retrieve(AGENT, patient, path)
                ms.append((time.perf_counter() - t0) * 1e3)
                i += 1
            if b:  # the first block warms up
                http_ms.append(block["p50"])
                direct_ms.append(statistics.median(ms))
    finally:
        stop(process)
        mem.close()
        drop_copy(base, directory, run)
    return statistics.median(http_ms), statistics.median(direct_ms)


def _counts(text: str) -> list[int]:
    """A comma-separated list of positive counts (an argparse type)."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers separated by commas, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers separated by commas, got {text!r}")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patients", type=int, default=100)
    ap.add_argument("--workers", type=_counts, default="1,2", help="worker counts, comma-separated")
    ap.add_argument(
        "--connections", type=_counts, default="16", help="wrk's connection counts, comma-separated (default 16)"
    )
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=5, help="interleaved blocks of the overhead measure")
    ap.add_argument("--ops", default="retrieve,retrieve-study,ask", help=f"of {', '.join(OPS)}, comma-separated")
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--no-embedded", action="store_true", help="with --postgres: PostgreSQL only")
    ap.add_argument(
        "--threads",
        type=_counts,
        default=None,
        help="`serve --threads` values, comma-separated, each measured as a setting of its own "
        "(default: the server's default)",
    )
    args = ap.parse_args()
    if args.patients < 1 or args.rounds < 1 or args.blocks < 1 or not args.seconds > 0:
        ap.error("--patients, --rounds and --blocks: at least 1; --seconds: above 0")
    if args.no_embedded and not args.postgres:
        sys.exit("--no-embedded needs --postgres")
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (Debian: apt-get install wrk)")
    settings = [Setting("default")]
    if args.threads:
        settings = [Setting(f"{t} threads", ("--threads", str(t))) for t in args.threads]
    workers = args.workers
    ops = args.ops.split(",")
    if not set(ops) <= set(OPS):
        sys.exit(f"--ops: choose from {', '.join(OPS)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        args.script = work / "load.lua"
        args.script.write_text(LUA)
        stores: list[tuple[Base, list[tuple[str, str, str]]]] = []
        if not args.no_embedded:
            stores.append(build(work / "embedded", "embedded (SQLite)", args.patients, None))
        if args.postgres:
            from msm_mem.testing import local_server

            dsn = local_server(work / "pg", delete_at_exit=True)
            stores.append(build(work / "postgres", "PostgreSQL", args.patients, dsn))
        listed = sorted({*ops, "retrieve"})  # the overhead measure posts uploads
        listings = {
            (b.name, op): request_list(b.directory.parent, studies, op) for b, studies in stores for op in listed
        }
        results: dict[tuple[str, str, int, int, str], list[dict[str, float] | str]] = {}
        loads: list[float] = []
        run = 0
        for r in range(args.rounds):
            order = settings if r % 2 == 0 else settings[::-1]
            for base, _ in stores:
                for w, c, op in itertools.product(workers, args.connections, ops):
                    for setting in order:
                        run += 1
                        loads.append(os.getloadavg()[0])
                        listing = listings[(base.name, op)]
                        got = one_run(args, setting, base, w, c, listing, base.directory.parent, run)
                        results.setdefault((base.name, setting.name, w, c, op), []).append(got)
                        print(
                            f"round {r + 1} {base.name} {setting.name} workers={w} c={c} {op}: {got}", file=sys.stderr
                        )
        over = {}
        for base, studies in stores:
            for setting in settings:
                run += 1
                over[(base.name, setting.name)] = overhead(
                    args, setting, base, studies, listings[(base.name, "retrieve")], base.directory.parent, run
                )
        for base, _ in stores:
            if base.dsn is not None:
                _psql(base.dsn, "DROP DATABASE IF EXISTS bench_base")
    report(args, results, over, loads)


if __name__ == "__main__":
    main()
