"""Two parts of an embedded commit, timed alone on this disk, each beside what it replaced.

1. The signed head file written at every commit: ``write_head`` (overwritten in place,
   ``fdatasync``) beside the former way (``O_TRUNC``, write, ``fsync``), with the same line.
2. The change mark's triggers (``_storage/sqlite/changes.py``): rows inserted into the
   ``episodic`` table of a real store with its triggers, and of a copy with them dropped, in
   transactions of ``--batch`` rows.
3. Following another process: a store of ``--items`` episodic and visual records (1024-d) open
   in this process while a second handle commits; the time this handle's next turn start
   (``Store.sync``) takes to follow it: an episode and a visual record appended (read past
   the index's end), an episode retired (its position read again), audit rows alone (nothing
   to follow), and a new epoch of the moved mark (every position's scope and id read again:
   what any commit elsewhere, audit rows alone included, cost before the change marks).

Rounds alternate the sides; prints the median per round (microseconds; milliseconds for 3).

Usage: python benchmarks/bench_commit_parts.py [--workdir DIR] [--rounds 3] [--writes 300]
       [--rows 5000] [--batch 50] [--items 100000] [--follows 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from msm_mem import EpisodicRecord, VisualRecord
from msm_mem._governance.checkpoint import Checkpoint
from msm_mem._governance.checkpoint_files import write_head
from msm_mem._governance.codec import EnvelopeCodec
from msm_mem._governance.crypto import EnvelopeCipher
from msm_mem._records import State
from msm_mem._storage.base import StateChange, WriteBatch
from msm_mem._storage.sqlite import SqliteStore
from msm_mem._storage.sqlite.changes import MARK_KEY, MOVED_KEY
from msm_mem._storage.sqlite.schema import DB_NAME
from msm_mem._tier_records import AuditRow
from msm_mem.testing import InMemoryKeyProvider

_FRESH = "lower(hex(randomblob(8)))"


def _old_write_head(path: Path, line: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def _median_us(fn: Callable[[], None], n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def heads(work: Path, rounds: int, writes: int) -> None:
    cp = Checkpoint("store-1", 123456, "ab" * 32, 1_700_000_000.0, "cd" * 64, 0, "0" * 64)
    line = cp.to_json() + b"\n"
    path = work / "audit" / "checkpoints.head"
    path.parent.mkdir()
    print("| round | O_TRUNC + write + fsync, us | write_head (in place + fdatasync), us |\n|---|---|---|")
    for r in range(rounds):
        old = _median_us(lambda: _old_write_head(path, line), writes)
        new = _median_us(lambda: write_head(path, cp), writes)
        print(f"| {r + 1} | {old:.0f} | {new:.0f} |")


def _insert_rows(db: Path, start: int, rows: int, batch: int) -> float:
    """Microseconds a row: ``rows`` episodic rows in transactions of ``batch``."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    columns = [r[1] for r in conn.execute("PRAGMA table_info(episodic)")]
    marks = ", ".join("?" * len(columns))
    t = time.perf_counter()
    for first in range(start, start + rows, batch):
        conn.execute("BEGIN")
        conn.executemany(
            f"INSERT INTO episodic ({', '.join(columns)}) VALUES ({marks})",
            [_row(columns, i) for i in range(first, min(first + batch, start + rows))],
        )
        conn.execute("COMMIT")
    conn.close()
    return (time.perf_counter() - t) / rows * 1e6


def _row(columns: list[str], i: int) -> tuple[object, ...]:
    values: dict[str, object] = {"pos": i, "id": f"E-{i}", "tenant": "default", "z": bytes(4096), "confidence": 0.6}
    return tuple(values.get(c, "x" * 40) for c in columns)


def triggers(work: Path, rounds: int, rows: int, batch: int) -> None:
    SqliteStore.create(work / "with", dim=1024, encoder="bench").close()
    shutil.copytree(work / "with", work / "without")
    with sqlite3.connect(work / "without" / DB_NAME, isolation_level=None) as conn:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
    print(f"\n{batch} rows a transaction:\n\n| round | no triggers, us a row | change-mark triggers, us a row |")
    print("|---|---|---|")
    for r in range(rounds):
        bare = _insert_rows(work / "without" / DB_NAME, r * rows, rows, batch)
        marked = _insert_rows(work / "with" / DB_NAME, r * rows, rows, batch)
        print(f"| {r + 1} | {bare:.2f} | {marked:.2f} |")


def _records(start: int, n: int, patients: int, rng: np.random.Generator) -> WriteBatch:
    z = rng.standard_normal((n, 1024), dtype=np.float32)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    ids = range(start, start + n)
    return WriteBatch(
        episodes=[
            EpisodicRecord(f"E-{i}", f"P{i % patients}", 1.6e9 + i, z[j], "q?", "a.", study_id=f"s{i}")
            for j, i in enumerate(ids)
        ],
        visuals=[
            VisualRecord(f"V-{i}", f"P{i % patients}", 1.6e9 + i, z[j], source_episode_id=f"E-{i}")
            for j, i in enumerate(ids)
        ],
    )


def _encrypted(store: SqliteStore, keks: InMemoryKeyProvider) -> SqliteStore:
    store.use_codec(EnvelopeCodec(EnvelopeCipher(store.store_id, keks, store.keys()), store.keys()))
    store.use_row_key(bytes(range(32)))
    return store


def follow(work: Path, rounds: int, items: int, follows: int) -> None:
    keks = InMemoryKeyProvider()
    rng = np.random.default_rng(0)
    patients = max(1, items // 10)
    store = _encrypted(SqliteStore.create(work / "follow", dim=1024, encoder="bench"), keks)
    for start in range(0, items, 5000):
        store.write(_records(start, min(5000, items - start), patients, rng))
    other = _encrypted(SqliteStore.open(work / "follow"), keks)
    store.sync()
    added = items
    seq = 0
    head = "| round | append, ms | retirement, ms | audit rows alone, ms | new epoch (every position), ms |"
    print(f"\n{items:,} rows each:\n\n{head}")
    print("|---|---|---|---|---|")
    raw = sqlite3.connect(work / "follow" / DB_NAME, isolation_level=None)
    for r in range(rounds):
        times: dict[str, list[float]] = {"append": [], "retire": [], "audit": [], "epoch": []}
        for _ in range(follows):
            other.write(_records(added, 1, patients, rng))
            added += 1
            times["append"].append(_timed(store.sync))
            change = StateChange("episodic", f"E-{added - 1}", State.ACTIVE, State.SUPERSEDED)
            other.write(WriteBatch(changes=[change]))
            times["retire"].append(_timed(store.sync))
            seq += 1
            head = other.audit_head()
            other.write(WriteBatch(audit=[AuditRow(head[0] + 1, b"e%d" % seq, f"{head[0] + 1:064x}")]))
            times["audit"].append(_timed(store.sync))
            raw.execute(f"UPDATE meta SET value = {_FRESH} WHERE key = ?", (MARK_KEY,))
            raw.execute(f"UPDATE meta SET value = {_FRESH} || '|' WHERE key = ?", (MOVED_KEY,))
            times["epoch"].append(_timed(store.sync))
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        cells = " | ".join(f"{med[k]:.3f}" for k in ("append", "retire", "audit", "epoch"))
        print(f"| {r + 1} | {cells} |")
    raw.close()
    other.close()
    store.close()


def _timed(fn: Callable[[], None]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder, created if missing (default: temp)")
    ap.add_argument("--rounds", type=_positive, default=3)
    ap.add_argument("--writes", type=_positive, default=300)
    ap.add_argument("--rows", type=_positive, default=5000)
    ap.add_argument("--batch", type=_positive, default=50)
    ap.add_argument("--items", type=_positive, default=100_000)
    ap.add_argument("--follows", type=_positive, default=20)
    args = ap.parse_args()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        heads(Path(tmp), args.rounds, args.writes)
        triggers(Path(tmp), args.rounds, args.rows, args.batch)
        follow(Path(tmp), args.rounds, args.items, args.follows)


if __name__ == "__main__":
    main()
