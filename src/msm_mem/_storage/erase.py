"""Erasure inside a write transaction: every row of one patient destroyed, written once for both
SQL stores (:class:`~msm_mem._storage.batch.Erasure`).

The rows of the tables without vectors are deleted. An episodic or visual row keeps its place
in the vector order (the indexes and the export are positional) as an *empty row*: its random
id (the one the audit trail names), no patient, no study, time 0, every PHI field the
ciphertext of an empty text under the anonymised pool's key, no source, supersession or
decay time, a zero vector, state ``retracted``. Nothing of the patient is left in it, and no
search, read or export shows it (:func:`is_erased`).

The row digests follow every row removed and written; the backend's vector part is told which
vector tables changed (:meth:`EraseVectors.vectors_erased`), inside the transaction, so the
running digest of the stored vectors is recomputed with it. A patient who still has a row in
any erased table afterwards (a write landed between the caller's read and this transaction)
fails the whole batch: nothing is erased and the caller tries again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from .._errors import IllegalTransition, StoreError
from .._records import EpisodicRecord, State, VisualRecord
from . import rows as r
from .base import VectorKind
from .batch import ERASED_TABLES, Erasure
from .row_digest import RowDigest
from .sql_core import ID_CHUNK, SqlTables, insert_sql
from .sql_rows import SqlRowDigests

__all__ = ["EraseVectors", "erase_patient", "is_erased"]

_VECTOR_TABLES: tuple[VectorKind, VectorKind] = ("episodic", "visual")


class EraseVectors(Protocol):
    """What erasure asks of a store's vector part."""

    def vector_rows(self, kind: VectorKind, rows: list[tuple[Any, ...]]) -> Sequence[Sequence[Any]]:
        """Rows as the driver takes them (the ``z`` blob as the backend stores vectors)."""
        ...

    def vectors_erased(self, kind: VectorKind) -> None:
        """Inside the transaction, after vectors of ``kind`` were replaced by zero vectors."""
        ...


def is_erased(record: EpisodicRecord | VisualRecord) -> bool:
    """Whether a record read back is the empty row an erasure left (retracted, no patient, a
    zero vector): nothing to show, search or export."""
    return record.state == State.RETRACTED and not record.patient_id and not bool(np.any(record.z))


def _empty_row(kind: VectorKind, record_id: str, pos: int, dim: int, tables: SqlTables) -> tuple[Any, ...]:
    z = np.zeros(dim, dtype=np.float32)
    if kind == "episodic":
        e = EpisodicRecord(record_id, "", 0.0, z, "", "", state=State.RETRACTED, confidence=0.0, evidence_tier="")
        return r.episode_to_row(e, pos, tables.codec)
    v = VisualRecord(record_id, "", 0.0, z, state=State.RETRACTED, confidence=0.0, evidence_tier="")
    return r.visual_to_row(v, pos, tables.codec)


def _marks(n: int) -> str:
    return ",".join("?" * n)


def erase_patient(
    e: Erasure, tables: SqlTables, digests: SqlRowDigests, vectors: EraseVectors, d: RowDigest, dim: int
) -> None:
    """Destroy the rows ``e`` names (inside the caller's transaction; see the module)."""
    sql, tenant = tables.dialect, tables.tenant
    named = dict(e.rows)
    if set(named) - set(ERASED_TABLES) or not e.patient_id or "*" in e.patient_id:
        raise IllegalTransition(f"an erasure names one patient and the tables {ERASED_TABLES} only")
    for table in ERASED_TABLES:
        ids = list(dict.fromkeys(named.get(table, ())))
        if not ids:
            continue
        found: dict[str, tuple[str, int | None]] = {}
        vector = table in _VECTOR_TABLES
        for start in range(0, len(ids), ID_CHUNK):
            part = ids[start : start + ID_CHUNK]
            cols = "id, patient_id, pos" if vector else "id, patient_id, NULL"
            rows = sql.q(
                f"SELECT {cols} FROM {table} WHERE tenant = ? AND id IN ({_marks(len(part))})", (tenant, *part)
            )
            found.update((str(row[0]), (str(row[1]), None if row[2] is None else int(row[2]))) for row in rows)
        for rid in ids:
            if rid not in found or found[rid][0] != e.patient_id:
                raise IllegalTransition(f"{table} record {rid!r} is not a stored record of the patient erased")
        done = digests.track(d, table, ids, ids if vector else [])
        for start in range(0, len(ids), ID_CHUNK):
            part = ids[start : start + ID_CHUNK]
            sql.q(f"DELETE FROM {table} WHERE tenant = ? AND id IN ({_marks(len(part))})", (tenant, *part))
        if vector:
            kind: VectorKind = "episodic" if table == "episodic" else "visual"
            empty = [_empty_row(kind, rid, int(found[rid][1] or 0), dim, tables) for rid in ids]
            sql.many(insert_sql(table), [(*row, tenant) for row in vectors.vector_rows(kind, empty)])
            vectors.vectors_erased(kind)
        done()
    for table in ERASED_TABLES:
        left = sql.q(f"SELECT count(*) FROM {table} WHERE tenant = ? AND patient_id = ?", (tenant, e.patient_id))
        if int(left.fetchone()[0]):
            raise StoreError(f"the patient gained {table} rows while being erased: nothing was erased; shred again")
