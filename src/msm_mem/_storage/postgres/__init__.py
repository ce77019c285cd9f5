"""The server backend: PostgreSQL with pgvector (exact search; HNSW only when asked)."""

from __future__ import annotations

from .store import PostgresStore

__all__ = ["PostgresStore"]
