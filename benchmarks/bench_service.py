"""Benchmark of the HTTP service (issue 15): a real ``msm-mem serve`` process on a loopback
port, loaded by a fixed number of concurrent clients. Prints a Markdown table and the library
versions; every figure is measured in this run.

1. a store is made and a synthetic set ingested (``datasets.synthetic.generate``: ``--patients``
   patients, 2 to 5 studies each); with ``--postgres`` the store of record is on PostgreSQL (a
   server this script starts with ``testing.local_server``);
2. an API key (an agent, treatment, every patient) is created and ``msm-mem serve`` started as
   its own process (one worker);
3. retrieve under load: ``--concurrency`` clients (asyncio tasks sharing one ``httpx`` client,
   a closed loop: each sends its next request when its last one is answered) POST
   ``/v1/patients/{id}/retrieve`` with a study's PNG, until ``--requests`` requests are
   answered or ``--seconds`` pass; requests/s and p50/p95/p99 latency;
4. ask with write-back under the same load (``--ask-requests``), the answer written back;
5. the service's overhead: one client, one request at a time, against ``MsmMem.retrieve``
   called in this process on the same store (a copy of it for the embedded store), in
   interleaved blocks; the ratio of the two medians.

The load generator runs on the same machine as the server and shares its cores.

Usage: python benchmarks/bench_service.py [--patients 100] [--concurrency 16] [--requests 5000]
       [--ask-requests 1000] [--seconds 30] [--blocks 10] [--postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import os
import platform
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from msm_mem import MsmMem, Principal
from msm_mem.datasets.synthetic import generate
from msm_mem.interfaces.http.apikeys import ApiKeyStore

ADMIN = Principal("bench-admin", "admin", "operations")
INGEST = Principal("bench-ingest", "system", "operations")
AGENT = Principal("bench-agent", "agent", "treatment")
QUESTION = "What is the impression?"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(work: Path, patients: int, database_url: str | None) -> tuple[Path, list[tuple[str, bytes, str]]]:
    """A store with the synthetic set ingested; the (patient, PNG bytes, path) of every study."""
    rows, _ = generate(work / "data", patients=patients, seed=0)
    directory = work / "store"
    kwargs = {} if database_url is None else {"database_url": database_url}
    with MsmMem.init(directory, ADMIN, **kwargs) as mem:  # type: ignore[arg-type]
        mem.ingest(INGEST, rows)
    studies = [(r.patient_id, Path(r.image).read_bytes(), r.image) for r in rows]
    return directory, studies


def serve(work: Path, directory: Path, database_url: str | None) -> tuple[str, subprocess.Popen[bytes], Path]:
    port = free_port()
    log = work / "server.log"
    cmd = [sys.executable, "-m", "msm_mem", "serve", str(directory), "--host", "127.0.0.1", "--port", str(port)]
    if database_url is not None:
        cmd += ["--database-url", database_url]
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):  # at most about a minute
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/ready", timeout=1.0).status_code == 200:
                return url, process, log
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop(process)
    raise RuntimeError(f"the server did not start: {log.read_text()[-2000:]}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


async def load(
    url: str, token: str, op: str, studies: list, concurrency: int, requests: int, seconds: float
) -> dict[str, float]:
    """A closed loop of ``concurrency`` clients until ``requests`` are answered or ``seconds`` pass."""
    latencies: list[float] = []
    errors = 0
    sent = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30.0) as client:

        async def worker() -> None:
            nonlocal sent, errors
            while sent < requests and time.perf_counter() < deadline:
                patient, data, _ = studies[sent % len(studies)]
                sent += 1
                form = {"question": QUESTION, "write_back": "true"} if op == "ask" else {}
                t0 = time.perf_counter()
                r = await client.post(
                    f"/v1/patients/{patient}/{op}", data=form, files={"image": ("q.png", data, "image/png")}
                )
                latencies.append(time.perf_counter() - t0)
                if r.status_code != 200:
                    errors += 1
                    if errors == 1:
                        print(f"{op}: {r.status_code} {r.text[:300]}", file=sys.stderr)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    ms = np.array(latencies) * 1e3
    return {
        "n": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50": float(np.percentile(ms, 50)),
        "p95": float(np.percentile(ms, 95)),
        "p99": float(np.percentile(ms, 99)),
    }


def overhead(url: str, token: str, mem: MsmMem, studies: list, blocks: int, per_block: int = 50) -> tuple[float, float]:
    """Median ms of one retrieve over HTTP (one client, one at a time) and of ``MsmMem.retrieve``
    in this process, in interleaved blocks."""
    http_ms: list[float] = []
    direct_ms: list[float] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0) as client:
        for b in range(blocks):
            for i in range(per_block):
                patient, data, _ = studies[(b * per_block + i) % len(studies)]
                t0 = time.perf_counter()
                r = client.post(f"/v1/patients/{patient}/retrieve", files={"image": ("q.png", data, "image/png")})
                http_ms.append((time.perf_counter() - t0) * 1e3)
                assert r.status_code == 200, r.text[:300]
            for i in range(per_block):
                patient, _, path = studies[(b * per_block + i) % len(studies)]
                t0 = time.perf_counter()
                mem.retrieve(AGENT, patient, path)
                direct_ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(http_ms[per_block:]), statistics.median(direct_ms[per_block:])  # first block: warm-up


def versions() -> str:
    names = ["msm-mem", "fastapi", "uvicorn", "starlette", "pydantic", "httpx", "numpy"]
    out = [f"Python {platform.python_version()}", f"SQLite {sqlite3.sqlite_version}"]
    for name in names + ["psycopg", "pgserver"]:
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            if name in names:
                out.append(f"{name} (not installed)")
    return ", ".join(out)


def run(args: argparse.Namespace, work: Path, database_url: str | None) -> dict[str, object]:
    directory, studies = build(work, args.patients, database_url)
    token, _ = ApiKeyStore(directory).create(AGENT, ["*"])
    if database_url is None:  # the direct calls use a copy: the embedded store has one process
        shutil.copytree(directory, work / "direct")
        mem = MsmMem.open(work / "direct")
    else:
        mem = MsmMem.open(directory, database_url=database_url)
    url, process, _ = serve(work, directory, database_url)
    try:
        asyncio.run(load(url, token, "retrieve", studies, args.concurrency, 200, args.seconds))  # warm-up
        retrieve = asyncio.run(load(url, token, "retrieve", studies, args.concurrency, args.requests, args.seconds))
        ask = asyncio.run(load(url, token, "ask", studies, args.concurrency, args.ask_requests, args.seconds))
        http_ms, direct_ms = overhead(url, token, mem, studies, args.blocks)
    finally:
        stop(process)
        mem.close()
    return {"studies": len(studies), "retrieve": retrieve, "ask": ask, "http_ms": http_ms, "direct_ms": direct_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patients", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--ask-requests", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--postgres", action="store_true")
    args = ap.parse_args()
    stores = [("embedded (SQLite)", None)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.postgres:
            from msm_mem.testing import local_server

            stores.append(("PostgreSQL", local_server(work / "pg", delete_at_exit=True)))
        results = [(name, run(args, work / f"s{i}", url)) for i, (name, url) in enumerate(stores)]
    print(f"\n{args.concurrency} concurrent clients over loopback, one server worker, {os.cpu_count()} cores\n")
    print("| store | studies | operation | requests | errors | requests/s | p50 ms | p95 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in results:
        for op in ("retrieve", "ask"):
            m = r[op]
            assert isinstance(m, dict)
            label = "retrieve" if op == "retrieve" else "ask + write-back"
            print(
                f"| {name} | {r['studies']} | {label} | {m['n']} | {m['errors']} | {m['rps']:.0f} "
                f"| {m['p50']:.1f} | {m['p95']:.1f} | {m['p99']:.1f} |"
            )
    print("\n| store | retrieve over HTTP, median ms | MsmMem.retrieve in process, median ms | ratio |")
    print("|---|---|---|---|")
    for name, r in results:
        h, d = float(r["http_ms"]), float(r["direct_ms"])  # type: ignore[arg-type]
        print(f"| {name} | {h:.2f} | {d:.2f} | {h / d:.2f}x |")
    print(f"\n{versions()}")


if __name__ == "__main__":
    main()
