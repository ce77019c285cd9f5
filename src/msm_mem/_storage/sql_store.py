"""The SQL store, written once: what SQLite and PostgreSQL share, composed.

A backend subclasses :class:`SqlStore` and adds only what differs: its connection and
transactions, its schema (column types), its vector search (FAISS caches beside SQLite,
pgvector in PostgreSQL), its key table and its read caches.
"""

from __future__ import annotations

from .sql_records import SqlRecords
from .sql_tiers import SqlTiers
from .sql_write import SqlWriter

__all__ = ["SqlStore"]


class SqlStore(SqlWriter, SqlRecords, SqlTiers):
    """Records, governed tiers, audit rows and the write path of a SQL store of record."""
