"""Small helpers shared by the test modules (images on disk, audit events of a store and of a
chain in memory, the test principals, direct SQL on the store of record of either backend)."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from msm_mem import Principal, Purpose, Role
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import GENESIS, AuditEvent, Row
from msm_mem._governance.audit.verify import VerifyResult, row_problem
from msm_mem._storage.base import Store


def png(folder: Path, seed: int, size: int = 64) -> Path:
    """A random grayscale PNG (one per seed, so the novelty gate sees different images)."""
    path = folder / f"img{seed}.png"
    if not path.exists():
        rng = np.random.default_rng(seed)
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8), mode="L").save(path)
    return path


def audit_events(target: Store | Any) -> list[AuditEvent]:
    """Every stored audit event, parsed and hash-checked: of a store handle, or of the store of
    an ``MsmMem`` (or its directory) read through a handle of its own (``tests/layers.py``)."""
    if hasattr(target, "iter_audit"):  # a store handle (or the synced view of one)
        return [AuditEvent.from_row(r.seq, r.payload, r.event_hash) for r in target.iter_audit()]
    from tests.layers import open_layers

    with open_layers(_directory(target)) as layers:
        return audit_events(layers.store)


def audit_fields(i: int = 0, **override: Any) -> dict[str, Any]:
    """Plausible fields of an audit event (``ChainBuilder.next_row``); ``i`` varies record id and time."""
    base: dict[str, Any] = {
        "time": 1_700_000_000.25 + i,
        "actor": "clinician-17",
        "role": "radiologist",
        "action": "read",
        "source_tier": "ltm",
        "target_tier": "stm",
        "purpose": "treatment",
        "outcome": "success",
        "record_ids": [f"E-{i:04d}"],
        "patient": "P-3f9a",
        "consent_id": "C-1",
        "reason": "",
    }
    base.update(override)
    return base


def audit_rows(n: int, start: int = 0, head: str = GENESIS) -> list[Row]:
    """The stored rows of ``n`` events of :func:`audit_fields` chained after ``(start, head)``."""
    builder = ChainBuilder(start, head)
    return [builder.next_row(**audit_fields(i)) for i in range(n)]


def rehashed(seq: int, payload: bytes) -> Row:
    """A row of ``payload`` in slot ``seq`` with its hash recomputed (a forger's edit)."""
    return (seq, payload, hashlib.sha256(payload).hexdigest())


def verify_row_by_row(rows: Sequence[Row], start_seq: int = 1, start_prev: str = GENESIS) -> VerifyResult:
    """The full check of every row, without the fast path: what full verification must find."""
    expected, head = start_seq, start_prev
    for row in rows:
        problem, digest = row_problem(row, expected, head)
        if problem is not None:
            return VerifyResult(False, expected - start_seq, head, expected, f"seq {expected}: {problem}")
        expected, head = expected + 1, digest
    return VerifyResult(True, expected - start_seq, head, None, "")


# principals of the tests (the default consent policy permits each of them for its purpose)
ADMIN = Principal("test-admin", Role.ADMIN, Purpose.OPERATIONS)
AGENT = Principal("msm-mem-agent", Role.AGENT, Purpose.TREATMENT)
CLINICIAN = Principal("dr-test", Role.CLINICIAN, Purpose.TREATMENT)
CRITIC = Principal("report-signer", Role.CRITIC, Purpose.TREATMENT)
SYSTEM = Principal("msm-mem", Role.SYSTEM, Purpose.OPERATIONS)
INGEST = Principal("msm-mem-ingest", Role.SYSTEM, Purpose.OPERATIONS)
AUDITOR = Principal("auditor-1", Role.AUDITOR, Purpose.AUDIT)
EXPORTER = Principal("dr-export", Role.CLINICIAN, Purpose.EXPORT)


# direct access to a store of record (tamper tests), either backend ----------------------------


class RawDb:
    """A connection of its own to the store of record of a memory directory, outside the governed
    API: ``msm-mem.sqlite`` through sqlite3, or the PostgreSQL schema of ``store.json`` through
    psycopg (autocommit both). :meth:`execute` takes SQLite's ``?`` placeholders on either."""

    def __init__(self, directory: Path) -> None:
        from msm_mem._storage.location import SQLITE_FILE, read_location

        self.location = read_location(directory)
        self._conn: Any
        if self.location is None:
            self.backend = "sqlite"
            self._conn = sqlite3.connect(directory / SQLITE_FILE, isolation_level=None)
        else:
            import psycopg
            from psycopg import sql

            self.backend = "postgres"
            self._conn = psycopg.connect(self.location.dsn, autocommit=True)
            self._conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.location.schema)))

    def execute(self, statement: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement (``?`` placeholders) and return its cursor."""
        if self.backend == "postgres":
            statement = statement.replace("%", "%%").replace("?", "%s")
        return self._conn.execute(statement, tuple(params))

    def tables(self) -> list[str]:
        """The names of the store's tables."""
        if self.backend == "sqlite":
            query = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        else:
            query = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"
        return [str(r[0]) for r in self.execute(query).fetchall()]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> RawDb:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _directory(target: Any) -> Path:
    return Path(target.directory) if hasattr(target, "directory") else Path(target)


def raw_db(target: Any) -> RawDb:
    """A :class:`RawDb` on the store of record of ``target`` (an ``MsmMem`` or its directory)."""
    return RawDb(_directory(target))


def key_folder(target: Any) -> Path:
    """The folder of the store of ``target`` (an ``MsmMem`` or its directory) in the key home:
    its key files, its record and its default witness (msm_mem._governance.key_home)."""
    from msm_mem._governance.key_home import default_home

    with raw_db(target) as db:
        (store_id,) = db.execute("SELECT value FROM meta WHERE key = 'store_id'").fetchone()
    return default_home() / str(store_id)


def raw_sql(target: Any, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """Run one statement (``?`` placeholders) on the store of record of ``target`` (an ``MsmMem``,
    open or closed, or its directory) on either backend; its rows (``[]`` when it returns none)."""
    with raw_db(target) as db:
        cur = db.execute(statement, params)
        return [tuple(r) for r in cur.fetchall()] if cur.description else []


def copy_store(source: Path, dest: Path) -> Path:
    """A private copy of the closed memory directory ``source`` at ``dest``; a PostgreSQL store is
    copied into a new schema (named after the source's, so the session's cleanup drops it too)
    and the copy's ``store.json`` points at it."""
    shutil.copytree(source, dest)
    with raw_db(source) as db:
        if db.location is None:
            return dest
        from psycopg import sql

        old = db.location.schema
        new = f"{old[:40]}_c{uuid.uuid4().hex[:12]}"
        db._conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(new)))
        for table in db.tables():
            src, dst = sql.Identifier(old, table), sql.Identifier(new, table)
            db._conn.execute(sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(dst, src))
            db._conn.execute(sql.SQL("INSERT INTO {} OVERRIDING SYSTEM VALUE SELECT * FROM {}").format(dst, src))
            identity = db._conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s"
                " AND is_identity = 'YES'",
                (new, table),
            ).fetchall()
            for (column,) in identity:  # new rows must keep coming after the copied ones
                db._conn.execute(
                    sql.SQL(
                        "SELECT setval(pg_get_serial_sequence({}, {}), COALESCE(max({}), 1), count(*) > 0) FROM {}"
                    ).format(sql.Literal(dst.as_string(db._conn)), sql.Literal(column), sql.Identifier(column), dst)
                )
    spec = json.loads((dest / "store.json").read_text(encoding="utf-8"))
    spec["schema"] = new
    (dest / "store.json").write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    return dest
