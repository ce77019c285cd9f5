"""Wrapped data keys and patient pseudonyms in the embedded store's database."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from ..._errors import StoreError
from ..._tier_records import WrappedKey
from ..sql_core import insert_sql
from ..tier_rows import wrapped_key_from_row

__all__ = ["SqliteKeyTable"]


class SqliteKeyTable:
    """Wrapped data keys and pseudonyms in the store's database (own short transactions)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        lock: threading.RLock,
        tenant: str,
        mark: Callable[[], int],
        on_shred: Callable[[], None] = lambda: None,
    ) -> None:
        self._conn, self._lock, self._tenant = conn, lock, tenant
        self._mark = mark  # the store's change generation (.changes): another connection changed the keys
        self._on_shred = on_shred  # the store drops plaintext it has cached
        # read cache; every write through this table updates it, and a change by another
        # connection (the CLI shredding a patient while a server runs) empties it
        self._by_patient: dict[str, WrappedKey | None] = {}
        self._by_id: dict[str, WrappedKey] = {}
        self._version = -1

    def _one(self, where: str, value: str) -> WrappedKey | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT * FROM keys WHERE tenant = ? AND {where} = ?", (self._tenant, value)
            ).fetchone()
        return None if row is None else wrapped_key_from_row(row)

    def sync(self, version: int | None = None) -> None:
        """Empty the cache when another connection has changed a cached table since the last
        sync (``version``: the store's change generation if the caller has just read it)."""
        with self._lock:
            version = self._mark() if version is None else version
            if version != self._version:
                self._by_patient.clear()
                self._by_id.clear()
                self._version = version

    def get(self, patient_ref: str) -> WrappedKey | None:
        with self._lock:
            if patient_ref in self._by_patient:
                return self._by_patient[patient_ref]
            key = self._one("patient_ref", patient_ref)
            if key is not None and not self._conn.in_transaction:
                self._by_patient[patient_ref] = key
            return key

    def _forget(self, patient_ref: str) -> None:
        self._by_patient.pop(patient_ref, None)
        self._by_id.clear()  # refilled on demand; a put or shred is rare

    def get_by_id(self, key_id: str) -> WrappedKey | None:
        with self._lock:
            if key_id in self._by_id:
                return self._by_id[key_id]
            key = self._one("key_id", key_id)
            if key is not None and not self._conn.in_transaction:
                self._by_id[key_id] = key
            return key

    def _atomic(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Run statements in a transaction of their own, or inside the caller's open one.

        A data key created while a batch is being written (a new patient's first record) joins
        that batch's transaction: if the batch rolls back, the key goes with the ciphertexts
        that used it, so no stored token ever names a key that does not exist.
        """
        with self._lock:
            if self._conn.in_transaction:
                for sql, args in statements:
                    self._conn.execute(sql, args)
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    for sql, args in statements:
                        self._conn.execute(sql, args)
                    self._conn.execute("COMMIT")
                except BaseException:
                    if self._conn.in_transaction:  # SQLite may have rolled back itself (SQLITE_FULL)
                        self._conn.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:  # busy past the timeout, a full disk
                raise StoreError(f"the key table could not be written, nothing was written: {exc}") from exc

    def put(self, key: WrappedKey) -> None:
        """Store a patient's first key (or tombstone), or rewrap a stored one.

        A shredded key is never revived, and a patient keeps the first key stored: when two
        processes make a patient's first key at once the second put changes nothing (the
        caller reads the stored key back)."""
        self._forget(key.patient_ref)
        t = self._tenant
        row = (key.key_id, key.patient_ref, key.kek_id, key.wrapped, key.created_at, int(key.shredded), t)
        rewrap = (
            "UPDATE keys SET kek_id = ?, wrapped = ?"
            " WHERE tenant = ? AND key_id = ? AND patient_ref = ? AND shredded = 0",
            (key.kek_id, key.wrapped, t, key.key_id, key.patient_ref),
        )
        first = (insert_sql("keys") + " ON CONFLICT DO NOTHING", row)
        self._atomic([first] if key.shredded else [rewrap, first])

    def shred(self, patient_ref: str, tomb_ref: str | None = None) -> None:
        """Destroy the wrapped key and the pseudonym link of a patient in one transaction; with
        ``tomb_ref`` the key's row keeps that instead of the patient reference."""
        with self._lock:
            self._forget(patient_ref)
            if tomb_ref is not None:
                self._forget(tomb_ref)
            self._on_shred()
            t = self._tenant
            row = self._conn.execute(
                "SELECT key_id FROM keys WHERE tenant = ? AND patient_ref = ?", (t, patient_ref)
            ).fetchone()
            if row is None:
                return
            self._atomic(
                [
                    (
                        "UPDATE keys SET wrapped = x'', shredded = 1, patient_ref = ? WHERE tenant = ? AND key_id = ?",
                        (tomb_ref or patient_ref, t, row[0]),
                    ),
                    ("DELETE FROM pseudonyms WHERE tenant = ? AND key_id = ?", (t, row[0])),
                ]
            )

    def all(self) -> list[WrappedKey]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT * FROM keys WHERE tenant = ? ORDER BY created_at, key_id", (self._tenant,)
            ).fetchall()
        return [wrapped_key_from_row(r) for r in rows]

    def pseudonym(self, key_id: str) -> tuple[str, str] | None:
        """``(pseudonym, encrypted patient reference)`` of a key, or None."""
        with self._lock:
            row = self._conn.execute(
                "SELECT pseudonym, token FROM pseudonyms WHERE tenant = ? AND key_id = ?", (self._tenant, key_id)
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def pseudonyms(self) -> dict[str, tuple[str, str]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT key_id, pseudonym, token FROM pseudonyms WHERE tenant = ?", (self._tenant,)
            ).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def put_pseudonym(self, key_id: str, pseudonym: str, token: str) -> None:
        with self._lock:
            # the first pseudonym stored for a key stays (another process may have made one)
            self._conn.execute(
                insert_sql("pseudonyms") + " ON CONFLICT (tenant, key_id) DO NOTHING",
                (key_id, pseudonym, token, self._tenant),
            )
