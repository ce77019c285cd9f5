"""The embedded backend: SQLite as the store of record, FAISS indexes as rebuildable caches."""

from __future__ import annotations

from .store import SqliteStore

__all__ = ["SqliteStore"]
