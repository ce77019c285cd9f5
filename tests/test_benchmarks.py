"""The kept scripts of ``benchmarks/`` run at a tiny size, each in its own interpreter from the
repository root: each exits 0 and prints its table. The figures themselves depend on the
machine and are not asserted; that a row of numbers is printed is."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SKIP_POSTGRES

pytestmark = [pytest.mark.slow, pytest.mark.system]

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"[\d,]+(?:\.\d+)?"

no_postgres = pytest.mark.skipif(SKIP_POSTGRES, reason="MSM_MEM_SKIP_POSTGRES is set")
needs_wrk = pytest.mark.skipif(
    shutil.which("wrk") is None, reason="bench_service.py loads the server with wrk: apt-get install wrk"
)


def bench(tmp_path: Path, script: str, *args: str, timeout: float = 120) -> str:
    """The standard output of ``benchmarks/SCRIPT ARGS`` run to its end (scratch files under
    ``tmp_path``); fails with its standard error when it exits with another status than 0."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    command = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


def row(out: str, *cells: str) -> re.Match[str]:
    """The first Markdown table row of ``out`` starting with these cells (regular expressions)."""
    found = re.search(r"^\| " + r" \| ".join(cells) + r" \|", out, re.MULTILINE)
    assert found, f"no row {cells} in:\n{out}"
    return found


def test_core(tmp_path: Path) -> None:
    """bench_core.py at 2,000 items: one table row with the ingest rate and the search/brute ratio."""
    out = bench(tmp_path, "bench_core.py", "--sizes", "2000", "--workdir", str(tmp_path / "work"))
    row(out, "2,000", "200", NUMBER, NUMBER, ".*", NUMBER)


def test_governance(tmp_path: Path) -> None:
    """bench_governance.py at a tiny size: audit append, write-back and per-query overhead rows."""
    out = bench(
        tmp_path,
        "bench_governance.py",
        *("--events", "2000", "--interactions", "200", "--patients", "100"),
        *("--items", "100", "--queries", "10", "--repeat", "1"),
    )
    row(out, r"audit append.*", f"{NUMBER} events/s", ">= 5,000")
    row(out, r"governed write-back \(200 interactions over 100 patients, every impression unique.*", f"{NUMBER} .*")
    row(out, r"memory overhead per query with 100 stored items.*", f"{NUMBER} ms", "<= 5 ms")


@pytest.mark.postgres
@no_postgres
def test_governance_on_postgres(tmp_path: Path) -> None:
    """bench_governance.py --postgres: the write-back rows also on a PostgreSQL server it starts."""
    out = bench(
        tmp_path,
        "bench_governance.py",
        *("--events", "1000", "--interactions", "100", "--patients", "100"),
        *("--items", "20", "--queries", "4", "--repeat", "1", "--postgres"),
    )
    row(out, r"same on PostgreSQL.*every impression unique.*", f"{NUMBER} interactions/s", ">= 2,000")


def test_audit_verify(tmp_path: Path) -> None:
    """bench_audit_verify.py at 2,000 events: full (one process, two workers) and hash-only rows."""
    out = bench(
        tmp_path, "bench_audit_verify.py", "--events", "2000", "--repeat", "1", "--workdir", str(tmp_path / "w")
    )
    for mode in ("full, one process", "full, 2 workers", "hash-only"):
        row(out, mode, NUMBER, NUMBER, f"{NUMBER}-{NUMBER}")


@pytest.mark.postgres
@no_postgres
def test_tenant_size(tmp_path: Path) -> None:
    """bench_tenant_size.py at 2 patients x 1 study: rows and bytes of each table, and the total."""
    out = bench(tmp_path, "bench_tenant_size.py", "--patients", "2", "--studies", "1")
    row(out, "episodic", "4", NUMBER, "400,000", f"{NUMBER} GiB")  # 2 rows a study, 200,000 studies
    row(out, "keys", "2", NUMBER, "10,000", f"{NUMBER} GiB")  # one a patient
    row(out, r"\*\*all\*\* \| \| \|", rf"\*\*{NUMBER} GiB\*\*")


@pytest.mark.citus
def test_citus(tmp_path: Path, cluster_tree: Path) -> None:
    """bench_citus.py at 2 patients x 1 study, 4 asks and retrieves, 200 rows for the recall,
    20 studies sized, 2 concurrent writers of 2 asks and 2 reads: the side-by-side rows of the single server
    and the clusters of one and two workers, the recall rows, the concurrent rows of one and
    eight audit chains (verified), bytes per study and the sizing rows (it starts its own
    servers from the built tree)."""
    args = ("--patients", "2", "--studies", "1", "--asks", "4", "--retrieves", "4", "--tree", str(cluster_tree))
    sizing = ("--size-base", "20", "--size-studies", "20", "--writers", "2", "--concurrent-asks", "2")
    sizing += ("--concurrent-reads", "2", "--rounds", "1")
    out = bench(tmp_path, "bench_citus.py", *args, "--recall-rows", "200", "--queries", "4", *sizing)
    cell = rf"{NUMBER} \({NUMBER}\)"
    ratio = f"{NUMBER}x"
    row(out, r"governed write-back \(ask, answer written back\)", "4", cell, cell, cell, ratio, ratio)
    row(out, "retrieve a stored study, patient scope", "4", cell, cell, cell, ratio, ratio)
    row(out, "the store's search", "on", NUMBER, NUMBER, "(HNSW index|tenant btree, exact)")
    row(out, r"its query, the index forced \(enable_sort off\)", "off", NUMBER, NUMBER, "HNSW index")
    row(out, "citus", NUMBER)
    row(out, "100", "20,000,000", f"{NUMBER} GiB", f"{NUMBER} GiB", r"\d+")
    for store in ("single PostgreSQL", "Citus, 2 workers"):
        for writes in ("ask written back, 2 each", "audited read, 2 each"):
            for lanes in ("1", "8"):
                row(out, store, writes, lanes, rf"{NUMBER} \({NUMBER} to {NUMBER}\)", cell, "yes")


def test_encoders(tmp_path: Path) -> None:
    """bench_encoders.py on 4 images with the pixels encoder: its images per second."""
    out = bench(tmp_path, "bench_encoders.py", "--images", "4", "--encoders", "pixels")
    row(out, "pixels", "1024", "none", NUMBER)


@pytest.mark.skipif(
    importlib.util.find_spec("torchxrayvision") is None,
    reason="the IU X-ray reports ship in the torchxrayvision wheel (make test installs it)",
)
def test_labeler(tmp_path: Path) -> None:
    """bench_labeler.py on 200 texts of each set, one pass: microseconds per text."""
    out = bench(tmp_path, "bench_labeler.py", "--passes", "1", "--texts", "200")
    row(out, "200 IU X-ray impressions and reports", NUMBER)
    row(out, r"200 unique write-back impressions \(bench_governance\)", NUMBER)


@needs_wrk
def test_deid(tmp_path: Path) -> None:
    """bench_deid.py on 300 planted identifiers without the peer: the recall table with every
    category, the retention table, and no identifier past the population anonymiser."""
    out = bench(tmp_path, "bench_deid.py", "--identifiers", "300", "--no-peer")
    row(out, "name", NUMBER, NUMBER, NUMBER, NUMBER)
    row(out, "all", NUMBER, NUMBER, NUMBER, NUMBER)
    row(out, "population", "0", NUMBER, NUMBER, NUMBER)


def test_upload_limits(tmp_path: Path) -> None:
    """bench_upload_limits.py at 512x256 with a 200,000-byte budget and 25 wrong secrets: the
    16-bit RGBA PNG refused, the same without the budget decoded, the wrong secrets answered
    401 (20, hashed) and then 429 (5, refused without a hash)."""
    out = bench(
        tmp_path,
        "bench_upload_limits.py",
        *("--width", "512", "--height", "256", "--budget", "200000"),
        "--requests",
        "25",
    )
    row(out, "PNG 512x256 16-bit RGBA", NUMBER, "refused: over the budget", NUMBER, NUMBER, NUMBER)
    row(out, "PNG 512x256 16-bit RGBA, no budget", NUMBER, "decoded 512x256", NUMBER, NUMBER, NUMBER)
    row(out, r"20 a minute \(default\)", "401", "20", NUMBER, NUMBER)
    row(out, r"20 a minute \(default\)", "429", "5", NUMBER, NUMBER)
    row(out, "out of reach", "401", "25", NUMBER, NUMBER)


def test_service(tmp_path: Path) -> None:
    """bench_service.py with 2 patients, one second of wrk: the run's row and the overhead row."""
    out = bench(
        tmp_path,
        "bench_service.py",
        *("--patients", "2", "--workers", "1", "--connections", "1", "--seconds", "1"),
        *("--rounds", "1", "--blocks", "1", "--ops", "retrieve"),
    )
    found = row(out, r"embedded \(SQLite\)", "default", "1", "1", r"retrieve \(upload\)", f"({NUMBER})")
    assert float(found.group(1).replace(",", "")) > 0, "no request was answered with a success"
    row(out, r"embedded \(SQLite\)", "default", NUMBER, NUMBER, f"{NUMBER}x")


@needs_wrk
@pytest.mark.postgres
@no_postgres
def test_service_on_postgres(tmp_path: Path) -> None:
    """bench_service.py --postgres --no-embedded: the same rows on a PostgreSQL server it starts."""
    out = bench(
        tmp_path,
        "bench_service.py",
        *("--patients", "2", "--workers", "1", "--connections", "1", "--seconds", "1"),
        *("--rounds", "1", "--blocks", "1", "--ops", "retrieve-study", "--postgres", "--no-embedded"),
    )
    row(out, "PostgreSQL", "default", "1", "1", r"retrieve \(stored study\)", NUMBER)


def test_peers_without_the_peers_extra(tmp_path: Path) -> None:
    """bench_peers.py at 2,000 random rows with the systems that need no extra (numpy, FAISS,
    msm-mem exact and HNSW): both latency tables, the footprint table and peers.json."""
    out = bench(
        tmp_path,
        "bench_peers.py",
        *("--sizes", "2000", "--data", "random", "--systems", "numpy", "faiss-flat", "msm-mem", "msm-mem-hnsw"),
        *("--queries", "20", "--warmup", "2", "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "out")),
    )
    assert "FAILED" not in out
    row(out, "msm-mem `search_many` E", rf"{NUMBER} \({NUMBER}\) {NUMBER}x r=1\.000.*")
    row(out, "msm-mem", rf"{NUMBER} \({NUMBER}\) {NUMBER}x r=1\.000.*")
    row(out, "msm-mem-hnsw", rf"{NUMBER} \({NUMBER}\) {NUMBER}x r={NUMBER} population_ef_search=\d+.*")
    row(out, "msm-mem", f"{NUMBER}; {NUMBER}; {NUMBER}; {NUMBER}")
    report = json.loads((tmp_path / "out" / "peers.json").read_text())
    assert {r["system"] for r in report["runs"]} == {"numpy", "faiss-flat", "msm-mem", "msm-mem-hnsw"}
    assert (tmp_path / "out" / "bench_peers.png").stat().st_size > 0


@pytest.mark.skipif(sys.platform == "win32", reason="the children are forked and killed with SIGKILL")
def test_crash_safety(tmp_path: Path) -> None:
    """crash_safety.py with 2 kills on the embedded store: its table row, no failure."""
    out = bench(tmp_path, "crash_safety.py", "--kills", "2", "--postgres-kills", "0", "--minutes", "2")
    row(out, "sqlite", "2", r"\d+", r"\d+ / \d+", "2", "0: none", r"\d+")
