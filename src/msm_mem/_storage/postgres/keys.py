"""Wrapped data keys and patient pseudonyms in the server store's schema."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ..._errors import InvalidInput
from ..._tier_records import WrappedKey
from ..tier_rows import wrapped_key_from_row

__all__ = ["PgKeyTable"]

_INSERT_KEY = (
    "INSERT INTO keys (key_id, patient_ref, kek_id, wrapped, created_at, shredded, tenant)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
Db = Callable[[], AbstractContextManager["psycopg.Connection[Any]"]]


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

    def __init__(self, db: Db, tenant: str) -> None:
        self._db = db  # the dialect's db(): the connection under its lock, StoreError once closed
        self._tenant = tenant
        self._by_patient: dict[str, WrappedKey] = {}
        self._by_id: dict[str, WrappedKey] = {}
        self._uncommitted = False  # a key was written inside a transaction since the last sync

    def sync(self) -> None:
        """Forget every cached key (other connections may have written since)."""
        with self._db():
            self._by_patient.clear()
            self._by_id.clear()
            self._uncommitted = False

    def forget(self) -> None:
        """Drop every cached key without a round trip (the store is closing: nothing may be
        answered from them afterwards)."""
        self._by_patient.clear()
        self._by_id.clear()

    def _cached(self, cache: dict[str, WrappedKey], where: str, value: str) -> WrappedKey | None:
        # a key cached is answered without the store's lock (one atomic dict read): a put or
        # shred changes the caches under the lock, and a read racing it is a read just before
        # it, as a read that took the lock first would be; every turn reads its patient's key
        # once or twice per encrypted field
        found = cache.get(value)
        if found is not None:
            return found
        # under the store's lock, so a put or shred cannot slip between the read and the caching
        with self._db() as conn:
            if value in cache:
                return cache[value]
            row = conn.execute(
                f"SELECT * FROM keys WHERE tenant = %s AND {where} = %s", (self._tenant, value)
            ).fetchone()
            key = None if row is None else wrapped_key_from_row(row)
            if key is not None and not (self._uncommitted and self._in_transaction(conn)):
                # committed already: no rollback can take it back; kept by patient and by id (one
                # key a patient), so decrypting the patient's rows after a turn began reads nothing
                self._by_patient[key.patient_ref] = key
                self._by_id[key.key_id] = key
            return key

    @staticmethod
    def _in_transaction(conn: psycopg.Connection[Any]) -> bool:
        return conn.info.transaction_status != TransactionStatus.IDLE

    def _forget(self, conn: psycopg.Connection[Any], patient_ref: str) -> None:
        self._by_patient.pop(patient_ref, None)
        self._by_id.clear()  # refilled on demand; a put or shred is rare
        self._uncommitted = self._uncommitted or self._in_transaction(conn)

    def prefetched(self, keys: list[WrappedKey]) -> None:
        """Cache keys the store read ahead, committed (outside any transaction), until the next sync."""
        with self._db():
            for key in keys:
                self._by_patient[key.patient_ref] = key
                self._by_id[key.key_id] = key

    def get(self, patient_ref: str) -> WrappedKey | None:
        return self._cached(self._by_patient, "patient_ref", patient_ref)

    def get_by_id(self, key_id: str) -> WrappedKey | None:
        return self._cached(self._by_id, "key_id", key_id)

    def put(self, key: WrappedKey) -> None:
        """Store a patient's first key (or tombstone), or rewrap a stored one; a shredded key is
        never revived and a patient keeps the first key stored (see the SQLite key table)."""
        with self._db() as conn:
            self._forget(conn, key.patient_ref)  # before the transaction: is the caller's one open?
            with conn.transaction():
                if not key.shredded:
                    conn.execute(
                        "UPDATE keys SET kek_id = %s, wrapped = %s"
                        " WHERE tenant = %s AND key_id = %s AND patient_ref = %s AND NOT shredded",
                        (key.kek_id, key.wrapped, self._tenant, key.key_id, key.patient_ref),
                    )
                conn.execute(
                    _INSERT_KEY,
                    (key.key_id, key.patient_ref, key.kek_id, key.wrapped, key.created_at, key.shredded, self._tenant),
                )

    def shred(self, patient_ref: str, tomb_ref: str | None = None) -> None:
        """Destroy the wrapped key and the pseudonym link of a patient in one transaction; with
        ``tomb_ref`` the key's row keeps that instead of the patient reference."""
        with self._db() as conn:
            self._forget(conn, patient_ref)
            if tomb_ref is not None:
                self._forget(conn, tomb_ref)
            with conn.transaction():
                t = self._tenant
                # deleted and written again as a tombstone, not updated: on a Citus cluster the
                # patient reference is the distribution column, which no UPDATE may change
                row = conn.execute(
                    "DELETE FROM keys WHERE tenant = %s AND patient_ref = %s RETURNING key_id, kek_id, created_at",
                    (t, patient_ref),
                ).fetchone()
                if row is not None:
                    conn.execute(
                        _INSERT_KEY, (row[0], tomb_ref or patient_ref, row[1], b"", row[2], True, self._tenant)
                    )
                    conn.execute("DELETE FROM pseudonyms WHERE tenant = %s AND key_id = %s", (t, row[0]))

    def all(self) -> list[WrappedKey]:
        with self._db() as conn:
            rows = conn.execute("SELECT * FROM keys WHERE tenant = %s ORDER BY created_at, key_id", (self._tenant,))
            return [wrapped_key_from_row(r) for r in rows]

    def pseudonym(self, key_id: str) -> tuple[str, str] | None:
        """``(pseudonym, encrypted patient reference)`` of a key, or None."""
        with self._db() as conn:
            row = conn.execute(
                "SELECT pseudonym, token FROM pseudonyms WHERE tenant = %s AND key_id = %s", (self._tenant, key_id)
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def pseudonyms(self) -> dict[str, tuple[str, str]]:
        with self._db() as conn:
            rows = conn.execute(
                "SELECT key_id, pseudonym, token FROM pseudonyms WHERE tenant = %s", (self._tenant,)
            ).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def put_pseudonym(self, key_id: str, pseudonym: str, token: str) -> None:
        with self._db() as conn:
            try:
                conn.execute(
                    "INSERT INTO pseudonyms (key_id, pseudonym, token, tenant) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (tenant, key_id) DO NOTHING",
                    (key_id, pseudonym, token, self._tenant),
                )
            except psycopg.IntegrityError as exc:
                raise InvalidInput(f"pseudonym refused by the store: {exc}") from exc
