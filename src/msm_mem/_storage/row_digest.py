"""The keyed digest of every governed row: what binds the rows to the signed audit checkpoint.

AES-GCM authenticates each PHI field's content, but not the columns that govern a record: its
state, evidence tier, confidence, supersession, version, decay time, its id and patient. Each
governed table therefore keeps a multiset hash of its rows: ``count`` and ``sum`` mod 2**256 of
``HMAC-SHA256(key, row bytes)`` over every row, where the row bytes are :func:`row_bytes` (the
table name and every column but the vectors, each typed and length-prefixed). A write adds the
term of each new row and subtracts the term of each row it changes or removes, inside its
transaction, and stores the sums in ``meta`` (``rows:<table>``); the audit layer signs them in
the checkpoint of the same commit. Verification recomputes them from the rows: a row changed,
rolled back to an older version, deleted or added outside msm-mem changes its table's sum, and
nobody without the key can compute the term that would hide it (the sum is keyed because an
unkeyed additive hash can be forged, Wagner's generalised birthday attack).

Covered: every column of :data:`COLUMNS` (the PHI fields as their ciphertexts, so an older
ciphertext of the same field is caught too). Not covered: the vectors (``z``), the audit table
(the hash chain covers it), the key and pseudonym tables (written in their own transactions
before the commit that names them; full verification checks them against the events instead:
:mod:`msm_mem._governance.audit.links`).
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import StoreError

__all__ = ["COLUMNS", "DIGEST_TABLES", "RowDigest", "TableDigest", "digested", "empty", "row_bytes", "select_columns"]

_MOD = 1 << 256
_VERSION = b"msm-mem row v1\x00"


def _columns(spec: str) -> tuple[tuple[str, str], ...]:
    """``"pos:i id timestamp:r"`` -> ``(("pos", "i"), ("id", "t"), ("timestamp", "r"))``."""
    return tuple((name, kind or "t") for name, _, kind in (word.partition(":") for word in spec.split()))


#: every governed table's columns in schema order with their kind: ``t`` text (the default),
#: ``r`` real, ``i`` integer, ``z`` a vector (left out of the digest)
COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "episodic": _columns(
        "pos:i id patient_id study_id timestamp:r z:z question answer decision media_path media_description"
        " state confidence:r evidence_tier source created_at:r decay_at:r supersedes"
    ),
    "visual": _columns(
        "pos:i id patient_id timestamp:r z:z media_path visual_tag source_episode_id state confidence:r"
        " evidence_tier source created_at:r decay_at:r supersedes"
    ),
    "semantic": _columns("id patient_id category version:i state created_at:r supersedes evidence_tier impressions"),
    "stm": _columns("id patient_id kind payload z:z created_at:r expires_at:r state actor"),
    "claims": _columns(
        "id patient_id key content source confidence:r evidence_tier state supersedes created_at:r decay_at:r"
    ),
    "entities": _columns("id patient_id type name created_at:r state"),
    "relationships": _columns("id patient_id source_id target_id type created_at:r state"),
    "consents": _columns("id patient_id grantee purpose decision data_classes start:r end:r created_at:r revoked_at:r"),
}
#: the governed tables, in a fixed order
DIGEST_TABLES: tuple[str, ...] = tuple(COLUMNS)
#: positions of the digested columns in a full row of each table
_KEEP = {t: tuple(i for i, (_, kind) in enumerate(cols) if kind != "z") for t, cols in COLUMNS.items()}
_KINDS = {t: tuple(kind for _, kind in cols if kind != "z") for t, cols in COLUMNS.items()}


def select_columns(table: str) -> str:
    """The digested columns of ``table`` as a SELECT list (in :data:`COLUMNS` order)."""
    return ", ".join(f'"{name}"' for name, kind in COLUMNS[table] if kind != "z")


def _field(kind: str, value: Any) -> bytes:
    if value is None:
        return b"n"
    if kind == "t" and isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        return b"t" + struct.pack(">Q", len(data)) + data
    if kind == "r" and isinstance(value, int | float) and not isinstance(value, bool):
        return b"r" + struct.pack(">d", float(value))
    if kind == "i" and isinstance(value, int) and not isinstance(value, bool):
        return b"i" + struct.pack(">q", value)
    # a value of the wrong type was written around msm-mem: its bytes differ from any honest row
    data = repr(value).encode("utf-8", "backslashreplace")
    return b"x" + struct.pack(">Q", len(data)) + data


_LENGTH = struct.Struct(">Q").pack
_REAL = struct.Struct(">d").pack
_INTEGER = struct.Struct(">q").pack


def _text(value: Any) -> bytes:
    if value.__class__ is str:
        data = value.encode("utf-8", "surrogatepass")
        return b"t" + _LENGTH(len(data)) + data
    return _field("t", value)


def _real(value: Any) -> bytes:
    if value.__class__ is float:
        return b"r" + _REAL(value)
    return _field("r", value)


def _integer(value: Any) -> bytes:
    if value.__class__ is int:
        return b"i" + _INTEGER(value)
    return _field("i", value)


# :func:`_field` of one kind, with the common exact types first: the same bytes, fewer checks
_BY_KIND = {"t": _text, "r": _real, "i": _integer}
_ENCODERS = {t: tuple(_BY_KIND[kind] for kind in kinds) for t, kinds in _KINDS.items()}
_PREFIX = {t: _VERSION + _field("t", t) for t in COLUMNS}


def row_bytes(table: str, row: Sequence[Any]) -> bytes:
    """The canonical bytes of one row's digested columns (``row`` in :func:`select_columns` order)."""
    encoders = _ENCODERS[table]
    if len(row) != len(encoders):
        raise StoreError(f"a {table} row has {len(row)} digested columns, expected {len(encoders)}")
    return _PREFIX[table] + b"".join([encode(v) for encode, v in zip(encoders, row, strict=True)])


def digested(table: str, full_row: Sequence[Any]) -> tuple[Any, ...]:
    """The digested columns of a full row as inserted (every column in schema order)."""
    return tuple(full_row[i] for i in _KEEP[table])


@dataclass(frozen=True, slots=True)
class TableDigest:
    """One table's multiset hash: ``count`` rows whose terms sum to ``digest`` (64 hex digits)."""

    table: str
    count: int
    digest: str

    def meta_value(self) -> str:
        return f"{self.count} {self.digest}"

    @classmethod
    def from_meta(cls, table: str, value: str) -> TableDigest:
        try:
            count, digest = value.split(" ")
            return cls(table, int(count), f"{int(digest, 16):064x}")
        except ValueError:
            raise StoreError(f"meta rows:{table} is damaged ({value!r})") from None


def empty() -> dict[str, TableDigest]:
    """The digests of a store without rows."""
    return {t: TableDigest(t, 0, "0" * 64) for t in DIGEST_TABLES}


class RowDigest:
    """The running sums of one write (or a full recomputation), per table, under ``key``."""

    def __init__(self, key: bytes, start: Mapping[str, TableDigest] | None = None) -> None:
        self._key = key
        base = start if start is not None else empty()
        self._count = {t: base[t].count for t in DIGEST_TABLES}
        self._sum = {t: int(base[t].digest, 16) for t in DIGEST_TABLES}
        self.changed: set[str] = set()

    def _terms(self, table: str, rows: Iterable[Sequence[Any]]) -> tuple[int, int]:
        """The sum of the rows' terms (not reduced) and their count."""
        total, count, key = 0, 0, self._key
        for row in rows:
            total += int.from_bytes(hmac.digest(key, row_bytes(table, row), hashlib.sha256), "big")
            count += 1
        return total, count

    def add(self, table: str, rows: Iterable[Sequence[Any]]) -> None:
        """Count rows now stored (each in :func:`select_columns` order)."""
        total, count = self._terms(table, rows)
        if count:
            self._sum[table] = (self._sum[table] + total) % _MOD
            self._count[table] += count
            self.changed.add(table)

    def add_full(self, table: str, full_rows: Iterable[Sequence[Any]]) -> None:
        """:meth:`add` for rows as inserted (every column, vectors too)."""
        self.add(table, (digested(table, r) for r in full_rows))

    def remove(self, table: str, rows: Iterable[Sequence[Any]]) -> None:
        """Uncount rows about to change or go (each as read, in :func:`select_columns` order)."""
        total, count = self._terms(table, rows)
        if count:
            self._sum[table] = (self._sum[table] - total) % _MOD
            self._count[table] -= count
            self.changed.add(table)

    def result(self) -> dict[str, TableDigest]:
        return {t: TableDigest(t, self._count[t], f"{self._sum[t]:064x}") for t in DIGEST_TABLES}
