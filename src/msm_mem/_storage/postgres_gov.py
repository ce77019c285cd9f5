"""The governed tiers' tables in the PostgreSQL store (mixed into :class:`PostgresStore`).

Same tables, columns and behaviour as ``sqlite_gov.py``; rows go through ``_sql_gov.py``. Two
dialect differences: ``claims`` has a trailing ``ord`` identity column standing in for SQLite's
``rowid`` (history order among equal ``created_at``), and the short-term embedding is ``bytea``
(it is never searched).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from .._errors import IllegalTransition, InvalidInput, NotFound
from .._tier_records import Claim, ConsentRecord, Entity, Relationship, StmItem, StmState, WrappedKey
from . import _sql_gov as g
from .base import AUDIT_PAGE_ROWS, FieldCodec, WriteBatch

__all__ = ["GOV_SCHEMA", "PgGovernanceTables", "PgKeyTable"]

GENESIS = "0" * 64

GOV_SCHEMA = """
CREATE TABLE stm(
  id TEXT COLLATE "C" PRIMARY KEY, patient_id TEXT COLLATE "C" NOT NULL, kind TEXT NOT NULL,
  payload TEXT NOT NULL, z BYTEA, created_at FLOAT8 NOT NULL, expires_at FLOAT8 NOT NULL,
  state TEXT NOT NULL, actor TEXT NOT NULL);
CREATE INDEX stm_state ON stm(state, expires_at);
CREATE INDEX stm_patient ON stm(patient_id, state);
CREATE TABLE claims(
  id TEXT COLLATE "C" PRIMARY KEY, patient_id TEXT COLLATE "C" NOT NULL, key TEXT COLLATE "C" NOT NULL,
  content TEXT NOT NULL, source TEXT NOT NULL, confidence FLOAT8 NOT NULL,
  evidence_tier TEXT NOT NULL, state TEXT NOT NULL, supersedes TEXT, created_at FLOAT8 NOT NULL,
  decay_at FLOAT8, ord BIGINT GENERATED ALWAYS AS IDENTITY);
CREATE UNIQUE INDEX claims_one_active ON claims(patient_id, key) WHERE state = 'active';
CREATE INDEX claims_decay ON claims(decay_at);
CREATE TABLE entities(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, type TEXT NOT NULL, name TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, state TEXT NOT NULL);
CREATE TABLE relationships(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, source_id TEXT NOT NULL, target_id TEXT NOT NULL,
  type TEXT NOT NULL, created_at FLOAT8 NOT NULL, state TEXT NOT NULL);
CREATE TABLE consents(
  id TEXT COLLATE "C" PRIMARY KEY, patient_id TEXT NOT NULL, grantee TEXT NOT NULL,
  purpose TEXT NOT NULL, decision TEXT NOT NULL, data_classes TEXT NOT NULL, start FLOAT8 NOT NULL,
  "end" FLOAT8, created_at FLOAT8 NOT NULL, revoked_at FLOAT8);
CREATE INDEX consents_patient ON consents(patient_id);
CREATE TABLE audit(seq BIGINT PRIMARY KEY, payload BYTEA NOT NULL, event_hash TEXT NOT NULL);
CREATE TABLE keys(
  key_id TEXT PRIMARY KEY, patient_ref TEXT NOT NULL UNIQUE, kek_id TEXT NOT NULL,
  wrapped BYTEA NOT NULL, created_at FLOAT8 NOT NULL, shredded BOOLEAN NOT NULL);
CREATE TABLE pseudonyms(key_id TEXT PRIMARY KEY, pseudonym TEXT NOT NULL UNIQUE, token TEXT NOT NULL);
CREATE INDEX episodic_decay ON episodic(decay_at);
CREATE INDEX visual_decay ON visual(decay_at);
"""

Db = AbstractContextManager["psycopg.Connection[Any]"]


def _marks(n: int) -> str:
    return ",".join(["%s"] * n)


class PgKeyTable:
    """Wrapped data keys and pseudonyms in the store's schema (own short transactions).

    Keys read are cached until the next :meth:`sync` (the store calls it at the start of every
    governed turn), so a write reads each of its patients' keys once, not once per encrypted
    field; this table's own writes update the cache at once. A shred made through another
    connection is therefore seen from the next turn on, as with the embedded store. A key
    written inside a caller's open transaction (a new patient's first record) could still be
    rolled back with it: from such a write until the next sync, nothing read inside a
    transaction is cached.
    """

    def __init__(self, db: Any) -> None:
        self._db = db  # the store's _db(): the connection under its lock, StoreError once closed
        self._by_patient: dict[str, WrappedKey] = {}
        self._by_id: dict[str, WrappedKey] = {}
        self._uncommitted = False  # a key was written inside a transaction since the last sync

    def sync(self) -> None:
        """Forget every cached key (other connections may have written since)."""
        with self._db():
            self._by_patient.clear()
            self._by_id.clear()
            self._uncommitted = False

    @staticmethod
    def _key(r: Sequence[Any]) -> WrappedKey:
        return WrappedKey(
            key_id=r[0], patient_ref=r[1], kek_id=r[2], wrapped=bytes(r[3]), created_at=r[4], shredded=bool(r[5])
        )

    def _cached(self, cache: dict[str, WrappedKey], where: str, value: str) -> WrappedKey | None:
        # under the store's lock, so a put or shred cannot slip between the read and the caching
        with self._db() as conn:
            if value in cache:
                return cache[value]
            row = conn.execute(f"SELECT * FROM keys WHERE {where} = %s", (value,)).fetchone()
            key = None if row is None else self._key(row)
            if key is not None and not (self._uncommitted and self._in_transaction(conn)):
                cache[value] = key  # committed already: no rollback can take it back
            return key

    @staticmethod
    def _in_transaction(conn: psycopg.Connection[Any]) -> bool:
        return conn.info.transaction_status != TransactionStatus.IDLE

    def _forget(self, conn: psycopg.Connection[Any], patient_ref: str) -> None:
        self._by_patient.pop(patient_ref, None)
        self._by_id.clear()  # refilled on demand; a put or shred is rare
        self._uncommitted = self._uncommitted or self._in_transaction(conn)

    def get(self, patient_ref: str) -> WrappedKey | None:
        return self._cached(self._by_patient, "patient_ref", patient_ref)

    def get_by_id(self, key_id: str) -> WrappedKey | None:
        return self._cached(self._by_id, "key_id", key_id)

    def put(self, key: WrappedKey) -> None:
        with self._db() as conn:
            self._forget(conn, key.patient_ref)  # before the transaction: is the caller's one open?
            with conn.transaction():
                conn.execute("DELETE FROM keys WHERE patient_ref = %s AND key_id != %s", (key.patient_ref, key.key_id))
                conn.execute(
                    "INSERT INTO keys VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key_id) DO UPDATE SET"
                    " patient_ref = EXCLUDED.patient_ref, kek_id = EXCLUDED.kek_id,"
                    " wrapped = EXCLUDED.wrapped, created_at = EXCLUDED.created_at, shredded = EXCLUDED.shredded",
                    (key.key_id, key.patient_ref, key.kek_id, key.wrapped, key.created_at, key.shredded),
                )

    def shred(self, patient_ref: str) -> None:
        """Destroy the wrapped key and the pseudonym link of a patient in one transaction."""
        with self._db() as conn:
            self._forget(conn, patient_ref)
            with conn.transaction():
                row = conn.execute(
                    "SELECT key_id FROM keys WHERE patient_ref = %s FOR UPDATE", (patient_ref,)
                ).fetchone()
                if row is not None:
                    conn.execute("UPDATE keys SET wrapped = '\\x'::bytea, shredded = TRUE WHERE key_id = %s", (row[0],))
                    conn.execute("DELETE FROM pseudonyms WHERE key_id = %s", (row[0],))

    def all(self) -> list[WrappedKey]:
        with self._db() as conn:
            return [self._key(r) for r in conn.execute("SELECT * FROM keys ORDER BY created_at, key_id")]

    def pseudonym(self, key_id: str) -> tuple[str, str] | None:
        """``(pseudonym, encrypted patient reference)`` of a key, or None."""
        with self._db() as conn:
            row = conn.execute("SELECT pseudonym, token FROM pseudonyms WHERE key_id = %s", (key_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def put_pseudonym(self, key_id: str, pseudonym: str, token: str) -> None:
        with self._db() as conn:
            try:
                conn.execute("INSERT INTO pseudonyms VALUES (%s, %s, %s)", (key_id, pseudonym, token))
            except psycopg.IntegrityError as exc:
                raise InvalidInput(f"pseudonym refused by the store: {exc}") from exc


class PgGovernanceTables:
    """Methods of :class:`~msm_mem._storage.base.Store` for the governed tiers (PostgreSQL)."""

    _codec: FieldCodec
    _lock: threading.RLock

    def _db(self) -> Db:  # provided by PostgresStore
        raise NotImplementedError

    def _apply_governance(self, conn: psycopg.Connection[Any], batch: WriteBatch) -> None:
        codec = self._codec
        if batch.stm:
            conn.cursor().executemany(
                f"INSERT INTO stm VALUES ({_marks(9)})", [g.stm_to_row(s, codec) for s in batch.stm]
            )
        for c in batch.stm_changes:
            row = conn.execute("SELECT state FROM stm WHERE id = %s", (c.item_id,)).fetchone()
            if row is None:
                raise NotFound(f"no short-term item {c.item_id!r}")
            if row[0] != c.expect.value:
                raise IllegalTransition(f"short-term item {c.item_id!r} is {row[0]}, expected {c.expect.value}")
            sets, args = ["state = %s"], [c.to.value]
            if c.expires_at is not None:
                sets.append("expires_at = %s")
                args.append(c.expires_at)  # type: ignore[arg-type]
            if c.purge:
                sets.append("payload = '', z = NULL")
            conn.execute(f"UPDATE stm SET {', '.join(sets)} WHERE id = %s", (*args, c.item_id))
        for claim in batch.claims:
            if claim.supersedes is not None and not batch.restore:
                cur = conn.execute(
                    "UPDATE claims SET state = 'superseded' WHERE id = %s AND state = 'active'"
                    " AND patient_id = %s AND key = %s",
                    (claim.supersedes, claim.patient_id, claim.key),
                )
                if cur.rowcount != 1:
                    raise IllegalTransition(f"claim {claim.supersedes!r} is not the active version of its key")
            try:
                conn.execute(f"INSERT INTO claims VALUES ({_marks(11)})", g.claim_to_row(claim, codec))
            except psycopg.IntegrityError as exc:
                raise IllegalTransition(f"claim key {claim.key!r} already has an active version ({exc})") from exc
        if batch.entities:
            conn.cursor().executemany(
                f"INSERT INTO entities VALUES ({_marks(6)})", [g.entity_to_row(e, codec) for e in batch.entities]
            )
        if batch.relationships:
            conn.cursor().executemany(
                f"INSERT INTO relationships VALUES ({_marks(7)})",
                [g.relationship_to_row(r) for r in batch.relationships],
            )
        if batch.consents:
            conn.cursor().executemany(
                f"INSERT INTO consents VALUES ({_marks(10)})", [g.consent_to_row(c) for c in batch.consents]
            )
        for consent_id, when in batch.revocations:
            cur = conn.execute(
                "UPDATE consents SET revoked_at = %s WHERE id = %s AND revoked_at IS NULL", (when, consent_id)
            )
            if cur.rowcount != 1:
                raise NotFound(f"no unrevoked consent {consent_id!r}")
        if batch.audit:
            head_seq, _ = self._audit_head_in(conn)
            if batch.audit[0].seq != head_seq + 1 or any(
                b.seq != a.seq + 1 for a, b in zip(batch.audit, batch.audit[1:], strict=False)
            ):
                raise InvalidInput(f"audit rows must continue the chain at seq {head_seq + 1}")
            conn.cursor().executemany(
                "INSERT INTO audit VALUES (%s, %s, %s)", [(r.seq, r.payload, r.event_hash) for r in batch.audit]
            )

    # reads ---------------------------------------------------------------------------------

    def stm_get(self, item_ids: Sequence[str]) -> list[StmItem]:
        with self._db() as conn:
            rows = conn.execute("SELECT * FROM stm WHERE id = ANY(%s)", (list(dict.fromkeys(item_ids)),))
            found = {r[0]: g.stm_from_row(r, self._codec) for r in rows}
        missing = [i for i in item_ids if i not in found]
        if missing:
            raise NotFound(f"no short-term item {missing[0]!r}")
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
            ("patient_id = %s", patient_id),
            ("state = %s", state.value if state else None),
            ("expires_at <= %s", expires_before),
            ("created_at <= %s", created_before),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        query = "SELECT * FROM stm" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY created_at, id"
        with self._db() as conn:
            return [g.stm_from_row(r, self._codec) for r in conn.execute(query, args)]

    def _claims(self, query: str, args: Sequence[Any]) -> list[Claim]:
        with self._db() as conn:
            return [g.claim_from_row(r, self._codec) for r in conn.execute(query, args)]

    def claims_active(self, patient_id: str, key: str | None = None) -> list[Claim]:
        if key is None:
            return self._claims(
                "SELECT * FROM claims WHERE patient_id = %s AND state = 'active' ORDER BY key", (patient_id,)
            )
        return self._claims(
            "SELECT * FROM claims WHERE patient_id = %s AND key = %s AND state = 'active'", (patient_id, key)
        )

    def claim_history(self, patient_id: str, key: str) -> list[Claim]:
        return self._claims(
            "SELECT * FROM claims WHERE patient_id = %s AND key = %s ORDER BY created_at, ord", (patient_id, key)
        )

    def get_claims(self, ids: Sequence[str]) -> list[Claim]:
        out = (
            {c.claim_id: c for c in self._claims("SELECT * FROM claims WHERE id = ANY(%s)", (list(ids),))}
            if ids
            else {}
        )
        missing = [i for i in ids if i not in out]
        if missing:
            raise NotFound(f"no claim {missing[0]!r}")
        return [out[i] for i in ids]

    def entities(self, patient_id: str) -> list[Entity]:
        with self._db() as conn:
            rows = conn.execute(
                "SELECT id, patient_id, type, name, created_at, state FROM entities"
                " WHERE patient_id = %s AND state = 'active' ORDER BY created_at, id",
                (patient_id,),
            )
            return [g.entity_from_row(r, self._codec) for r in rows]

    def relationships(self, patient_id: str) -> list[Relationship]:
        with self._db() as conn:
            rows = conn.execute(
                "SELECT id, patient_id, source_id, target_id, type, created_at, state FROM relationships"
                " WHERE patient_id = %s AND state = 'active' ORDER BY created_at, id",
                (patient_id,),
            )
            return [g.relationship_from_row(r) for r in rows]

    def decay_due(self, now: float) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        with self._db() as conn:
            for table in ("episodic", "visual", "claims"):
                rows = conn.execute(
                    f"SELECT id FROM {table} WHERE decay_at IS NOT NULL AND decay_at <= %s"
                    " AND state IN ('active', 'superseded') ORDER BY decay_at, id",
                    (now,),
                )
                out += [(table, r[0]) for r in rows]
        return out

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        with self._db() as conn:
            if patient_id is None:
                rows = conn.execute("SELECT * FROM consents ORDER BY created_at, id")
            else:
                rows = conn.execute(
                    "SELECT * FROM consents WHERE patient_id IN (%s, '*') ORDER BY created_at, id", (patient_id,)
                )
            return [g.consent_from_row(r) for r in rows]

    def _audit_base_in(self, conn: psycopg.Connection[Any]) -> tuple[int, str]:
        row = conn.execute("SELECT value FROM meta WHERE key = 'audit_base'").fetchone()
        if row is None:
            return 0, GENESIS
        seq, digest = str(row[0]).split(":", 1)
        return int(seq), digest

    def _audit_head_in(self, conn: psycopg.Connection[Any]) -> tuple[int, str]:
        row = conn.execute("SELECT seq, event_hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
        return (int(row[0]), str(row[1])) if row else self._audit_base_in(conn)

    def audit_head(self) -> tuple[int, str]:
        with self._db() as conn:
            return self._audit_head_in(conn)

    def audit_base(self) -> tuple[int, str]:
        with self._db() as conn:
            return self._audit_base_in(conn)

    def iter_audit_batches(self, start_seq: int = 1) -> Iterator[list[tuple[int, bytes, str]]]:
        seq = start_seq
        while True:
            with self._db() as conn:  # BIGINT, BYTEA and TEXT load as int, bytes and str
                rows: list[tuple[int, bytes, str]] = conn.execute(
                    "SELECT seq, payload, event_hash FROM audit WHERE seq >= %s ORDER BY seq LIMIT %s",
                    (seq, AUDIT_PAGE_ROWS),
                ).fetchall()
            if rows:
                yield rows
            if len(rows) < AUDIT_PAGE_ROWS:
                return
            seq = rows[-1][0] + 1

    def audit_purge(self, through_seq: int) -> int:
        with self._db() as conn:
            row = conn.execute("SELECT event_hash FROM audit WHERE seq = %s", (through_seq,)).fetchone()
            if row is None:
                raise NotFound(f"no audit event {through_seq}")
            with conn.transaction():
                cur = conn.execute("DELETE FROM audit WHERE seq <= %s", (through_seq,))
                conn.execute(
                    "INSERT INTO meta VALUES ('audit_base', %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                    (f"{through_seq}:{row[0]}",),
                )
            return int(cur.rowcount)
