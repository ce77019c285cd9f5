"""psycopg plumbing of the PostgreSQL store: connecting, and pgvector's binary wire format.

Vectors travel in pgvector's binary form (``int16 dim, int16 0, dim big-endian float4``) both
ways, so a stored vector comes back bit for bit as the native float32 bytes that the row
converters of ``_sql.py`` expect; no decimal text is ever parsed.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.pq import Format
from psycopg.types import TypeInfo

from ..._errors import StoreError

__all__ = ["Vec", "Vecs", "connect", "iterative_scan", "use_schema", "vector_schema"]


class Vec:
    """A float32 vector (native-endian bytes, as ``ndarray.tobytes()``) sent as a pgvector ``vector``."""

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob


def _binary(blob: bytes) -> bytes:
    """pgvector's binary form of one vector of native float32 bytes."""
    f = np.frombuffer(blob, dtype=np.float32)
    return struct.pack(">HH", f.size, 0) + f.astype(">f4").tobytes()


class _VecDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Vec) -> Buffer:
        return _binary(obj.blob)


class Vecs:
    """Float32 vectors (native-endian bytes each, all of one dimension) sent as a pgvector
    ``vector[]``: one parameter for many query vectors."""

    __slots__ = ("blobs",)

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs


class _VecsDumper(Dumper):
    """PostgreSQL's binary array (one dimension, no NULLs) of pgvector's binary vectors."""

    format = Format.BINARY
    element_oid = 0

    def dump(self, obj: Vecs) -> Buffer:
        if not obj.blobs:
            return struct.pack(">iiI", 0, 0, self.element_oid)  # an empty array has no dimension
        parts = [struct.pack(">iiIii", 1, 0, self.element_oid, len(obj.blobs), 1)]
        for blob in obj.blobs:
            element = _binary(blob)
            parts += [struct.pack(">i", len(element)), element]
        return b"".join(parts)


class _VecLoader(Loader):
    format = Format.BINARY

    def load(self, data: Buffer) -> bytes:
        (dim,) = struct.unpack_from(">H", data)
        return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32).tobytes()


def connect(dsn: str) -> psycopg.Connection[Any]:
    """An autocommit connection; :class:`StoreError` when the server cannot be reached."""
    try:
        return psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to the PostgreSQL server: {exc}") from exc


def vector_schema(conn: psycopg.Connection[Any]) -> str | None:
    """The schema holding the pgvector extension, or None when it is not installed."""
    row = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
    ).fetchone()
    return None if row is None else str(row[0])


def iterative_scan(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server's pgvector has iterative index scans (0.8 and later:
    ``hnsw.iterative_scan``, which keeps an HNSW scan going until a filter has let k rows through)."""
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    if row is None:
        return False
    version = tuple(int(part) for part in str(row[0]).split(".")[:2] if part.isdigit())
    return version >= (0, 8)


def use_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Point the session at ``schema`` (then pgvector's schema) and register the vector adapters.

    Vectors are then dumped from :class:`Vec` (arrays of them from :class:`Vecs`) and loaded,
    in binary results, as float32 bytes. On a Citus coordinator the session also passes its
    ``SET LOCAL`` settings (the HNSW search's) on to the workers that run its queries.
    """
    ext = vector_schema(conn)
    if ext is None:
        raise StoreError("the pgvector extension is not installed in this database")
    path = sql.SQL(", ").join(map(sql.Identifier, dict.fromkeys([schema, ext])))
    conn.execute(sql.SQL("SET search_path TO {}").format(path))
    if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone() is not None:
        conn.execute("SET citus.propagate_set_commands TO 'local'")
    info = TypeInfo.fetch(conn, "vector")
    if info is None:  # pragma: no cover - the extension was found just above
        raise StoreError("the pgvector type 'vector' is not visible")
    conn.adapters.register_dumper(Vec, type("VecDumper", (_VecDumper,), {"oid": info.oid}))
    vecs = {"oid": info.array_oid, "element_oid": info.oid}
    conn.adapters.register_dumper(Vecs, type("VecsDumper", (_VecsDumper,), vecs))
    conn.adapters.register_loader(info.oid, _VecLoader)
