"""The governed tiers' tables in the embedded store (mixed into :class:`SqliteStore`)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from .._errors import IllegalTransition, InvalidInput, NotFound, StoreError
from .._records import SemanticState, State
from .._tier_records import Claim, ConsentRecord, Entity, Relationship, StmItem, StmState
from . import _sql
from . import _sql_gov as g
from ._readcache import ReadCache
from .base import AUDIT_PAGE_ROWS, FieldCodec, WriteBatch
from .sqlite_keys import SqliteKeyTable, data_version

__all__ = ["GOV_SCHEMA", "GovernanceTables", "insert_versions"]

GENESIS = "0" * 64

GOV_SCHEMA = """
CREATE TABLE stm(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL, z BLOB,
  created_at REAL NOT NULL, expires_at REAL NOT NULL, state TEXT NOT NULL, actor TEXT NOT NULL);
CREATE INDEX stm_state ON stm(state, expires_at);
CREATE INDEX stm_patient ON stm(patient_id, state);
CREATE TABLE claims(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, key TEXT NOT NULL, content TEXT NOT NULL,
  source TEXT NOT NULL, confidence REAL NOT NULL, evidence_tier TEXT NOT NULL, state TEXT NOT NULL,
  supersedes TEXT, created_at REAL NOT NULL, decay_at REAL);
CREATE UNIQUE INDEX claims_one_active ON claims(patient_id, key) WHERE state = 'active';
CREATE INDEX claims_decay ON claims(decay_at);
CREATE TABLE entities(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, type TEXT NOT NULL, name TEXT NOT NULL,
  created_at REAL NOT NULL, state TEXT NOT NULL);
CREATE TABLE relationships(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, source_id TEXT NOT NULL, target_id TEXT NOT NULL,
  type TEXT NOT NULL, created_at REAL NOT NULL, state TEXT NOT NULL);
CREATE TABLE consents(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, grantee TEXT NOT NULL, purpose TEXT NOT NULL,
  decision TEXT NOT NULL, data_classes TEXT NOT NULL, start REAL NOT NULL, "end" REAL,
  created_at REAL NOT NULL, revoked_at REAL);
CREATE INDEX consents_patient ON consents(patient_id);
CREATE TABLE audit(seq INTEGER PRIMARY KEY, payload BLOB NOT NULL, event_hash TEXT NOT NULL);
CREATE TABLE keys(
  key_id TEXT PRIMARY KEY, patient_ref TEXT NOT NULL UNIQUE, kek_id TEXT NOT NULL,
  wrapped BLOB NOT NULL, created_at REAL NOT NULL, shredded INTEGER NOT NULL);
CREATE TABLE pseudonyms(key_id TEXT PRIMARY KEY, pseudonym TEXT NOT NULL UNIQUE, token TEXT NOT NULL);
CREATE INDEX episodic_decay ON episodic(decay_at);
CREATE INDEX visual_decay ON visual(decay_at);
"""


def insert_versions(
    conn: sqlite3.Connection,
    table: str,
    key_column: str,
    versions: Sequence[Any],
    *,
    ident: Callable[[Any], str],
    key: Callable[[Any], str],
    to_row: Callable[[Any], tuple[Any, ...]],
    restore: bool,
) -> None:
    """Insert new versions of keyed records (semantic states, claims): each one's ``supersedes``
    must be the active version of the same patient and key, which flips to SUPERSEDED.

    One read, one update and one insert for the whole batch. A version superseded by a later
    one of the same batch is stored SUPERSEDED at once. ``restore`` stores rows as given.
    IllegalTransition (and nothing written, the caller rolls back) for a predecessor that is
    missing, not active, of another key or superseded twice, or a second active version.
    """
    if not versions:
        return
    if not restore:
        born = {ident(v): v for v in versions}
        wanted: dict[str, Any] = {}
        for v in versions:
            old = v.supersedes
            if old is None:
                continue
            if old in wanted:
                raise IllegalTransition(f"{table} version {old!r} is superseded twice")
            wanted[old] = v
            prev = born.get(old)
            if prev is not None and (
                (prev.patient_id, key(prev)) != (v.patient_id, key(v)) or prev.state != State.ACTIVE
            ):
                raise IllegalTransition(f"{table} version {old!r} is not the active version of this key")
        stored = [old for old in wanted if old not in born]
        found: dict[str, tuple[str, str]] = {}
        for start in range(0, len(stored), 500):
            part = stored[start : start + 500]
            rows = conn.execute(
                f"SELECT id, patient_id, {key_column} FROM {table}"
                f" WHERE state = 'active' AND id IN ({','.join('?' * len(part))})",
                part,
            )
            found.update((r[0], (r[1], r[2])) for r in rows)
        for old in stored:
            v = wanted[old]
            if found.get(old) != (v.patient_id, key(v)):
                raise IllegalTransition(f"{table} version {old!r} is not the active version of this key")
        conn.executemany(f"UPDATE {table} SET state = 'superseded' WHERE id = ?", [(old,) for old in stored])
        versions = [replace(v, state=State.SUPERSEDED) if ident(v) in wanted else v for v in versions]
    new_rows = [to_row(v) for v in versions]
    try:
        conn.executemany(f"INSERT INTO {table} VALUES ({','.join('?' * len(new_rows[0]))})", new_rows)
    except sqlite3.IntegrityError as exc:
        raise IllegalTransition(
            f"a {table} key already has an active version; a new version must supersede it ({exc})"
        ) from exc


class _Blank:
    """Codec for a purged payload: stored as the empty string, not as a ciphertext."""

    def encode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return value

    def decode(self, table: str, record_id: str, field: str, patient_id: str, value: str) -> str:
        return value


class GovernanceTables:
    """Methods of :class:`~msm_mem._storage.base.Store` for the governed tiers (SQLite)."""

    _conn: sqlite3.Connection
    _lock: threading.RLock
    _codec: FieldCodec
    _closed: bool

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the store is closed")

    def _apply_governance(self, batch: WriteBatch) -> None:
        conn, codec = self._conn, self._codec
        changes = {c.item_id: c for c in batch.stm_changes}
        if batch.stm:
            rows = []
            for item in batch.stm:
                c = changes.pop(item.item_id, None)
                if c is not None:  # born and changed in this batch: store the final row at once
                    if c.expect != item.state:
                        raise IllegalTransition(
                            f"short-term item {item.item_id!r} is {item.state.value}, expected {c.expect.value}"
                        )
                    item = replace(
                        item,
                        state=c.to,
                        expires_at=c.expires_at or item.expires_at,
                        payload="" if c.purge else item.payload,
                        z=None if c.purge else item.z,
                    )
                rows.append(g.stm_to_row(item, codec) if item.payload else g.stm_to_row(item, _Blank()))
            conn.executemany("INSERT INTO stm VALUES (?,?,?,?,?,?,?,?,?)", rows)
        for c in changes.values():
            sets: list[str] = ["state = ?"]
            args: list[object] = [c.to.value]
            if c.expires_at is not None:
                sets.append("expires_at = ?")
                args.append(c.expires_at)
            if c.purge:
                sets.append("payload = '', z = NULL")
            cur = conn.execute(
                f"UPDATE stm SET {', '.join(sets)} WHERE id = ? AND state = ?", (*args, c.item_id, c.expect.value)
            )
            if cur.rowcount != 1:
                row = conn.execute("SELECT state FROM stm WHERE id = ?", (c.item_id,)).fetchone()
                if row is None:
                    raise NotFound(f"no short-term item {c.item_id!r}")
                raise IllegalTransition(f"short-term item {c.item_id!r} is {row[0]}, expected {c.expect.value}")
        insert_versions(
            conn,
            "claims",
            "key",
            batch.claims,
            ident=lambda c: c.claim_id,
            key=lambda c: c.key,
            to_row=lambda c: g.claim_to_row(c, codec),
            restore=batch.restore,
        )
        if batch.entities:
            conn.executemany(
                "INSERT INTO entities VALUES (?,?,?,?,?,?)", [g.entity_to_row(e, codec) for e in batch.entities]
            )
        if batch.relationships:
            conn.executemany(
                "INSERT INTO relationships VALUES (?,?,?,?,?,?,?)",
                [g.relationship_to_row(r) for r in batch.relationships],
            )
        if batch.consents or batch.revocations:
            self._consent_cache.clear()
        if batch.consents:
            conn.executemany(
                "INSERT INTO consents VALUES (?,?,?,?,?,?,?,?,?,?)", [g.consent_to_row(c) for c in batch.consents]
            )
        for consent_id, when in batch.revocations:
            cur = conn.execute(
                "UPDATE consents SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (when, consent_id)
            )
            if cur.rowcount != 1:
                raise NotFound(f"no unrevoked consent {consent_id!r}")
        if batch.audit:
            head_seq, _ = self._audit_head_locked()
            if batch.audit[0].seq != head_seq + 1 or any(
                b.seq != a.seq + 1 for a, b in zip(batch.audit, batch.audit[1:], strict=False)
            ):
                raise InvalidInput(f"audit rows must continue the chain at seq {head_seq + 1}")
            conn.executemany(
                "INSERT INTO audit VALUES (?, ?, ?)", [(r.seq, r.payload, r.event_hash) for r in batch.audit]
            )

    # reads ---------------------------------------------------------------------------------

    def stm_get(self, item_ids: Sequence[str]) -> list[StmItem]:
        with self._lock:
            self._check_open()
            found = {}
            for i in dict.fromkeys(item_ids):
                row = self._conn.execute("SELECT * FROM stm WHERE id = ?", (i,)).fetchone()
                if row is None:
                    raise NotFound(f"no short-term item {i!r}")
                found[i] = g.stm_from_row(row, self._codec)
            return [found[i] for i in item_ids]

    def stm_list(
        self,
        *,
        patient_id: str | None = None,
        state: StmState | None = None,
        expires_before: float | None = None,
        created_before: float | None = None,
    ) -> list[StmItem]:
        where, args = [], []
        for clause, value in (
            ("patient_id = ?", patient_id),
            ("state = ?", state.value if state else None),
            ("expires_at <= ?", expires_before),
            ("created_at <= ?", created_before),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = "SELECT * FROM stm" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at, id"
        with self._lock:
            self._check_open()
            return [g.stm_from_row(r, self._codec) for r in self._conn.execute(sql, args)]

    def _claims(self, sql: str, args: Sequence[Any]) -> list[Claim]:
        with self._lock:
            self._check_open()
            return [g.claim_from_row(r, self._codec) for r in self._conn.execute(sql, args)]

    def claims_active(self, patient_id: str, key: str | None = None) -> list[Claim]:
        if key is None:
            return self._claims(
                "SELECT * FROM claims WHERE patient_id = ? AND state = 'active' ORDER BY key", (patient_id,)
            )
        return self._claims(
            "SELECT * FROM claims WHERE patient_id = ? AND key = ? AND state = 'active'", (patient_id, key)
        )

    def claim_history(self, patient_id: str, key: str) -> list[Claim]:
        return self._claims(
            "SELECT * FROM claims WHERE patient_id = ? AND key = ? ORDER BY created_at, rowid", (patient_id, key)
        )

    def get_claims(self, ids: Sequence[str]) -> list[Claim]:
        out = (
            {
                c.claim_id: c
                for c in self._claims(f"SELECT * FROM claims WHERE id IN ({','.join('?' * len(ids))})", list(ids))
            }
            if ids
            else {}
        )
        missing = [i for i in ids if i not in out]
        if missing:
            raise NotFound(f"no claim {missing[0]!r}")
        return [out[i] for i in ids]

    def entities(self, patient_id: str) -> list[Entity]:
        with self._lock:
            self._check_open()
            return self._cache.entities(patient_id, lambda: self._load_entities(patient_id))

    def _load_entities(self, patient_id: str) -> list[Entity]:
        rows = self._conn.execute(
            "SELECT * FROM entities WHERE patient_id = ? AND state = 'active' ORDER BY created_at, rowid", (patient_id,)
        ).fetchall()
        return [g.entity_from_row(r, self._codec) for r in rows]

    def relationships(self, patient_id: str) -> list[Relationship]:
        with self._lock:
            self._check_open()
            rows = self._conn.execute(
                "SELECT * FROM relationships WHERE patient_id = ? AND state = 'active' ORDER BY created_at, rowid",
                (patient_id,),
            ).fetchall()
            return [g.relationship_from_row(r) for r in rows]

    def decay_due(self, now: float) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        with self._lock:
            self._check_open()
            for table in ("episodic", "visual", "claims"):
                rows = self._conn.execute(
                    f"SELECT id FROM {table} WHERE decay_at IS NOT NULL AND decay_at <= ?"
                    " AND state IN ('active', 'superseded') ORDER BY decay_at, id",
                    (now,),
                )
                out += [(table, r[0]) for r in rows]
        return out

    def semantic_created_before(self, before: float) -> list[SemanticState]:
        with self._lock:
            self._check_open()
            rows = self._conn.execute(
                "SELECT * FROM semantic WHERE created_at <= ? AND state IN ('active', 'superseded')"
                " ORDER BY created_at, id",
                (before,),
            ).fetchall()
            return [_sql.semantic_from_row(r, self._codec) for r in rows]

    _consent_cache: dict[str, list[ConsentRecord]]
    _consent_version: int = -1
    _keys: SqliteKeyTable
    _cache: ReadCache

    def sync(self) -> None:
        """See what other connections committed (a grant, a revocation, a shred by the CLI while
        a server runs): empty the consent and key caches when the database changed. Called at
        the start of every governed turn and audit write, so caches never outlive one."""
        with self._lock:
            self._check_open()
            version = data_version(self._conn)
            if version != self._consent_version:
                self._consent_cache.clear()
                self._consent_version = version
            self._keys.sync(version)

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        with self._lock:
            self._check_open()
            if patient_id is not None and patient_id in self._consent_cache:
                return list(self._consent_cache[patient_id])
            if patient_id is None:
                rows = self._conn.execute("SELECT * FROM consents ORDER BY created_at, id")
            else:
                rows = self._conn.execute(
                    "SELECT * FROM consents WHERE patient_id IN (?, '*') ORDER BY created_at, id", (patient_id,)
                )
            found = [g.consent_from_row(r) for r in rows]
            if patient_id is not None:
                if len(self._consent_cache) > 10_000:
                    self._consent_cache.clear()
                self._consent_cache[patient_id] = found
            return list(found)

    def _audit_head_locked(self) -> tuple[int, str]:
        row = self._conn.execute("SELECT seq, event_hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        return (int(row[0]), str(row[1])) if row else self.audit_base()

    def audit_head(self) -> tuple[int, str]:
        with self._lock:
            self._check_open()
            return self._audit_head_locked()

    def audit_base(self) -> tuple[int, str]:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'audit_base'").fetchone()
        if row is None:
            return 0, GENESIS
        seq, digest = str(row[0]).split(":", 1)
        return int(seq), digest

    def iter_audit_batches(self, start_seq: int = 1) -> Iterator[list[tuple[int, bytes, str]]]:
        seq = start_seq
        while True:
            with self._lock:  # held for one page at a time, so a long verification never blocks writers
                self._check_open()
                rows = self._conn.execute(
                    "SELECT seq, payload, event_hash FROM audit WHERE seq >= ? ORDER BY seq LIMIT ?",
                    (seq, AUDIT_PAGE_ROWS),
                ).fetchall()
            if rows:
                yield rows
            if len(rows) < AUDIT_PAGE_ROWS:
                return
            seq = int(rows[-1][0]) + 1

    def audit_purge(self, through_seq: int) -> int:
        with self._lock:
            self._check_open()
            row = self._conn.execute("SELECT event_hash FROM audit WHERE seq = ?", (through_seq,)).fetchone()
            if row is None:
                raise NotFound(f"no audit event {through_seq}")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                cur = self._conn.execute("DELETE FROM audit WHERE seq <= ?", (through_seq,))
                self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('audit_base', ?)", (f"{through_seq}:{row[0]}",))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            return int(cur.rowcount)
